#!/usr/bin/env bash
# gpu-kprof.sh - Nsight Compute detail (occupancy, warp stall reasons, memory
# and scheduler statistics) for the decode kernels matching a name, in a
# short plain-launch decode of a synthetic model. Needs the build of
# scripts/gpu-check.sh ($BUILD/minfer). Output: $OUT/kprof-<tag>.txt.
#   KPROF_MODEL   synth flags (default: the qwen2-7B Q4_K_M shapes, 2 layers)
#   KPROF_KERNEL  ncu kernel-name regex (default gemv_q8v4)
#   KPROF_SKIP / KPROF_COUNT  launches of that name skipped / profiled
#   KPROF_TAG     output name
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
BUILD=${BUILD:-$PWD/build-gpu}
export PATH=/usr/local/cuda/bin:$PATH
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
tag=${KPROF_TAG:-q7}
mf=$BUILD/kprof-$tag.gguf
"$BUILD/minfer" synth ${KPROF_MODEL:---preset qwen2-7b --type Q4_K_M --layers 2 --fast} -o "$mf" >/dev/null 2>&1 ||
    { echo "synth failed" >"$OUT/kprof-$tag.txt"; exit 1; }
MINFER_NO_CUDA_GRAPH=1 timeout 300 "$NCU" --clock-control none -k "regex:${KPROF_KERNEL:-gemv_q8v4}" \
    --launch-skip "${KPROF_SKIP:-8}" --launch-count "${KPROF_COUNT:-8}" \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section SchedulerStats \
    "$BUILD/minfer" bench -m "$mf" --device cuda -p 0 -n 4 -r 1 >"$OUT/kprof-$tag.txt" 2>&1
echo "kprof $tag rc $?"
rm -f "$mf"
