#!/usr/bin/env bash
# minfer against the comparison engine (llama.cpp) on the CPU, both on the
# same GGUF files, in one run. For each model the two engines alternate
# (minfer, llama.cpp, minfer, llama.cpp ...) ROUNDS times, so drift of a
# shared machine (other load, clocks, page cache) hits both alike; the ratio
# is minfer's median over llama.cpp's median per test. Prints the machine
# (lscpu model and the ISA flags the kernels care about, the load average
# before and after, the `minfer bench --membw` probe before and after) and a
# markdown ratio table.
#
#   bench/cpu-compare.sh                          # ./build/minfer, 2 threads
#   LLAMA_DIR=/path/llama-cpu bench/cpu-compare.sh # llama.cpp built (or found) there
#   MODELS="qwen2-0.5b:q4_0" ROUNDS=3 REPS=2 bench/cpu-compare.sh
#   TESTS="-p 128 -n 32" THREADS=2 bench/cpu-compare.sh
#
# LLAMA_DIR (default $HOME/llama-cpu): when DIR/bin/llama-bench is missing it
# is built with build-llamacpp.sh from the anchor folder (ANCHOR, default the
# first of ../shared/anchor and ../../shared/anchor beside this checkout that
# has it; 3-10 min on 2 cores). The models are `minfer synth --fast` files
# made once under MODEL_DIR (default models/, which git ignores).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${MINFER_BIN:-$ROOT/build/minfer}
DIR=${MODEL_DIR:-$ROOT/models}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
REPS=${REPS:-2}
read -r -a TESTS <<<"${TESTS:--p 128 -n 32}"
MODELS=${MODELS:-"qwen2-0.5b:q4_0 qwen2-0.5b:q8_0 qwen2-0.5b:Q4_K_M qwen2-1.5b:Q4_K_M"}
LLAMA_DIR=${LLAMA_DIR:-$HOME/llama-cpu}
PY=${PYTHON:-python3}

[ -x "$BIN" ] || { echo "cpu-compare: no minfer binary at $BIN (set MINFER_BIN)" >&2; exit 1; }
LB=$LLAMA_DIR/bin/llama-bench
if [ ! -x "$LB" ]; then
    if [ -z "${ANCHOR:-}" ]; then
        for a in "$ROOT/../shared/anchor" "$ROOT/../../shared/anchor"; do
            [ -f "$a/build-llamacpp.sh" ] && { ANCHOR=$a; break; }
        done
    fi
    [ -f "${ANCHOR:-}/build-llamacpp.sh" ] ||
        { echo "cpu-compare: no $LB and no build-llamacpp.sh found (set LLAMA_DIR or ANCHOR)" >&2; exit 1; }
    echo "cpu-compare: building llama.cpp into $LLAMA_DIR (3-10 min)" >&2
    nice -n 10 bash "$ANCHOR/build-llamacpp.sh" cpu "$LLAMA_DIR" >&2
fi
[ -x "$LB" ] || { echo "cpu-compare: the build left no $LB" >&2; exit 1; }

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$DIR"
files=()
for spec in $MODELS; do
    preset=${spec%%:*} type=${spec#*:}
    f=$DIR/synth-$preset-$type.gguf
    if [ ! -f "$f" ]; then
        echo "cpu-compare: making $f" >&2
        "$BIN" synth --arch qwen2 --preset "$preset" --type "$type" --seed 1 --fast -o "$f" >/dev/null
    fi
    files+=("$f")
done

# the probe alone: one single-token decode of the first model, --membw
membw() {
    "$BIN" bench -m "${files[0]}" -t "$THREADS" -p 0 -n 1 -r 1 --membw -o json 2>/dev/null |
        "$PY" -c 'import json,sys; print("%.1f" % json.load(sys.stdin)[0]["membw_gbps"])'
}

echo "## cpu-compare: minfer vs llama.cpp, $THREADS threads, ${TESTS[*]}, $ROUNDS rounds x -r $REPS"
echo
echo "- CPU: $(lscpu | sed -n 's/^Model name: *//p') (family $(lscpu | sed -n 's/^CPU family: *//p'), model $(lscpu | sed -n 's/^Model: *//p')), $(nproc) CPUs"
echo "- ISA flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' |
    grep -E '^(avx2|fma|f16c|avx512f|avx512bw|avx512vl|avx512_vnni|avx512_bf16|avx512_fp16|avx_vnni|amx_tile|amx_int8|amx_bf16)$' | tr '\n' ' ')"
echo "- caches: $(lscpu | sed -n 's/^\(L[123][di]* cache\): */\1 /p' | tr '\n' ';' | sed 's/;$//')"
echo "- minfer: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?') ($BIN); llama.cpp: $LB"
echo "- load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
MB0=$(membw)
echo "- minfer bench --membw ($THREADS threads) before: $MB0 GB/s"

for i in "${!files[@]}"; do
    f=${files[$i]}
    for r in $(seq 1 "$ROUNDS"); do
        "$BIN" bench -m "$f" -t "$THREADS" "${TESTS[@]}" -r "$REPS" -o json >"$TMP/m$i-$r.json" 2>/dev/null ||
            { echo "cpu-compare: minfer bench failed on $f" >&2; exit 1; }
        "$LB" -m "$f" -t "$THREADS" "${TESTS[@]}" -r "$REPS" -o json >"$TMP/l$i-$r.json" 2>/dev/null ||
            { echo "cpu-compare: llama-bench failed on $f" >&2; exit 1; }
    done
done

MB1=$(membw)
echo "- minfer bench --membw after: $MB1 GB/s"
echo "- load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
"$PY" - "$TMP" "$ROUNDS" "$MB0" "$MB1" "${files[@]}" <<'PYEOF'
import json, os, statistics, sys
tmp, rounds, mb0, mb1 = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
files = sys.argv[5:]
membw = max(mb0, mb1)
def load(side, i):
    out, size = {}, 0
    for r in range(1, rounds + 1):
        for row in json.load(open(f"{tmp}/{side}{i}-{r}.json")):
            name = ("pp%d" % row["n_prompt"]) if row["n_prompt"] else ("tg%d" % row["n_gen"])
            out.setdefault(name, []).extend(row.get("samples_ts") or [row["avg_ts"]])
            size = row.get("model_size", size)
    return out, size
print("| model | test | minfer t/s (runs) | llama.cpp t/s (runs) | ratio (medians) | minfer GB/s (% of membw) |")
print("| --- | --- | --- | --- | ---: | ---: |")
for i, f in enumerate(files):
    m, size = load("m", i)
    l, _ = load("l", i)
    label = os.path.basename(f).removeprefix("synth-").removesuffix(".gguf")
    for name in m:
        a, b = m[name], l.get(name, [])
        ratio = statistics.median(a) / statistics.median(b) if b else float("nan")
        gbs = ""
        if name.startswith("tg"):
            g = size * statistics.median(a) / 1e9
            gbs = "%.1f (%.0f%%)" % (g, 100 * g / membw) if membw > 0 else "%.1f" % g
        fa = " ".join("%.1f" % x for x in a)
        fb = " ".join("%.1f" % x for x in b)
        print(f"| {label} | {name} | {statistics.median(a):.1f} ({fa}) | {statistics.median(b):.1f} ({fb}) | {ratio:.2f} | {gbs} |")
print(f"\n% of membw against the larger probe reading ({membw:.1f} GB/s).")
PYEOF
