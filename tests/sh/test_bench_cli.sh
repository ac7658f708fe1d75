#!/usr/bin/env bash
# minfer bench on a tiny synthetic qwen2: the JSON has llama-bench's fields
# with numbers that agree with each other (samples vs means, t/s vs ns), the
# markdown table has its header and one row per test, comma lists give the
# cross product, and bad flags fail with one line.
set -u
. "$(dirname "$0")/lib.sh"

M="$TMP/tiny.gguf"
if ! "$BIN" synth --arch qwen2 --dim 256 --layers 2 --ff 512 --heads 4 --kv-heads 2 --vocab 1000 \
    --type q8_0 --seed 3 -o "$M" >/dev/null 2>"$TMP/err"; then
    echo "FAIL: synth: $(cat "$TMP/err")"
    exit 1
fi
"$BIN" inspect "$M" --json >"$TMP/inspect.json" 2>/dev/null || fail "inspect --json"

# ---- JSON: fields, counts, and numbers that agree with each other ----
if "$BIN" bench -m "$M" -p 16 -n 4 -r 2 -t 1 --device cpu -o json >"$TMP/b.json" 2>"$TMP/err"; then pass; else
    fail "bench -o json failed: $(cat "$TMP/err")"; fi
"$PY" - "$TMP/b.json" "$TMP/inspect.json" "$M" <<'PYEOF' && pass || fail "bench json content"
import json, re, sys
rows = json.load(open(sys.argv[1]))
ins = json.load(open(sys.argv[2]))
assert isinstance(rows, list) and len(rows) == 2, rows
fields = ["build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_filename",
          "model_type", "model_size", "model_n_params", "n_batch", "n_threads", "type_k", "type_v",
          "n_gpu_layers", "n_prompt", "n_gen", "n_depth", "test_time", "avg_ns", "stddev_ns",
          "avg_ts", "stddev_ts", "samples_ns", "samples_ts", "peak_rss_bytes"]
for r in rows:
    missing = [f for f in fields if f not in r]
    assert not missing, missing
    assert r["model_filename"] == sys.argv[3]
    assert r["model_n_params"] == ins["totals"]["params"], (r["model_n_params"], ins["totals"])
    assert 0 < r["model_size"] <= ins["totals"]["bytes"] and r["model_size"] > 1_000_000, r["model_size"]
    assert r["n_threads"] == 1 and r["n_depth"] == 0 and r["n_batch"] == 512
    assert r["type_k"] == r["type_v"] == "f32"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", r["test_time"]), r["test_time"]
    assert r["build_number"] == 0 and isinstance(r["build_commit"], str) and r["build_commit"]
    assert "qwen2" in r["model_type"] and r["backends"] == "CPU", (r["model_type"], r["backends"])
    ns, ts = r["samples_ns"], r["samples_ts"]
    assert len(ns) == len(ts) == 2, (ns, ts)
    toks = r["n_prompt"] + r["n_gen"]
    for a, b in zip(ns, ts):
        assert a > 0 and b > 0 and abs(b * a / 1e9 - toks) < 1e-3 * toks, (a, b, toks)
    assert abs(r["avg_ns"] - sum(ns) / 2) <= 1, r
    assert abs(r["avg_ts"] - sum(ts) / 2) < 1e-3 * r["avg_ts"] and r["avg_ts"] > 0, r
    sd = abs(ts[0] - ts[1]) / 2 ** 0.5
    assert abs(r["stddev_ts"] - sd) <= 1e-3 * r["avg_ts"] + 1e-6, (r["stddev_ts"], sd)
    assert r["peak_rss_bytes"] > 1 << 20, r["peak_rss_bytes"]
pp, tg = rows
assert (pp["n_prompt"], pp["n_gen"]) == (16, 0) and (tg["n_prompt"], tg["n_gen"]) == (0, 4), rows
assert abs(tg["weights_gbps"] - tg["model_size"] * tg["avg_ts"] / 1e9) < 1e-3 * tg["weights_gbps"]
print("json ok: pp16 %.1f t/s, tg4 %.1f t/s" % (pp["avg_ts"], tg["avg_ts"]))
PYEOF

# ---- markdown: header, one row per test, mean ± sd, GB/s on tg rows ----
if "$BIN" bench -m "$M" -p 16 -n 4 -r 2 -t 1 --device cpu >"$TMP/b.md" 2>"$TMP/err"; then pass; else
    fail "bench md failed: $(cat "$TMP/err")"; fi
head -1 "$TMP/b.md" | grep -qxF '| model | size | params | backend | threads | test | t/s | GB/s |' && pass \
    || fail "md header: $(head -1 "$TMP/b.md")"
sed -n 2p "$TMP/b.md" | grep -qE '^\| --- \| ---: ' && pass || fail "md separator: $(sed -n 2p "$TMP/b.md")"
[ "$(wc -l <"$TMP/b.md")" -eq 4 ] && pass || fail "md has $(wc -l <"$TMP/b.md") lines, want 4"
grep -qE '^\| [^|]*qwen2[^|]* \| [0-9.]+ MiB \| [0-9.]+ M \| CPU \| 1 \| pp16 \| [0-9.]+ ± [0-9.]+ \|  \|$' \
    "$TMP/b.md" && pass || fail "md pp16 row: $(grep pp16 "$TMP/b.md")"
grep -qE '\| 1 \| tg4 \| [0-9.]+ ± [0-9.]+ \| [0-9]+\.[0-9]{2} \|$' "$TMP/b.md" && pass \
    || fail "md tg4 row: $(grep tg4 "$TMP/b.md")"
grep -qE '^peak RSS: [0-9.]+ MiB$' "$TMP/err" && pass || fail "no peak RSS line on stderr: $(cat "$TMP/err")"

# ---- comma lists: the cross product, in order, with depth in the test name ----
if "$BIN" bench -m "$M" -p 8,16 -n 2,3 -t 1,2 -d 0,5 -r 1 -o json >"$TMP/x.json" 2>"$TMP/err"; then
    pass; else fail "bench lists failed: $(cat "$TMP/err")"; fi
"$PY" - "$TMP/x.json" <<'PYEOF' && pass || fail "cross product"
import json, sys
rows = json.load(open(sys.argv[1]))
got = [(r["n_threads"], r["n_depth"], r["n_prompt"], r["n_gen"]) for r in rows]
want = [(t, d, p, g) for t in (1, 2) for d in (0, 5)
        for (p, g) in ((8, 0), (16, 0), (0, 2), (0, 3))]
assert got == want, got
assert all(len(r["samples_ns"]) == 1 and r["stddev_ts"] == 0 for r in rows)
print("cross product ok: %d rows" % len(rows))
PYEOF
if "$BIN" bench -m "$M" -p 8 -n 0 -d 6 -r 1 -t 1 >"$TMP/d.md" 2>/dev/null; then pass; else fail "bench -d"; fi
grep -qF '| pp8 @ d6 |' "$TMP/d.md" && ! grep -q 'tg' "$TMP/d.md" && pass \
    || fail "depth row / -n 0: $(cat "$TMP/d.md")"

# ---- --membw: one probe line, and a '% of membw' column filled on tg rows ----
if "$BIN" bench -m "$M" -p 8 -n 2 -r 1 -t 1 --membw --device cpu >"$TMP/m.md" 2>"$TMP/err"; then pass; else
    fail "bench --membw failed: $(cat "$TMP/err")"; fi
grep -qE '^membw: [0-9.]+ GB/s read with 1 threads' "$TMP/m.md" && pass || fail "membw line: $(head -2 "$TMP/m.md")"
grep -qF '| GB/s | % of membw |' "$TMP/m.md" && grep -qE '\| tg2 \| .* \| [0-9.]+% \|$' "$TMP/m.md" \
    && pass || fail "membw column: $(cat "$TMP/m.md")"

# ---- bad flags and files: one line, exit 2 for usage, 1 for the rest ----
expect_fail 2 "-p: 'abc' is not an integer" "$BIN" bench -m "$M" -p abc
expect_fail 2 "-n: '4,,8' is not a comma-separated list" "$BIN" bench -m "$M" -n 4,,8
expect_fail 2 "-t: -1 is out of range" "$BIN" bench -m "$M" -t 2,-1
expect_fail 2 "-r: 0 is out of range" "$BIN" bench -m "$M" -r 0
expect_fail 2 "--output: 'xml' is not md, csv, json or jsonl" "$BIN" bench -m "$M" -o xml
expect_fail 2 "--device: 'tpu' is not a device of this build" "$BIN" bench -m "$M" --device tpu
expect_fail 2 "unknown option '--bogus'" "$BIN" bench -m "$M" --bogus
expect_fail 2 "nothing to run" "$BIN" bench -m "$M" -p 0 -n 0
expect_fail 2 "-p needs a value" "$BIN" bench -m "$M" -p
expect_fail 1 "$TMP/missing.gguf" "$BIN" bench -m "$TMP/missing.gguf"
printf 'not a gguf file at all\n' >"$TMP/text.gguf"
expect_fail 1 "text.gguf" "$BIN" bench -m "$TMP/text.gguf" -p 4 -n 0 -r 1
expect_fail 1 "q4_z" "$BIN" bench -m "$M" -p 4 -n 0 -r 1 -ctk q4_z

# ---- llama-bench flags: -pg, -ub, -ngl, -fa, -o csv / jsonl ----
if "$BIN" bench -m "$M" -p 16 -n 4 -pg 8,4 -r 2 -t 1 -ub 4 -ngl 99 -fa 1 --device cpu -o jsonl \
    >"$TMP/b.jsonl" 2>"$TMP/err"; then pass; else fail "bench -o jsonl: $(cat "$TMP/err")"; fi
"$BIN" bench -m "$M" -p 16 -n 4 -pg 8,4 -r 2 -t 1 -ub 4 --device cpu -o csv >"$TMP/b.csv" 2>"$TMP/err" \
    && pass || fail "bench -o csv: $(cat "$TMP/err")"
"$PY" - "$TMP/b.jsonl" "$TMP/b.csv" <<'PYEOF' && pass || fail "bench jsonl/csv content"
import csv, json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 3, rows
for r in rows:
    assert r["n_ubatch"] == 4 and r["n_batch"] == 512 and r["flash_attn"] is True, r
    assert r["n_gpu_layers"] == 0 and r["type_k"] == "f32", r  # the CPU runs it
pg = rows[2]
assert (pg["n_prompt"], pg["n_gen"]) == (8, 4), pg
for a, b in zip(pg["samples_ns"], pg["samples_ts"]):
    assert abs(b * a / 1e9 - 12) < 1e-2, (a, b)  # t/s over the 8 + 4 tokens
c = list(csv.DictReader(open(sys.argv[2])))
assert len(c) == 3 and all(len(x) == len(c[0]) for x in c), c
assert [int(x["n_prompt"]) for x in c] == [16, 0, 8] and [int(x["n_gen"]) for x in c] == [0, 4, 4], c
assert c[1]["weights_gbps"] and not c[0]["weights_gbps"], c
assert json.loads(c[0]["samples_ns"]) and c[0]["model_filename"].endswith("tiny.gguf"), c[0]
print("jsonl/csv ok")
PYEOF
"$BIN" bench -m "$M" -p 0 -n 0 -pg 8,4 -r 1 -t 1 --device cpu >"$TMP/pg.md" 2>"$TMP/err"
grep -q '| pp8+tg4 |' "$TMP/pg.md" && pass || fail "md -pg row: $(cat "$TMP/pg.md" "$TMP/err")"
expect_fail 2 "PP,TG" "$BIN" bench -m "$M" -pg 8
expect_fail 2 "one attention mode" "$BIN" bench -m "$M" -fa 0,1
expect_fail 2 "not md, csv, json or jsonl" "$BIN" bench -m "$M" -o xml
# separate K / V types and -fa 0 reach the JSON fields
"$BIN" bench -m "$M" -p 8 -n 0 -r 1 -t 1 -ctk f16 -ctv q8_0 -fa 0 --device cpu -o json >"$TMP/kv.json" 2>"$TMP/err" &&
    "$PY" -c 'import json,sys; r=json.load(open(sys.argv[1]))[0]; assert (r["type_k"],r["type_v"],r["flash_attn"])==("f16","q8_0",False), r' \
        "$TMP/kv.json" && pass || fail "bench -ctk f16 -ctv q8_0 -fa 0: $(cat "$TMP/kv.json" "$TMP/err")"
expect_fail 1 "partial offload" "$BIN" bench -m "$M" -p 4 -n 0 -r 1 -ngl 1

finish
