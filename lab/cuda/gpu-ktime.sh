#!/usr/bin/env bash
# gpu-ktime.sh - the in-situ kernel timeline of decode on the GPU box: builds
# minfer with -DMINFER_CUDA_KTIME=ON in a build dir of its own (every kernel
# that calls mf_pdl_wait records its release time, src/backend/cuda/pdl.cuh),
# synthesizes the models, runs `minfer bench --device cuda -p 0 -n 8 -r 1
# -ctk f16` on each (a warm-up and one timed run of 8 decode steps: the last
# steps are CUDA-graph replays), and keeps the timeline that the backend
# prints when it is freed. Self-contained (no network). Output under $OUT:
#   ktime.txt            bench lines, host times, and each timeline's summary
#   ktime-<model>.txt    the whole dump (the last 4 steps kernel by kernel)
#   ktime-build.log, ktime-synth-<model>.log
# KTIME_MODELS="name|synth args;..." overrides the models; KTIME_LEVERS="VAR=1
# A=1,B=0 ..." adds a run per lever set (comma-separated assignments) on the
# same model; KTIME_BASE=<a minfer built without the option> adds a run of
# that binary per model, whose host-times line ("graph on the GPU") shows
# what the instrumentation itself costs; MINFER_KTIME_STEPS=n prints n steps.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
BUILD=${KTIME_BUILD:-$PWD/build-ktime-gpu}
export PATH=/usr/local/cuda/bin:$PATH
P=$OUT/ktime.txt; : >"$P"
t0=$(date +%s)
cmake -B "$BUILD" -S . -DCMAKE_BUILD_TYPE=Release -DMINFER_CUDA=ON -DMINFER_CUDA_ARCHS=90 \
    -DMINFER_CUDA_KTIME=ON -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" >"$OUT/ktime-build.log" 2>&1 &&
    cmake --build "$BUILD" -j"$(nproc)" --target minfer >>"$OUT/ktime-build.log" 2>&1 ||
    { echo "build failed" >>"$P"; tail -30 "$OUT/ktime-build.log" >>"$P"; cat "$P"; exit 1; }
echo "build $(( $(date +%s) - t0 ))s" >>"$P"
M=$BUILD/minfer
MODELS=${KTIME_MODELS:-"q05|--preset qwen2-0.5b --type q4_0 --fast;q7km|--preset qwen2-7b --type Q4_K_M --fast --layers 4"}
IFS=';' read -ra LIST <<<"$MODELS"

# run_one TAG BINARY [VAR=value ...]: one bench with the host times on; the
# timeline (stderr) into ktime-TAG.txt, its summary into ktime.txt
run_one() {
    local tag=$1 bin=$2; shift 2
    echo "-- $tag ${*:-}" >>"$P"
    env "$@" MINFER_CUDA_HOST_TIMES=1 timeout 300 "$bin" bench -m "$mf" --device cuda -p 0 -n 8 -r 1 \
        -ctk f16 >>"$P" 2>"$OUT/ktime-$tag.txt" || echo "$tag: bench failed (rc $?)" >>"$P"
    grep -E '^cuda host times|^ktime: (file|[0-9]+ rings|[0-9]+ records|[0-9]+ steps|.*reading the ring)' \
        "$OUT/ktime-$tag.txt" >>"$P"
    # the per-kernel summary: from its header to the step-total line
    sed -n '/^ktime: == summary/,/^ktime: step total/p' "$OUT/ktime-$tag.txt" >>"$P"
    grep -v '^ktime' "$OUT/ktime-$tag.txt" | grep -iv '^cuda host times' | tail -5 >>"$P"
}

for spec in "${LIST[@]}"; do
    name=${spec%%|*}; sargs=${spec#*|}
    mf=$BUILD/kt-$name.gguf
    t=$(date +%s)
    timeout 300 "$M" synth $sargs --threads "$(nproc)" -o "$mf" >"$OUT/ktime-synth-$name.log" 2>&1 ||
        { echo "$name: synth failed" >>"$P"; continue; }
    echo "== $name ($sargs) synth $(( $(date +%s) - t ))s" >>"$P"
    run_one "$name" "$M"
    for lev in ${KTIME_LEVERS:-}; do
        IFS=',' read -ra kv <<<"$lev"
        run_one "$name-$(echo "$lev" | tr -c 'A-Za-z0-9_\n' '_')" "$M" "${kv[@]}"
    done
    if [ -n "${KTIME_BASE:-}" ]; then # the same model without the instrumentation
        run_one "$name-base" "$KTIME_BASE"
    fi
    rm -f "$mf"
done
echo "total $(( $(date +%s) - t0 ))s" >>"$P"
cat "$P"
