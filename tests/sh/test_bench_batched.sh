#!/usr/bin/env bash
# minfer bench in batched mode (-npp / -ntg / -npl, like llama-batched-bench)
# on a tiny synthetic qwen2: the JSON has one row per combination with
# numbers that agree with each other (N_KV = B*(PP+TG), S_PP = B*PP / T_PP,
# S_TG = B*TG / T_TG, S = N_KV / T), the markdown table has its header and
# rows, and bad values fail with one line.
set -u
. "$(dirname "$0")/lib.sh"

M="$TMP/tiny.gguf"
if ! "$BIN" synth --arch qwen2 --dim 256 --layers 2 --ff 512 --heads 4 --kv-heads 2 --vocab 1000 \
    --type q4_0 --seed 5 -o "$M" >/dev/null 2>"$TMP/err"; then
    echo "FAIL: synth: $(cat "$TMP/err")"
    exit 1
fi

if "$BIN" bench -m "$M" -npp 8,17 -ntg 3 -npl 1,3 -t 1 -b 16 --device cpu -o json >"$TMP/b.json" 2>"$TMP/err"; then
    pass; else fail "batched bench -o json failed: $(cat "$TMP/err")"; fi
"$PY" - "$TMP/b.json" <<'PYEOF' && pass || fail "batched bench json content"
import json, sys
rows = json.load(open(sys.argv[1]))
assert isinstance(rows, list) and len(rows) == 4, rows
seen = set()
for r in rows:
    for f in ["pp", "tg", "pl", "n_kv", "t_pp", "speed_pp", "t_tg", "speed_tg", "t", "speed"]:
        assert f in r, (f, r)
    seen.add((r["pp"], r["tg"], r["pl"]))
    assert r["n_kv"] == r["pl"] * (r["pp"] + r["tg"]), r
    assert r["t_pp"] > 0 and r["t_tg"] > 0, r
    # the times are printed to the microsecond: a sub-millisecond time carries
    # up to 0.5e-6 / t of rounding into the ratio
    assert abs(r["speed_pp"] - r["pl"] * r["pp"] / r["t_pp"]) <= r["speed_pp"] * (1e-3 + 1e-6 / r["t_pp"]), r
    assert abs(r["speed_tg"] - r["pl"] * r["tg"] / r["t_tg"]) <= r["speed_tg"] * (1e-3 + 1e-6 / r["t_tg"]), r
    assert abs(r["t"] - (r["t_pp"] + r["t_tg"])) < 1e-5, r
    assert abs(r["speed"] - r["n_kv"] / r["t"]) <= r["speed"] * (1e-3 + 1e-6 / r["t"]), r
assert seen == {(8, 3, 1), (8, 3, 3), (17, 3, 1), (17, 3, 3)}, seen
PYEOF

if "$BIN" bench -m "$M" -npp 4 -ntg 2 -npl 2 -t 1 --device cpu >"$TMP/b.md" 2>"$TMP/err"; then pass; else
    fail "batched bench md failed: $(cat "$TMP/err")"; fi
grep -q "|    PP |     TG |    B |   N_KV |" "$TMP/b.md" && pass || fail "md header: $(cat "$TMP/b.md")"
[ "$(grep -c '^|     4 |      2 |    2 |     12 |' "$TMP/b.md")" = 1 ] && pass || fail "md row: $(cat "$TMP/b.md")"

# -r: interleaved rounds, still one row per combination, each with the median times
if "$BIN" bench -m "$M" -npp 4 -ntg 2 -npl 1,2 -r 3 -t 1 --device cpu -o json >"$TMP/r.json" 2>"$TMP/err"; then
    pass; else fail "batched bench -r 3 failed: $(cat "$TMP/err")"; fi
"$PY" - "$TMP/r.json" <<'PYEOF' && pass || fail "batched bench -r json content"
import json, sys
rows = json.load(open(sys.argv[1]))
assert [r["pl"] for r in rows] == [1, 2], rows
assert all(r["t_pp"] > 0 and r["t_tg"] > 0 for r in rows), rows
PYEOF
expect_fail 2 "-r: 0 is out of range" "$BIN" bench -m "$M" -npl 1 -r 0

expect_fail 2 "-npl: 0 is out of range" "$BIN" bench -m "$M" -npl 0
expect_fail 2 "-npp: '4,,8' is not a comma-separated list" "$BIN" bench -m "$M" -npp 4,,8
expect_fail 2 "unknown option '--bogus' in batched mode" "$BIN" bench -m "$M" -npl 1 --bogus
expect_fail 2 "-o: 'xml' is not md or json" "$BIN" bench -m "$M" -npl 1 -o xml
expect_fail 1 "$TMP/missing.gguf" "$BIN" bench -m "$TMP/missing.gguf" -npl 1
expect_fail 1 "q4_z" "$BIN" bench -m "$M" -npl 1 -npp 4 -ntg 1 -ctk q4_z

finish
