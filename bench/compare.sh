#!/usr/bin/env bash
# Before/after in one run: two minfer binaries (say, build-before/minfer and
# build-after/minfer) benchmarked on the same model, interleaved A B A B ...
# ROUNDS times, so drift of the machine (other load, clocks, page cache) hits
# both alike. Prints each side's per-round t/s and the median ratio per test.
#
#   bench/compare.sh BIN_A BIN_B MODEL [bench flags...]   (default -p 128 -n 32 -r 5)
#   ROUNDS=5 bench/compare.sh build-a/minfer build-b/minfer models/x.gguf -t 2
# A and B are split on spaces, so an environment lever compares in one binary:
#   bench/compare.sh "env MINFER_NO_FUSE_FFN=1 build/minfer" build/minfer MODEL -p 0 -n 32
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: bench/compare.sh BIN_A BIN_B MODEL [bench flags...]" >&2; exit 2; }
A=$1 B=$2 M=$3
shift 3
FLAGS=("$@")
[ ${#FLAGS[@]} -gt 0 ] || FLAGS=(-p 128 -n 32 -r 5)
ROUNDS=${ROUNDS:-3}
PY=${PYTHON:-python3}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for r in $(seq 1 "$ROUNDS"); do
    $A bench -m "$M" "${FLAGS[@]}" -o json >"$TMP/a$r.json" 2>/dev/null
    $B bench -m "$M" "${FLAGS[@]}" -o json >"$TMP/b$r.json" 2>/dev/null
done
"$PY" - "$TMP" "$ROUNDS" "$A" "$B" <<'PYEOF'
import json, statistics, sys
tmp, rounds, a, b = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def load(side):
    out = {}
    for r in range(1, rounds + 1):
        for row in json.load(open(f"{tmp}/{side}{r}.json")):
            name = ("pp%d" % row["n_prompt"]) if row["n_prompt"] else ("tg%d" % row["n_gen"])
            if row["n_depth"]:
                name += " @ d%d" % row["n_depth"]
            name += " t%d" % row["n_threads"]
            out.setdefault(name, []).append(row["avg_ts"])
    return out
A, B = load("a"), load("b")
print(f"A = {a}\nB = {b}\n")
print("| test | A t/s (per round) | B t/s (per round) | B/A (median) |")
print("| --- | --- | --- | ---: |")
for name in A:
    ra, rb = A[name], B.get(name, [])
    ratio = statistics.median(rb) / statistics.median(ra) if rb else float("nan")
    fa = " ".join("%.2f" % x for x in ra)
    fb = " ".join("%.2f" % x for x in rb)
    print(f"| {name} | {fa} | {fb} | {ratio:.3f} |")
PYEOF
