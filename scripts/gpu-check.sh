#!/usr/bin/env bash
# gpu-check.sh - the CUDA backend's check on a GPU machine, self-contained (no
# network). Run from the repository root. Stages (each logged under
# $OUT/logs/, one summary line each in $OUT/summary.txt, printed last):
#   toolchain  nvcc / cmake / nvidia-smi present; nvidia-smi -L
#   build      cmake -DMINFER_CUDA=ON -DMINFER_CUDA_ARCHS=90: test_cuda_ops,
#              minfer, dump_logits
#   ops        tests/cuda/test_cuda_ops (every kernel family vs float64)
#   ops-suite  tests/ops on cuda (the backend-independent op suite), and the
#              GPU case count of both suites
#   ops-nopdl  the decode families again with MINFER_CUDA_TUNE=pdl=0 (plain
#              launches; programmatic dependent launch is the default)
#   memcheck   compute-sanitizer memcheck on the op tests, small shapes
#   racecheck  compute-sanitizer racecheck on the families whose kernels share
#              memory across a block (RACE_ONLY overrides the list, RACE_LIMIT
#              the seconds, default 60), small shapes
#   e2e        minfer synth small qwen2/qwen3/llama models; dump_logits on
#              CUDA (14-token and 96-token prompts + 4 decodes) vs the python
#              float64 reference (tests/ref) when python3 + numpy + gguf exist
#              (else skipped with a note; the device image lacks gguf: carry
#              the wheel and pip install --target); greedy tokens identical
#              with fusions, CUDA graphs, PDL, flash decode off, v1/v3 GEMVs
#              (tuning strings, MINFER_CUDA_TUNE)
#   bench      minfer bench --device cuda (pp512 / tg128) on synthetic models
#   batched    (opt-in) ATTN_PAGED op cases on cuda, minfer_multi end to end,
#              minfer bench -npp/-ntg/-npl on 7B / 0.5B -> $OUT/batched.md
#   perf       (GPU_CHECK_PERF=1) qwen2-0.5B and qwen2-7B shapes, the defaults
#              against each lever row of PERF_LEVERS (as TABLE_LEVERS), and a per-op profile
#              (MINFER_OP_PROFILE=1) of one decode and one prefill bench
# What comes back: $OUT/summary.txt, $OUT/bench.md, $OUT/bench.json and
# $OUT/gpu-logs.tgz (every log; the device tool returns at most 8 files).
# GPU_CHECK_STAGES="build ops ..." runs a subset (build is always needed;
# GPU_CHECK_PREBUILT=<dir> takes minfer and the test programs from dir instead).
# GPU_CHECK_STAGES=final: the final check in one device call of <= 560 s on
# 16 cores (with BASE_TGZ): build ops ops-suite memcheck racecheck batched (the
# 0.5B only) table, each with a time limit (OPS_TIMEOUT 100, SUITE_TIMEOUT 90,
# RACE_LIMIT 45, MEMCHECK_LIMIT 30 on
# graph,gemv,attnshort; TABLE_R 10, TABLE_DEPTH_R 1; everything stops by
# FINAL_BUDGET = 530 s). docs/GPU-TESTS.md has the exact command.
# GPU_CHECK_END=<epoch seconds>: stages and benches not started by then are
# skipped (noted), so a run under a hard time limit still returns its logs.
# GPU_CHECK_MEMCHECK_ONLY=matmul,graph: memcheck on these op families only;
# OPS_TIMEOUT: seconds for the ops stage (300). OPS_ONLY / PDL_ONLY / RACE_ONLY: the same for those stages.
# Kernel timing loops are not in the test suite: lab/cuda/README.md.
# GPU_CHECK_STAGES=table: the issue's table on full-size models (synth --fast),
# TABLE_MODELS="tag:preset:type[:synth,flags] ...", TABLE_LEVERS="VAR=1 A=1;B=0 ..." (a row each;
# semicolons join variables set together, so MINFER_CUDA_TUNE=a=1,b=2 is one),
# TABLE_R (repetitions, default 20), TABLE_DEPTH=0 skips the 7B depth-4096 row,
# TABLE_BASE=<another minfer> adds a row per model run by that binary (an older
# commit's build: before / after on one machine in one run); with
# TABLE_BASE_DUMP=<its dump_logits> each model's greedy tokens (16 decoded)
# must be identical between the two builds.
# BASE_TGZ=<a git archive of another commit>: that tree is built beside this
# one (minfer + dump_logits, build-base/, in parallel with the build stage)
# and becomes TABLE_BASE / TABLE_BASE_DUMP.
# GPU_CHECK_7B_LAYERS=N: the perf stage's 7B model with N layers (same shapes,
# default 8).
# Levers checked here (ops: through test hooks; e2e: against the float64
# reference and the greedy tokens; table/perf: rows with and without); which
# are on by default and why: docs/ENV.md.
# Budget: < 8 minutes on one H200.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/gpu-out}
LOG=$OUT/logs
mkdir -p "$LOG"
BUILD=${BUILD:-$ROOT/build-gpu}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 8)}
STAGES=${GPU_CHECK_STAGES:-"build ops ops-suite ops-nopdl memcheck racecheck e2e bench"}
[ "${GPU_CHECK_PERF:-0}" = 1 ] && STAGES="$STAGES perf"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
: >"$OUT/bench.md"
T0=$(date +%s)
if [ "$STAGES" = final ]; then
    # The final check in one device call of at most ~560 s on 16 cores: this
    # tree and BASE_TGZ built in parallel, the op tests (tests/cuda and
    # tests/ops on cuda), memcheck on a small subset, then the "No speed
    # lost" table with the base build's rows and the greedy-token comparison
    # on the six synth --fast models. Each stage has its own time limit and
    # GPU_CHECK_END stops what has not started, so the logs always come back.
    STAGES="build ops ops-suite memcheck racecheck batched table"
    BATCHED_MODELS=${BATCHED_MODELS:-"q05:qwen2-0.5b:q4_0:128:1,4,16,64,256"}
    RACE_LIMIT=${RACE_LIMIT:-45}
    GPU_CHECK_END=${GPU_CHECK_END:-$((T0 + ${FINAL_BUDGET:-530}))}
    OPS_TIMEOUT=${OPS_TIMEOUT:-100}
    SUITE_TIMEOUT=${SUITE_TIMEOUT:-90}
    MEMCHECK_LIMIT=${MEMCHECK_LIMIT:-30}
    GPU_CHECK_MEMCHECK_ONLY=${GPU_CHECK_MEMCHECK_ONLY:-graph,gemv,attnshort}
    TABLE_R=${TABLE_R:-10}
    TABLE_DEPTH_R=${TABLE_DEPTH_R:-1}
fi

note() { printf '%-10s %-6s %s\n' "$1" "$2" "$3" >>"$SUMMARY"; }
elapsed() { echo "$(( $(date +%s) - T0 ))s"; }
left() { [ -z "${GPU_CHECK_END:-}" ] || [ "$(date +%s)" -lt "$GPU_CHECK_END" ]; }
# tmo N: N seconds, or fewer so that a command started now ends by
# GPU_CHECK_END + 10 (at least 5): no single bench runs the call past its limit
tmo() {
    local n=$1 r
    [ -z "${GPU_CHECK_END:-}" ] && { echo "$n"; return; }
    r=$(( GPU_CHECK_END + 10 - $(date +%s) ))
    [ "$r" -lt 5 ] && r=5
    [ "$r" -lt "$n" ] && n=$r
    echo "$n"
}
want() {
    case " $STAGES " in *" $1 "*) ;; *) return 1;; esac
    left && return 0
    note "$1" SKIP "out of time (GPU_CHECK_END)"; return 1
}
finish() {
    note total done "$(elapsed)"
    tar czf "$OUT/gpu-logs.tgz" -C "$OUT" logs 2>/dev/null && rm -rf "$LOG"
    echo "==== summary"
    cat "$SUMMARY"
    grep -q "FAIL" "$SUMMARY" && exit 1
    exit 0
}

# ---- toolchain -------------------------------------------------------------------
export PATH=/usr/local/cuda/bin:$PATH
{
    echo "== ls /usr/local/cuda/bin"; ls /usr/local/cuda/bin 2>&1
    echo "== nvcc"; nvcc --version 2>&1
    echo "== cmake"; cmake --version 2>&1
    echo "== nvidia-smi"; nvidia-smi 2>&1
} >"$LOG/toolchain.log" 2>&1
nvidia-smi -L >"$LOG/nvidia-smi-L.txt" 2>&1
if ! command -v nvcc >/dev/null || ! command -v cmake >/dev/null; then
    note toolchain FAIL "nvcc or cmake missing (see toolchain.log)"
    finish
fi
note toolchain ok "$(head -1 "$LOG/nvidia-smi-L.txt")"

# ---- build -----------------------------------------------------------------------------
BASE_PID=
if [ -n "${BASE_TGZ:-}" ]; then # the base tree, built while this one builds
    (
        rm -rf "$ROOT/build-base-src" && mkdir -p "$ROOT/build-base-src" &&
            tar xzf "$BASE_TGZ" -C "$ROOT/build-base-src" &&
            cmake -B "$ROOT/build-base" -S "$ROOT/build-base-src" -DCMAKE_BUILD_TYPE=Release -DMINFER_CUDA=ON \
                -DMINFER_CUDA_ARCHS=90 -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" &&
            cmake --build "$ROOT/build-base" -j"$JOBS" --target minfer dump_logits
    ) >"$LOG/build-base.log" 2>&1 &
    BASE_PID=$!
fi
PREBUILT=0
if [ -n "${GPU_CHECK_PREBUILT:-}" ] && "$GPU_CHECK_PREBUILT/minfer" --version >/dev/null 2>&1; then
    # GPU_CHECK_PREBUILT=<dir>: minfer and the test programs built elsewhere
    # (sm_90, the same nvcc), found by name under dir: no build here
    BUILD=$GPU_CHECK_PREBUILT PREBUILT=1 HAVE_MINFER=1
    : >"$LOG/build.log"
    note build ok "prebuilt: $BUILD"
elif cmake -B "$BUILD" -S "$ROOT" -DCMAKE_BUILD_TYPE=Release -DMINFER_CUDA=ON -DMINFER_CUDA_ARCHS=90 \
        -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" >"$LOG/build.log" 2>&1 &&
   cmake --build "$BUILD" -j"$JOBS" --target test_cuda_ops test_ops test_ops_paged >>"$LOG/build.log" 2>&1; then
    note build ok "test_cuda_ops + test_ops built ($(elapsed))"
else
    note build FAIL "see build.log"
    tail -30 "$LOG/build.log"
    finish
fi
# minfer and dump_logits are other engineers' targets: their failure does not
# stop the kernel checks
[ $PREBUILT -eq 1 ] || HAVE_MINFER=0
if [ $PREBUILT -eq 1 ]; then :
elif cmake --build "$BUILD" -j"$JOBS" --target minfer dump_logits >>"$LOG/build.log" 2>&1; then
    HAVE_MINFER=1
    note build ok "minfer + dump_logits built ($(elapsed))"
else
    note build WARN "minfer/dump_logits did not build (see build.log); e2e and bench skipped"
fi
grep -i "warning" "$LOG/build.log" >"$LOG/build-warnings.txt" || true
[ -s "$LOG/build-warnings.txt" ] && note build WARN "$(wc -l <"$LOG/build-warnings.txt") warning lines (build-warnings.txt)"

if [ -n "$BASE_PID" ]; then
    if wait "$BASE_PID"; then
        TABLE_BASE=${TABLE_BASE:-$ROOT/build-base/minfer}
        TABLE_BASE_DUMP=${TABLE_BASE_DUMP:-$(find "$ROOT/build-base" -name dump_logits -type f -perm -u+x | head -1)}
        note build ok "base tree built ($(elapsed))"
    else note build FAIL "base tree did not build (build-base.log)"; fi
fi
OPS=$BUILD/tests/cuda/test_cuda_ops
SUITE=$BUILD/tests/test_ops
[ -x "$SUITE" ] || SUITE=$(find "$BUILD" -name test_ops -type f -perm -u+x | head -1)
MINFER=$BUILD/minfer
DUMP=$BUILD/tests/dump_logits
[ -x "$DUMP" ] || DUMP=$(find "$BUILD" -name dump_logits -type f -perm -u+x | head -1)

# ---- op tests ------------------------------------------------------------------------------
if want ops; then
    t=$(date +%s)
    env ${OPS_ONLY:+MINFER_CUDA_TEST_ONLY=$OPS_ONLY} timeout "$(tmo "${OPS_TIMEOUT:-300}")" "$OPS" >"$LOG/ops.log" 2>&1
    rc=$?
    last=$(grep -E "passed, .* failed" "$LOG/ops.log" | tail -1)
    if [ $rc -eq 0 ]; then note ops PASS "$last ($(( $(date +%s) - t ))s)";
    elif [ $rc -eq 77 ]; then note ops SKIP "$(head -1 "$LOG/ops.log")";
    elif [ $rc -eq 124 ] && ! grep -q " FAIL" "$LOG/ops.log"; then # the time limit, not a failure
        note ops PARTIAL "time limit after $(( $(date +%s) - t ))s: $(grep -c " PASS" "$LOG/ops.log") passed, 0 failed so far"
    else note ops FAIL "rc $rc: $last"; grep FAIL "$LOG/ops.log" | cut -c1-140 | head -60 >>"$SUMMARY"; fi
fi
if want ops-suite; then # the backend-independent op suite (tests/ops) on cuda, with its sweep
    # SUITE_SHARDS processes share the GPU (--shard K/N), all under one time limit;
    # SUITE_SWEEP= (empty) runs the table without its sweep
    t=$(date +%s); n=${SUITE_SHARDS:-4}; pids=()
    for ((k = 0; k < n; k++)); do
        timeout "$(tmo "${SUITE_TIMEOUT:-300}")" "$SUITE" cuda ${SUITE_SWEEP---sweep} --shard "$k/$n" >"$LOG/ops-suite-$k.log" 2>&1 &
        pids+=($!)
    done
    rc=0; pass=0; fail=0
    for ((k = 0; k < n; k++)); do
        wait "${pids[$k]}"; r=$?
        [ $r -ne 0 ] && [ $rc -eq 0 ] && rc=$r
        l=$(grep -E "passed, .* failed" "$LOG/ops-suite-$k.log" | tail -1)
        pass=$(( pass + $(grep -oE "[0-9]+ passed" <<<"$l" | grep -oE "[0-9]+" || echo 0) ))
        fail=$(( fail + $(grep -oE "[0-9]+ failed" <<<"$l" | grep -oE "[0-9]+" || echo 0) ))
    done
    cat "$LOG"/ops-suite-*.log >"$LOG/ops-suite.log"
    last="$pass passed, $fail failed in $n shards"
    if [ $rc -eq 0 ]; then note ops-suite PASS "$last ($(( $(date +%s) - t ))s)";
    elif [ $rc -eq 77 ]; then note ops-suite SKIP "$(head -1 "$LOG/ops-suite-0.log")";
    elif [ $rc -eq 124 ] && [ $fail -eq 0 ]; then note ops-suite PARTIAL "time limit: $last so far";
    else note ops-suite FAIL "rc $rc: $last"; grep FAIL "$LOG/ops-suite.log" | cut -c1-140 | head -30 >>"$SUMMARY"; fi
    # ATTN_PAGED's cases (tests/ops/op_paged.c) on cuda
    PSUITE=$(find "$BUILD" -name test_ops_paged -type f -perm -u+x | head -1)
    c=0
    if [ -n "$PSUITE" ]; then
        timeout "$(tmo 60)" "$PSUITE" cuda >"$LOG/ops-paged.log" 2>&1; r=$?
        l=$(grep -E "passed" "$LOG/ops-paged.log" | tail -1)
        [ $r -eq 0 ] && { note ops-paged PASS "$l"; c=$(grep -oE "[0-9]+ passed" <<<"$l" | grep -oE "[0-9]+" | head -1); } ||
            { note ops-paged FAIL "rc $r: $l"; grep FAIL "$LOG/ops-paged.log" | head -20 >>"$SUMMARY"; }
    fi
    # the GPU case count across the suites (the issue's >= 10,456; tests/cuda
    # prints one PASS line a check, so a run cut by its time limit counts too)
    a=$(grep -c " PASS" "$LOG/ops.log" 2>/dev/null)
    note ops-count info "GPU op cases passed: tests/cuda ${a:-0} + tests/ops on cuda $pass + paged ${c:-0} = $(( ${a:-0} + pass + ${c:-0} ))"
fi
if want ops-nopdl; then # the decode-path families again with plain launches (PDL is the default)
    t=$(date +%s)
    MINFER_CUDA_TUNE=pdl=0 MINFER_CUDA_TEST_ONLY=${PDL_ONLY:-matmul,getrows,norm,rope,elementwise,attn,qkv,ffn,fuse_add,fuse_norm,graph,decattn,gemv,attnone,q6k,normmm,qkvmix,ffnq8b,shortrope,zc} \
        timeout 300 "$OPS" >"$LOG/ops-nopdl.log" 2>&1
    rc=$?
    last=$(grep -E "passed, .* failed" "$LOG/ops-nopdl.log" | tail -1)
    if [ $rc -eq 0 ]; then note ops-nopdl PASS "$last ($(( $(date +%s) - t ))s)";
    elif [ $rc -eq 77 ]; then note ops-nopdl SKIP "$(head -1 "$LOG/ops-nopdl.log")";
    else note ops-nopdl FAIL "rc $rc: $last"; grep FAIL "$LOG/ops-nopdl.log" | head -20 >>"$SUMMARY"; fi
fi
# ---- compute-sanitizer -------------------------------------------------------------------------
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
sanitize() { # tool log-name time-limit env-assignments...
    local tool=$1 name=$2 lim=$3; shift 3
    if [ -z "${CS:-}" ]; then note "$name" SKIP "compute-sanitizer not found"; return; fi
    local t; t=$(date +%s)
    env MINFER_CUDA_TEST_SMALL=1 MINFER_GPU_TIMEOUT_MS=120000 "$@" timeout "$(tmo "$lim")" \
        "$CS" --tool "$tool" --error-exitcode 3 "$OPS" >"$LOG/$name.log" 2>&1
    local rc=$?
    local errs; errs=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$LOG/$name.log" | tail -1)
    local res; res=$(grep -E "passed, .* failed" "$LOG/$name.log" | tail -1)
    if [ $rc -eq 0 ]; then note "$name" PASS "${errs:-no summary line}; $res ($(( $(date +%s) - t ))s)";
    else note "$name" FAIL "rc $rc ${errs}; $res"; fi
}
want memcheck && sanitize memcheck memcheck "${MEMCHECK_LIMIT:-200}" ${GPU_CHECK_MEMCHECK_ONLY:+MINFER_CUDA_TEST_ONLY=$GPU_CHECK_MEMCHECK_ONLY}
# shortrope is left out of racecheck: its kernel syncs 4 warps on a named barrier
# (bar.sync 1, 128), which racecheck mistakes for a block-wide one and then reports
# the pairs around later __syncthreads (lab/cuda/racecheck-named-barrier.cu shows it on a
# kernel that is correct by construction); memcheck and the bitwise tests cover it
# The list: the families whose kernels exchange data through shared memory
# between warps (block reductions, staged tiles, the short attention's merge,
# the block-local FFN GEMV's unit), at small shapes, so the stage stays
# near a minute; the element-wise and copy kernels share nothing.
want racecheck && sanitize racecheck racecheck "${RACE_LIMIT:-60}" MINFER_CUDA_TEST_ONLY=${RACE_ONLY:-norm,gemv,mma,preattn,decattn,attnone,attnshort,ffnq8b}

# ---- end to end ------------------------------------------------------------------------------
PY=$(command -v python3 || true)
TOKS=1,15,263,42,7,300,99,1024,5,77,123,8,256,31
HAVE_PY=0
if [ -n "$PY" ] && "$PY" -c "import numpy, gguf" >/dev/null 2>&1; then HAVE_PY=1; fi
MODELS=$BUILD/gpu-models; mkdir -p "$MODELS"
if want e2e && [ $HAVE_MINFER -eq 1 ] && [ -n "$DUMP" ]; then
    TOKS=1,15,263,42,7,300,99,1024,5,77,123,8,256,31
    for spec in "qwen2 --preset qwen2-0.5b --layers 2 --vocab 4096 --ctx 512 --type q8_0" \
                "qwen3 --preset qwen3-0.6b --layers 2 --vocab 4096 --ctx 512 --type q4_K" \
                "llama --preset smollm2-135m --layers 2 --vocab 4096 --ctx 512 --type q4_0"; do
        arch=${spec%% *}; args=${spec#* }
        m=$MODELS/$arch.gguf
        if ! timeout 120 "$MINFER" synth $args -o "$m" >"$LOG/synth-$arch.log" 2>&1; then
            note e2e FAIL "$arch: minfer synth failed (synth-$arch.log)"; continue
        fi
        for cache in f32 f16 q8_0 f32-noq8 f32-fuse f16-long; do
            E2E_NO_Q8=; [ $cache = f32-noq8 ] && { E2E_NO_Q8=1; cache=f32; }
            E2E_FUSE=; [ $cache = f32-fuse ] && { E2E_FUSE=1; cache=f32; }  # every default-off fusion
            # a 96-token prompt: the prefill goes through the mma GEMM tier (nt >= 64)
            E2E_LONG=; [ $cache = f16-long ] && { E2E_LONG=1; cache=f16; }
            toks=$TOKS; [ -n "$E2E_LONG" ] && toks=$(seq -s, 3 41 3899 | cut -d, -f1-96)
            tag=$cache${E2E_NO_Q8:+-noq8}${E2E_FUSE:+-fuse}${E2E_LONG:+-long}; j=$LOG/e2e-$arch-$tag.json
            if ! env ${E2E_NO_Q8:+MINFER_CUDA_TUNE=gemv_q8=0} ${E2E_FUSE:+MINFER_CUDA_TUNE=fuse_gemv=1} MINFER_LOG=info timeout 120 "$DUMP" "$m" --tokens $toks --decode 4 --device cuda \
                    --cache $cache >"$j" 2>"$LOG/e2e-$arch-$tag.err"; then
                note e2e FAIL "$arch $tag: dump_logits --device cuda failed: $(tail -1 "$LOG/e2e-$arch-$tag.err")"
                continue
            fi
            grep -q '"backend": *"[^"]*cuda' "$j" || note e2e WARN "$arch $tag: the JSON does not name cuda as the backend"
            if [ $HAVE_PY -eq 1 ]; then
                # decode rows go through the int8-activation GEMV (rounding
                # ~3e-3 per matmul, like the CPU's Q8 activations): 3e-2;
                # the f32-activation tier (tune gemv_q8=0) keeps 2e-3 / 5e-3
                tol=3e-2
                [ -n "${E2E_NO_Q8:-}" ] && { tol=2e-3; [ $cache = f16 ] && tol=5e-3; [ $cache = q8_0 ] && tol=3e-2; }
                if "$PY" - "$m" "$j" "$tol" >"$LOG/e2e-$arch-$tag.cmp" 2>&1 <<'EOF'
import json, sys
import numpy as np
sys.path.insert(0, "tests/ref")
import ref_forward as rf
model, js, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
d = json.load(open(js))
toks = d["tokens"]
got = np.array(d["logits"], dtype=np.float64)
ref = rf.logits(rf.load(model), toks)[: got.shape[0]]
rel = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
same = int((got.argmax(1) == ref.argmax(1)).sum())
print(f"rows {got.shape[0]} max rel {rel.max():.3e} mean rel {rel.mean():.3e} argmax agree {same}/{got.shape[0]} tol {tol}")
sys.exit(0 if rel.max() <= tol and not np.isnan(got).any() else 1)
EOF
                then note e2e PASS "$arch $tag: $(tail -1 "$LOG/e2e-$arch-$tag.cmp")"
                else note e2e FAIL "$arch $tag: $(tail -1 "$LOG/e2e-$arch-$tag.cmp")"; fi
            else
                note e2e SKIP "$arch $tag: ran on CUDA, no python3+numpy+gguf here for the float64 reference"
            fi
        done
        # greedy tokens must not depend on the fusions or the CUDA graph
        tok() { grep -o '"tokens": *\[[^]]*\]' "$1" | head -1; }
        timeout 120 "$DUMP" "$m" --tokens $TOKS --decode 8 --device cuda --cache f32 \
            >"$LOG/e2e-$arch-base8.json" 2>"$LOG/e2e-$arch-base8.err"
        k=0
        for lever in "MINFER_NO_FUSE_QKV=1 MINFER_NO_FUSE_FFN=1" "MINFER_NO_CUDA_GRAPH=1" "MINFER_CUDA_NO_FUSE=1" \
            "MINFER_CUDA_TUNE=pdl=0,gemv=v1" "MINFER_CUDA_TUNE=gemv=v3" "MINFER_CUDA_TUNE=v4=0" \
            "MINFER_CUDA_TUNE=attn_decode=split,v4_q6k=0,norm_mm=0" "MINFER_CUDA_TUNE=fuse_rope=0,fuse_norm=0,attn_prefill=simt" \
            "MINFER_CUDA_TUNE=attn_decode=block" "MINFER_CUDA_TUNE=attn_decode=one" "MINFER_CUDA_TUNE=short_rope=0" \
            "MINFER_CUDA_TUNE=qkv_mix=0,ffn_q8b=0" "MINFER_CUDA_TUNE=zc=0" "MINFER_CUDA_TUNE=attn_pf=0,v4_pf=1" \
            "MINFER_CUDA_TUNE=v4_pf=2" "MINFER_CUDA_TUNE=slots=0,v4_q6k=1" ${E2E_LEVER:+"$E2E_LEVER"}; do
            k=$((k + 1)); j=$LOG/e2e-$arch-lever$k.json
            env $lever timeout 120 "$DUMP" "$m" --tokens $TOKS --decode 8 --device cuda --cache f32 \
                >"$j" 2>"$LOG/e2e-$arch-lever$k.err"
            if [ -n "$(tok "$j")" ] && [ "$(tok "$j")" = "$(tok "$LOG/e2e-$arch-base8.json")" ]; then
                note e2e PASS "$arch: greedy tokens (14 + 8 decoded) identical with $lever"
            else note e2e FAIL "$arch: greedy tokens differ with $lever ($(tail -1 "$LOG/e2e-$arch-lever$k.err"))"; fi
        done
    done
elif want e2e; then
    note e2e SKIP "minfer/dump_logits not built"
fi

# Exports "A=1;B=0" (a lever row: semicolons join variables set together).
export_levers() {
    local kvs kv
    IFS=';' read -ra kvs <<<"$1"
    for kv in "${kvs[@]}"; do export "$kv"; done
}

# ---- batched (issue 19): many sequences in one forward ------------------------------------
# ATTN_PAGED's op cases on cuda (tests/ops/op_paged.c), minfer_multi end to
# end on a small synthetic qwen2 (tests/cuda/test_cuda_multi.c), then the
# batched bench on full-size synth --fast models, f16 KV: $OUT/batched.md.
# BATCHED_MODELS="tag:preset:type:npp:npl ..." overrides the bench list;
# BATCHED_LEVERS="VAR=value ..." adds a row per lever (B 4,16,64; -npp <= 128
# only); BATCHED_PROFILE=1 a MINFER_OP_PROFILE run of the largest B each.
if want batched && [ $HAVE_MINFER -eq 1 ]; then
    t=$(date +%s)
    if [ $PREBUILT -eq 1 ] || cmake --build "$BUILD" -j"$JOBS" --target test_ops_paged test_cuda_multi >>"$LOG/build.log" 2>&1; then
        PSUITE=$(find "$BUILD" -name test_ops_paged -type f -perm -u+x | head -1)
        timeout "$(tmo 120)" "$PSUITE" cuda >"$LOG/ops-paged.log" 2>&1
        rc=$?
        last=$(grep -E "passed, .* failed" "$LOG/ops-paged.log" | tail -1)
        if [ $rc -eq 0 ]; then note ops-paged PASS "$last ($(( $(date +%s) - t ))s)";
        else note ops-paged FAIL "rc $rc: $last"; grep FAIL "$LOG/ops-paged.log" | cut -c1-160 | head -30 >>"$SUMMARY"; fi
        t=$(date +%s)
        MULTI=$(find "$BUILD" -name test_cuda_multi -type f -perm -u+x | head -1)
        if timeout 120 "$MINFER" synth --preset qwen2-0.5b --layers 4 --vocab 4096 --ctx 1024 --type q4_0 \
                -o "$MODELS/multi.gguf" >"$LOG/synth-multi.log" 2>&1; then
            timeout "$(tmo 120)" "$MULTI" "$MODELS/multi.gguf" >"$LOG/multi.log" 2>&1
            rc=$?
            if [ $rc -eq 0 ]; then note multi PASS "$(grep -E '^(batch_equals|paged_agrees|fork_)' "$LOG/multi.log" | tr '\n' ';' | cut -c1-300)";
            else note multi FAIL "rc $rc"; grep -E "FAIL|tie" "$LOG/multi.log" | cut -c1-160 | head -20 >>"$SUMMARY"; fi
        else note multi FAIL "synth failed (synth-multi.log)"; fi
    else note batched FAIL "test_ops_paged / test_cuda_multi did not build (build.log)"; fi
    : >"$OUT/batched.md"
    for spec in ${BATCHED_MODELS:-"q7km:qwen2-7b:Q4_K_M:128:1,4,16,64,256" "q05:qwen2-0.5b:q4_0:128:1,4,16,64,256" \
                "q7km:qwen2-7b:Q4_K_M:512:32,96"}; do
        IFS=: read -r tag preset ttype npp npl <<<"$spec"
        left || { note batched SKIP "$tag npp $npp: out of time"; continue; }
        bm=$MODELS/batched-$tag.gguf
        if [ ! -s "$bm" ] && ! timeout "$(tmo 200)" "$MINFER" synth --preset "$preset" --type "$ttype" --fast -o "$bm" \
                >"$LOG/synth-batched-$tag.log" 2>&1; then
            note batched FAIL "$tag: synth failed"; continue
        fi
        echo "### $tag ($preset $ttype, synth --fast) -npp $npp -ntg 128 -npl $npl -ctk f16 $(date -u +%Y-%m-%dT%H:%MZ)" >>"$OUT/batched.md"
        t=$(date +%s)
        if timeout "$(tmo 300)" "$MINFER" bench -m "$bm" --device cuda -ctk f16 -npp "$npp" -ntg 128 -npl "$npl" \
                >>"$OUT/batched.md" 2>"$LOG/batched-$tag-$npp.err"; then
            note batched done "$tag npp $npp: S_PP/S_TG per B: $(grep -E '^\| +[0-9]' "$OUT/batched.md" | tail -n "$(tr ',' '\n' <<<"$npl" | wc -l)" | awk -F'|' '{printf "%s/%s;", $7, $9}' | tr -s ' ') ($(( $(date +%s) - t ))s)"
        else note batched FAIL "$tag npp $npp: $(tail -1 "$LOG/batched-$tag-$npp.err")"; fi
        echo >>"$OUT/batched.md"
        for lev in ${BATCHED_LEVERS:-}; do # a row per lever (as TABLE_LEVERS), B = 4,16,64, short prompts
            left && [ "$npp" -le 128 ] || break
            echo "### $tag -npp $npp lever $lev -npl 4,16,64" >>"$OUT/batched.md"
            ( export_levers "$lev"; timeout "$(tmo 200)" "$MINFER" bench -m "$bm" --device cuda -ctk f16 -npp "$npp" \
                -ntg 128 -npl 4,16,64 >>"$OUT/batched.md" 2>>"$LOG/batched-$tag-$npp.err" ) &&
                note batched done "$tag npp $npp $lev: S_TG $(grep -E '^\| +[0-9]' "$OUT/batched.md" | tail -n 3 | awk -F'|' '{printf "%s;", $9}' | tr -s ' ')" ||
                note batched FAIL "$tag npp $npp $lev: $(tail -1 "$LOG/batched-$tag-$npp.err")"
            echo >>"$OUT/batched.md"
        done
        if [ "${BATCHED_PROFILE:-0}" = 1 ]; then
            MINFER_OP_PROFILE=1 timeout "$(tmo 60)" "$MINFER" bench -m "$bm" --device cuda -ctk f16 -npp "$npp" -ntg 32 \
                -npl "${npl##*,}" >"$LOG/profile-batched-$tag-$npp.txt" 2>&1
        fi
    done
    rm -f "$MODELS"/batched-*.gguf
    cp "$LOG/ops-paged.log" "$LOG/multi.log" "$OUT/" 2>/dev/null
elif want batched; then
    note batched SKIP "minfer not built"
fi

# ---- bench ------------------------------------------------------------------------------------------
# bench_model NAME SYNTH-ARGS [extra bench args]: synthesizes, benches, appends to bench.md
bench_model() {
    local name=$1 sargs=$2; shift 2
    if ! left; then note bench SKIP "$name: out of time"; return; fi
    local bm=$MODELS/bench-${MNAME:-$name}.gguf   # MNAME: share one synthesized model
    local t; t=$(date +%s)
    if [ ! -s "$bm" ] && ! timeout "$(tmo 200)" "$MINFER" synth $sargs -o "$bm" >"$LOG/synth-bench-$name.log" 2>&1; then
        note bench FAIL "$name: synth failed (synth-bench-$name.log)"; return
    fi
    echo "### $name ($sargs) $(date -u +%Y-%m-%dT%H:%MZ)" >>"$OUT/bench.md"
    local l0; l0=$(wc -l <"$OUT/bench.md")
    timeout "$(tmo 240)" "$MINFER" bench -m "$bm" --device cuda -p 512 -n 128 "$@" >>"$OUT/bench.md" \
        2>"$LOG/bench-$name.err"
    local rc=$?
    echo >>"$OUT/bench.md"
    local line; line=$(tail -n +"$((l0 + 1))" "$OUT/bench.md" | grep -E 'pp512|tg128' | awk -F'|' '{print $(NF-2) $(NF-1)}' | tr -s ' ' | tr '\n' ';')
    if [ $rc -eq 0 ]; then note bench done "$name: $line ($(( $(date +%s) - t ))s)";
    else note bench FAIL "$name: rc $rc $(tail -1 "$LOG/bench-$name.err")"; fi
    if [ "${PROFILE:-0}" = 1 ]; then
        MINFER_OP_PROFILE=1 timeout 120 "$MINFER" bench -m "$bm" --device cuda -p 0 -n 32 -r 1 \
            >"$LOG/profile-tg-$name.txt" 2>&1
        MINFER_OP_PROFILE=1 timeout 120 "$MINFER" bench -m "$bm" --device cuda -p 512 -n 0 -r 1 \
            >"$LOG/profile-pp-$name.txt" 2>&1
    fi
    [ "${KEEP_MODEL:-0}" = 1 ] || rm -f "$bm"
}
if [ $HAVE_MINFER -eq 1 ] && "$MINFER" bench --help >/dev/null 2>&1; then
    if want bench; then
        bench_model qwen2-0.5b-q4_0 "--preset qwen2-0.5b --type q4_0" -r 5
        KEEP_MODEL=1 bench_model qwen2-0.5b-q8_0 "--preset qwen2-0.5b --type q8_0" -r 2
        timeout 60 "$MINFER" bench -m "$MODELS/bench-qwen2-0.5b-q8_0.gguf" --device cuda -p 512 -n 64 -r 1 \
            -o json >"$OUT/bench.json" 2>>"$LOG/bench-json.err"
        rm -f "$MODELS/bench-qwen2-0.5b-q8_0.gguf"
    fi
    if want perf; then
        # The defaults against each lever flipped alone (PERF_LEVERS, one
        # VAR=value each), on one synthesized model each; the 7B keeps every
        # shape in GPU_CHECK_7B_LAYERS layers (default 8); plus a per-op profile.
        for m in "q05|--preset qwen2-0.5b --type q4_0" \
                 "q7|--preset qwen2-7b --type Q4_K_M --layers ${GPU_CHECK_7B_LAYERS:-8}"; do
            tag=${m%%|*}; sargs=${m#*|}
            MNAME=perf-$tag KEEP_MODEL=1 PROFILE=1 bench_model "perf-$tag" "$sargs" -r 3
            for lev in ${PERF_LEVERS:-MINFER_CUDA_TUNE=pdl=0 MINFER_CUDA_TUNE=gemv=v1 MINFER_CUDA_TUNE=gemv=v3 \
                       MINFER_CUDA_TUNE=fuse_add=0 MINFER_CUDA_TUNE=attn_decode=block MINFER_CUDA_TUNE=mm=wmma \
                       MINFER_CUDA_TUNE=attn_prefill=flash MINFER_NO_CUDA_GRAPH=1 MINFER_CUDA_TUNE=fuse_gemv=1}; do
                ( export_levers "$lev"; MNAME=perf-$tag KEEP_MODEL=1 bench_model "perf-$tag-$lev" "$sargs" -r 3 )
            done
            rm -f "$MODELS/bench-perf-$tag.gguf"
        done
    fi
    if want table; then
        # The issue's table: full-size synthetic models (synth --fast: real
        # shapes, 512 drawn rows per tensor repeated; speed does not depend on
        # the values), f16 KV cache (llama.cpp's default), -r ${TABLE_R:-20}.
        # TABLE_LEVERS="VAR=1 ..." adds a row per lever on the same model.
        TABLE_LIST=${TABLE_MODELS:-"q7km:qwen2-7b:Q4_K_M q70:qwen2-7b:q4_0 q78:qwen2-7b:q8_0 q3km:qwen3-4b:Q4_K_M q05:qwen2-0.5b:q4_0 q05km:qwen2-0.5b:Q4_K_M"}
        for spec in $TABLE_LIST; do
            # an optional 4th field adds synth flags, commas for spaces
            # ("q05l2:qwen2-0.5b:q4_0:--layers,2": the per-token cost outside the layers)
            IFS=: read -r tag preset ttype extra <<<"$spec"
            sx="--preset $preset --type $ttype --fast ${extra//,/ }"
            # TABLE_ARGS: more bench flags, e.g. "-p 0" for tg-only lever rows
            MNAME=t-$tag KEEP_MODEL=1 bench_model "table-$tag" "$sx" -ctk f16 -r "${TABLE_R:-20}" ${TABLE_ARGS:-}
            if [ -n "${TABLE_BASE:-}" ]; then # the same model on another build's minfer (before / after)
                ( MINFER=$TABLE_BASE MNAME=t-$tag KEEP_MODEL=1 bench_model "table-$tag-base" "$sx" -ctk f16 \
                    -r "${TABLE_R:-20}" ${TABLE_ARGS:-} )
            fi
            if [ -n "${TABLE_BASE_DUMP:-}" ] && [ -n "$DUMP" ] && [ -s "$MODELS/bench-t-$tag.gguf" ]; then
                # greedy tokens of this build and the base build on the same model
                gtok() { grep -o '"tokens": *\[[^]]*\]' "$1" | head -1; }
                for which in new base; do
                    d=$DUMP; [ $which = base ] && d=$TABLE_BASE_DUMP
                    timeout "$(tmo 120)" "$d" "$MODELS/bench-t-$tag.gguf" --tokens $TOKS --decode 16 --device cuda --cache f16 \
                        >"$LOG/tok-$tag-$which.json" 2>"$LOG/tok-$tag-$which.err"
                done
                if [ -n "$(gtok "$LOG/tok-$tag-new.json")" ] && [ "$(gtok "$LOG/tok-$tag-new.json")" = "$(gtok "$LOG/tok-$tag-base.json")" ]; then
                    note tokens PASS "$tag: greedy tokens (14 + 16 decoded) identical to the base build"
                else note tokens FAIL "$tag: greedy tokens differ from the base build ($(tail -1 "$LOG/tok-$tag-new.err"))"; fi
            fi
            for lev in ${TABLE_LEVERS:-}; do
                ( export_levers "$lev"; MNAME=t-$tag KEEP_MODEL=1 bench_model "table-$tag-$lev" "$sx" -ctk f16 \
                    -r "${TABLE_R:-20}" ${TABLE_ARGS:-} )
            done
            if [ "$tag" = q7km ] && [ "${TABLE_DEPTH:-1}" = 1 ] && left; then
                # pp2048 and tg128 after 4096 tokens of context (llama.cpp: 10,001 / 247.8)
                echo "### table-q7km depth 4096 $(date -u +%Y-%m-%dT%H:%MZ)" >>"$OUT/bench.md"
                timeout "$(tmo 300)" "$MINFER" bench -m "$MODELS/bench-t-q7km.gguf" --device cuda -ctk f16 \
                    -p 2048 -n 128 -d 4096 -r "${TABLE_DEPTH_R:-3}" >>"$OUT/bench.md" 2>"$LOG/bench-depth.err" &&
                    note bench done "q7km d4096: $(grep -E 'pp2048|tg128' "$OUT/bench.md" | tail -2 | awk -F'|' '{print $(NF-2)}' | tr -s ' ' | tr '\n' ';')" ||
                    note bench FAIL "q7km d4096: $(tail -1 "$LOG/bench-depth.err")"
                if [ -n "${TABLE_BASE:-}" ]; then
                    echo "### table-q7km-base depth 4096 $(date -u +%Y-%m-%dT%H:%MZ)" >>"$OUT/bench.md"
                    timeout "$(tmo 300)" "$TABLE_BASE" bench -m "$MODELS/bench-t-q7km.gguf" --device cuda -ctk f16 \
                        -p 2048 -n 128 -d 4096 -r "${TABLE_DEPTH_R:-3}" >>"$OUT/bench.md" 2>"$LOG/bench-depth-base.err" &&
                        note bench done "q7km-base d4096: $(grep -E 'pp2048|tg128' "$OUT/bench.md" | tail -2 | awk -F'|' '{print $(NF-2)}' | tr -s ' ' | tr '\n' ';')" ||
                        note bench FAIL "q7km-base d4096: $(tail -1 "$LOG/bench-depth-base.err")"
                fi
            fi
            rm -f "$MODELS/bench-t-$tag.gguf"
        done
    fi
elif want bench; then
    note bench SKIP "minfer bench not available"
fi
rm -rf "$MODELS"
finish
