#!/usr/bin/env bash
# Reproduces the CPU table of docs/PERF.md: synthetic qwen2 models at the
# released shapes (made once under models/, which git ignores), each run with
#   minfer bench -m MODEL -t 2 -p 128 -n 32 -r 10 --membw
# Markdown tables on stdout; with JSON_DIR set, each model's JSON there too
# (a second run of the same tests).
#
#   bench/cpu-table.sh                      # ./build/minfer, 2 threads
#   MINFER_BIN=build-x/minfer THREADS=4 REPS=5 bench/cpu-table.sh
#   MODELS="qwen2-0.5b:q8_0" bench/cpu-table.sh   # a subset
#   DEVICE=cuda bench/cpu-table.sh                 # the GPU instead (default cpu)
#   BENCH_FLAGS="-ctk q8_0" bench/cpu-table.sh     # extra bench flags
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${MINFER_BIN:-$ROOT/build/minfer}
DIR=${MODEL_DIR:-$ROOT/models}
THREADS=${THREADS:-2}
REPS=${REPS:-10}
MODELS=${MODELS:-"qwen2-0.5b:q4_0 qwen2-0.5b:q8_0 qwen2-0.5b:Q4_K_M qwen2-1.5b:Q4_K_M"}
DEVICE=${DEVICE:-cpu}
read -r -a EXTRA <<<"--device $DEVICE ${BENCH_FLAGS:-}"

[ -x "$BIN" ] || { echo "cpu-table: no minfer binary at $BIN (set MINFER_BIN)" >&2; exit 1; }
mkdir -p "$DIR"
echo "minfer bench -t $THREADS -p 128 -n 32 -r $REPS --membw --device $DEVICE ${BENCH_FLAGS:+$BENCH_FLAGS }on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
for spec in $MODELS; do
    preset=${spec%%:*}
    type=${spec#*:}
    f="$DIR/synth-$preset-$type.gguf"
    if [ ! -f "$f" ]; then
        echo "making $f" >&2
        "$BIN" synth --arch qwen2 --preset "$preset" --type "$type" --seed 1 -o "$f" >/dev/null
    fi
    echo
    echo "### $preset $type (synthetic, seed 1)"
    echo
    "$BIN" bench -m "$f" -t "$THREADS" -p 128 -n 32 -r "$REPS" --membw "${EXTRA[@]}"
    if [ -n "${JSON_DIR:-}" ]; then
        mkdir -p "$JSON_DIR"
        "$BIN" bench -m "$f" -t "$THREADS" -p 128 -n 32 -r "$REPS" -o json "${EXTRA[@]}" \
            >"$JSON_DIR/synth-$preset-$type.json"
    fi
done
