#!/usr/bin/env bash
# minfer inspect / quantize / synth from the command line: the real model's
# table, valid JSON, and a one-line error with a non-zero exit for bad input.
set -u
. "$(dirname "$0")/lib.sh" --model

# ---- inspect on the real model ----
if "$BIN" inspect "$MODEL" >"$TMP/inspect.txt" 2>"$TMP/err"; then pass; else fail "inspect failed: $(cat "$TMP/err")"; fi
grep -q "^tensors (272):" "$TMP/inspect.txt" && pass || fail "inspect does not list 272 tensors"
[ "$(grep -cE '^ +[0-9]+  (token_embd|output_norm|blk\.[0-9]+\.)' "$TMP/inspect.txt")" -eq 272 ] && pass \
    || fail "inspect table does not have 272 rows"
grep -qE '^ +[0-9]+ +blk\.0\.attn_q\.weight +q4_1 +576x576 ' "$TMP/inspect.txt" && pass \
    || fail "no 'blk.0.attn_q.weight q4_1 576x576' row"
grep -qE 'token_embd\.weight +q8_0 +576x49152' "$TMP/inspect.txt" && pass || fail "token_embd row"
grep -qE 'general\.architecture +str +llama' "$TMP/inspect.txt" && pass || fail "architecture kv"
grep -qE 'tokenizer\.ggml\.tokens +arr\[str,49152\] \["<\|endoftext\|>"' "$TMP/inspect.txt" && pass \
    || fail "array summary of tokens"
grep -qE '^totals: 272 tensors, .* 134515008 parameters .* bits per weight' "$TMP/inspect.txt" && pass \
    || fail "totals line: $(grep totals "$TMP/inspect.txt")"
"$BIN" inspect "$MODEL" --no-tensors >"$TMP/nt.txt" 2>/dev/null
! grep -q "blk.0.attn_q.weight" "$TMP/nt.txt" && grep -q "^totals: 272" "$TMP/nt.txt" && pass \
    || fail "--no-tensors"

# ---- --json is one valid JSON object with the same facts ----
if "$BIN" inspect "$MODEL" --json >"$TMP/inspect.json" 2>"$TMP/err"; then pass; else fail "inspect --json failed"; fi
"$PY" - "$TMP/inspect.json" <<'PYEOF' && pass || fail "inspect --json content"
import json, sys
d = json.load(open(sys.argv[1]))
t = {x["name"]: x for x in d["tensors"]}
assert len(d["tensors"]) == 272 == d["totals"]["n_tensors"], len(d["tensors"])
assert t["blk.0.attn_q.weight"]["type"] == "q4_1" and t["blk.0.attn_q.weight"]["shape"] == [576, 576]
assert d["metadata"]["general.architecture"] == "llama"
assert d["metadata"]["llama.block_count"] == 30
assert abs(d["metadata"]["llama.attention.layer_norm_rms_epsilon"] - 1e-5) < 1e-9
assert d["metadata"]["tokenizer.ggml.add_bos_token"] is False
assert d["metadata"]["tokenizer.ggml.tokens"]["n"] == 49152
assert d["metadata"]["tokenizer.ggml.tokens"]["head"][0] == "<|endoftext|>"
assert "{% for message in messages %}" in d["metadata"]["tokenizer.chat_template"]
assert d["totals"]["params"] == 134515008
assert d["totals"]["bytes"] == sum(x["bytes"] for x in d["tensors"])
assert d["file_size"] > d["totals"]["bytes"]
PYEOF

# ---- bad input: one line, non-zero exit ----
printf 'this is not a gguf file, just text\n%.0s' {1..20} >"$TMP/text.gguf"
expect_fail 1 "$TMP/missing.gguf" "$BIN" inspect "$TMP/missing.gguf"
expect_fail 1 "text.gguf" "$BIN" inspect "$TMP/text.gguf"
expect_fail 2 "missing FILE" "$BIN" inspect
expect_fail 2 "unknown option '--bogus'" "$BIN" inspect "$MODEL" --bogus
expect_fail 2 "unknown type 'q4_z'" "$BIN" quantize "$MODEL" "$TMP/o.gguf" q4_z
expect_fail 2 "Q4_K_M" "$BIN" quantize "$MODEL" "$TMP/o.gguf" q4_z
expect_fail 1 "tensor 'token_embd.weight' is already q8_0; requantizing is not supported" \
    "$BIN" quantize "$MODEL" "$TMP/o.gguf" Q4_K_M
[ ! -e "$TMP/o.gguf" ] && [ ! -e "$TMP/o.gguf.tmp" ] && pass || fail "refused quantize left a file"
expect_fail 1 "missing.gguf" "$BIN" quantize "$TMP/missing.gguf" "$TMP/o.gguf" q8_0
expect_fail 2 "--threads: 'x' is not an integer" "$BIN" quantize "$MODEL" "$TMP/o.gguf" q8_0 --threads x
expect_fail 2 "usage" "$BIN" quantize "$MODEL"
expect_fail 2 "unknown preset 'qwen9-1b'" "$BIN" synth --preset qwen9-1b -o "$TMP/s.gguf"
expect_fail 2 "unknown arch 'gpt9'" "$BIN" synth --arch gpt9 --dim 64 --layers 1 --ff 64 --heads 2 -o "$TMP/s.gguf"
expect_fail 2 "missing -o" "$BIN" synth --preset qwen2-0.5b --layers 1
expect_fail 2 "--layers: 'two' is not an integer" "$BIN" synth --preset qwen2-0.5b --layers two -o "$TMP/s.gguf"
expect_fail 2 "--layers: 0 is out of range" "$BIN" synth --preset qwen2-0.5b --layers 0 -o "$TMP/s.gguf"
expect_fail 2 "--vocab: 100 is out of range" "$BIN" synth --preset qwen2-0.5b --vocab 100 -o "$TMP/s.gguf"
expect_fail 2 "--theta: 'abc' is not a number" "$BIN" synth --preset qwen2-0.5b --theta abc -o "$TMP/s.gguf"
expect_fail 2 "unknown type 'q9_K'" "$BIN" synth --preset qwen2-0.5b --type q9_K -o "$TMP/s.gguf"
expect_fail 2 "not a multiple of --kv-heads" "$BIN" synth --arch llama --dim 64 --layers 1 --ff 64 --heads 4 --kv-heads 3 -o "$TMP/s.gguf"
expect_fail 2 "--ff --heads are required" "$BIN" synth --arch qwen2 --dim 64 -o "$TMP/s.gguf"
expect_fail 2 "does not match preset" "$BIN" synth --arch llama --preset qwen3-0.6b -o "$TMP/s.gguf"
expect_fail 2 "--seed needs a value" "$BIN" synth --preset qwen2-0.5b -o "$TMP/s.gguf" --seed
[ ! -e "$TMP/s.gguf" ] && pass || fail "a refused synth wrote a file"

# ---- a synth into an unwritable place fails cleanly ----
expect_fail 1 "/nonexistent-dir/m.gguf" "$BIN" synth --arch llama --dim 64 --layers 1 --ff 64 --heads 2 \
    --vocab 300 -o /nonexistent-dir/m.gguf

finish
