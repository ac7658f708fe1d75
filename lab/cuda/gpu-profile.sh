#!/usr/bin/env bash
# gpu-profile.sh - where the decode time goes on the GPU box: builds minfer with
# CUDA, synthesizes small-layer-count models at real shapes, times tg/pp with
# `minfer bench`, and reads every kernel's duration (and DRAM bytes) of a short
# decode with Nsight Compute (ncu --clock-control none: the card's clocks are
# left alone). Self-contained (no network). Output under $OUT:
#   profile.txt   bench lines + per-kernel-name totals per model
#   ncu-*.csv     raw ncu rows
# PROFILE_MODELS="name|synth args ..." overrides the model list (';'-separated).
# PROFILE_KERNEL=<regex> adds, per model, ncu's occupancy / warp-state /
# memory / scheduler sections for PROFILE_COUNT (8) launches of the matching
# kernels after PROFILE_SKIP (8): ncu-sections-<name>.txt.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
BUILD=${BUILD:-$PWD/build-gpu}
export PATH=/usr/local/cuda/bin:$PATH
P=$OUT/profile.txt; : >"$P"
t0=$(date +%s)
cmake -B "$BUILD" -S . -DCMAKE_BUILD_TYPE=Release -DMINFER_CUDA=ON -DMINFER_CUDA_ARCHS=90 \
    -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" >"$OUT/build.log" 2>&1 &&
    cmake --build "$BUILD" -j"$(nproc)" --target minfer >>"$OUT/build.log" 2>&1 ||
    { echo "build failed" >>"$P"; tail -30 "$OUT/build.log" >>"$P"; cat "$P"; exit 1; }
echo "build $(( $(date +%s) - t0 ))s" >>"$P"
M=$BUILD/minfer
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
MODELS=${PROFILE_MODELS:-"q05|--preset qwen2-0.5b --type q4_0;q7|--preset qwen2-7b --type Q4_K_M --layers 2"}
IFS=';' read -ra LIST <<<"$MODELS"
for spec in "${LIST[@]}"; do
    name=${spec%%|*}; sargs=${spec#*|}
    mf=$BUILD/prof-$name.gguf
    t=$(date +%s)
    timeout 300 "$M" synth $sargs --threads "$(nproc)" -o "$mf" >"$OUT/synth-$name.log" 2>&1 ||
        { echo "$name: synth failed" >>"$P"; continue; }
    echo "== $name ($sargs) synth $(( $(date +%s) - t ))s" >>"$P"
    timeout 200 "$M" bench -m "$mf" --device cuda -p 512 -n 128 -r 3 >>"$P" 2>&1
    for lev in ${PROFILE_LEVERS:-}; do
        echo "-- $lev" >>"$P"
        env "$lev" timeout 200 "$M" bench -m "$mf" --device cuda -p 512 -n 128 -r 3 >>"$P" 2>&1
    done
    if [ -n "$NCU" ]; then
        # decode of 4 tokens after a 1-token prompt, no CUDA graph (plain
        # launches: ncu times each kernel alone, which is its GPU time)
        MINFER_NO_CUDA_GRAPH=1 timeout 300 "$NCU" --clock-control none --csv \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size \
            "$M" bench -m "$mf" --device cuda -p 0 -n 4 -r 1 >"$OUT/ncu-$name.csv" 2>"$OUT/ncu-$name.err"
        python3 - "$OUT/ncu-$name.csv" >>"$P" 2>&1 <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; rows = rows[1:]
ki = hdr.index("Kernel Name"); mi = hdr.index("Metric Name"); vi = hdr.index("Metric Value"); ii = hdr.index("ID")
per = collections.defaultdict(dict)
names = {}
for r in rows:
    try: v = float(r[vi].replace(",", ""))
    except ValueError: continue
    per[r[ii]][r[mi]] = v; names[r[ii]] = r[ki].split("(")[0][:60]
ids = sorted(per, key=int)
n = len(ids); tail = ids[n // 2:]   # the later half: steady decode
agg = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0, 0.0])
for i in tail:
    m = per[i]; a = agg[names[i]]
    a[0] += 1; a[1] += m.get("gpu__time_duration.sum", 0); a[2] += m.get("dram__bytes_read.sum", 0)
    a[3] = m.get("launch__registers_per_thread", 0); a[4] += m.get("sm__warps_active.avg.pct_of_peak_sustained_active", 0)
    a[5] += m.get("launch__grid_size", 0)
tot = sum(a[1] for a in agg.values())
print(f"kernels profiled {n}; steady half {len(tail)} kernels, {tot/1e3:.1f} us GPU time; mean {tot/max(1,len(tail)):.0f} ns/kernel")
print(f"{'kernel':60s} {'n':>5s} {'us':>9s} {'%':>5s} {'ns/each':>8s} {'GB/s':>7s} {'regs':>4s} {'occ%':>5s} {'grid':>6s}")
for k, a in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"{k:60s} {a[0]:5d} {a[1]/1e3:9.1f} {100*a[1]/tot:5.1f} {a[1]/a[0]:8.0f} {a[2]/max(a[1],1):7.0f} {a[3]:4.0f} {a[4]/a[0]:5.1f} {a[5]/a[0]:6.0f}")
PY
        if [ -n "${PROFILE_KERNEL:-}" ]; then
            # the matching kernels' occupancy, warp states, memory and
            # scheduler sections (why a kernel is slow, not only how slow)
            MINFER_NO_CUDA_GRAPH=1 timeout 300 "$NCU" --clock-control none -k "regex:$PROFILE_KERNEL" \
                --launch-skip "${PROFILE_SKIP:-8}" --launch-count "${PROFILE_COUNT:-8}" \
                --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
                --section MemoryWorkloadAnalysis --section SchedulerStats \
                "$M" bench -m "$mf" --device cuda -p 0 -n 4 -r 1 >"$OUT/ncu-sections-$name.txt" 2>&1
            echo "$name: ncu sections of /$PROFILE_KERNEL/ in ncu-sections-$name.txt" >>"$P"
        fi
    fi
    rm -f "$mf"
done
echo "total $(( $(date +%s) - t0 ))s" >>"$P"
cat "$P"
