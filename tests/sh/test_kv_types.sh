#!/usr/bin/env bash
# KV cache types from the command line: the 4/5-bit block types and K / V of
# different types give sensible greedy text on SmolLM2 (run, chat, perplexity),
# -fa off the same text as -fa on, and a model whose head_dim is not a
# multiple of 32 refuses the block types with one line naming head_dim.
set -u
. "$(dirname "$0")/lib.sh" --model

R=("$BIN" run -m "$MODEL" -t 2 --temp 0 -n 12 -c 256)
P="The capital of France is"
for kv in "q5_0 q5_0" "q5_1 q8_0" "q8_0 q4_1" "f16 q4_0" "q4_0 f32"; do
    set -- $kv
    "${R[@]}" -p "$P" -ctk "$1" -ctv "$2" >"$TMP/out_$1_$2" 2>"$TMP/err" &&
        grep -q Paris "$TMP/out_$1_$2" && grep -q "KV cache K $1 + V $2" "$TMP/err" &&
        pass || fail "-ctk $1 -ctv $2: $(cat "$TMP/out_$1_$2" "$TMP/err")"
done
# -ctv alone: K keeps the default (f32)
"${R[@]}" -p "$P" -ctv q8_0 >/dev/null 2>"$TMP/err" && grep -q "KV cache K f32 + V q8_0" "$TMP/err" &&
    pass || fail "-ctv alone: $(cat "$TMP/err")"
# -fa off: the same greedy text as -fa on, for a mixed quantized cache
"${R[@]}" -p "$P" -ctk q8_0 -ctv q5_1 -fa on >"$TMP/fa_on" 2>/dev/null
"${R[@]}" -p "$P" -ctk q8_0 -ctv q5_1 -fa off >"$TMP/fa_off" 2>"$TMP/err" && cmp -s "$TMP/fa_on" "$TMP/fa_off" &&
    pass || fail "-fa off differs: $(cat "$TMP/fa_on") vs $(cat "$TMP/fa_off" "$TMP/err")"
# chat takes the same flags (this chat prompt's first answer token is a near tie under
# any K/V rounding, so the quantized run is only checked to answer)
printf 'What is the capital of France?\n/exit\n' | "$BIN" chat -m "$MODEL" -t 2 --temp 0 -n 16 -c 256 -fa off \
    >"$TMP/chat_off" 2>"$TMP/err" && grep -q Paris "$TMP/chat_off" &&
    pass || fail "chat -fa off: $(cat "$TMP/chat_off" "$TMP/err")"
printf 'What is the capital of France?\n/exit\n' | "$BIN" chat -m "$MODEL" -t 2 --temp 0 -n 16 -c 256 \
    -ctk q8_0 -ctv f16 >"$TMP/chat_kv" 2>"$TMP/err" && grep -q "KV cache K q8_0 + V f16" "$TMP/err" &&
    [ -s "$TMP/chat_kv" ] && pass || fail "chat -ctk q8_0 -ctv f16: $(cat "$TMP/chat_kv" "$TMP/err")"
# perplexity: a mixed quantized cache scores close to f32 (same text, same chunks)
for i in $(seq 1 40); do echo "The quick brown fox jumps over the lazy dog. Paris is the capital of France."; done >"$TMP/text.txt"
"$BIN" perplexity -m "$MODEL" -t 2 -f "$TMP/text.txt" -c 128 --chunks 1 >"$TMP/ppl_f32" 2>&1 &&
    "$BIN" perplexity -m "$MODEL" -t 2 -f "$TMP/text.txt" -c 128 --chunks 1 -ctk q8_0 -ctv q5_0 -fa off \
        >"$TMP/ppl_mix" 2>&1 && pass || fail "perplexity: $(cat "$TMP/ppl_f32" "$TMP/ppl_mix")"
a=$(grep -oE 'Final estimate: PPL = [0-9.]+' "$TMP/ppl_f32" | grep -oE '[0-9.]+$')
b=$(grep -oE 'Final estimate: PPL = [0-9.]+' "$TMP/ppl_mix" | grep -oE '[0-9.]+$')
"$PY" -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); assert a > 1 and abs(b - a) / a < 0.1, (a, b)" \
    "${a:-0}" "${b:-0}" && pass || fail "perplexity f32 $a vs q8_0/q5_0 -fa off $b"

# head_dim 48: f16 runs, the block types are refused naming head_dim
M48="$TMP/hd48.gguf"
if "$BIN" synth --arch llama --dim 96 --layers 1 --ff 128 --heads 2 --kv-heads 1 --head-dim 48 --vocab 300 \
    --type f16 -o "$M48" >/dev/null 2>"$TMP/err"; then
    "$BIN" run -m "$M48" -p hi -n 2 -ctk f16 >/dev/null 2>"$TMP/err" && pass || fail "head_dim 48 f16: $(cat "$TMP/err")"
    expect_fail 1 "head_dim % 32 == 0, this model's head_dim is 48" "$BIN" run -m "$M48" -p hi -n 2 -ctk q4_0
    expect_fail 1 "V cache type" "$BIN" run -m "$M48" -p hi -n 2 -ctv q8_0
else
    fail "synth head_dim 48: $(cat "$TMP/err")"
fi
finish
