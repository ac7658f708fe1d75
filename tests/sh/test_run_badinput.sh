#!/usr/bin/env bash
# minfer run / chat / perplexity on bad input: every bad flag, value or file
# gives a non-zero exit (2 for usage, 1 for the rest) and exactly one stderr
# line naming the problem; never a crash.
set -u
. "$(dirname "$0")/lib.sh" --model
# Patterns here are words of the message in any case; a run may echo the
# prompt before it fails (the NaN-logits cases), so stdout is not checked.
EXPECT_ICASE=1
EXPECT_STDOUT=any

# ---- tiny hand-made GGUFs (no tokenizer needed: the model check comes first) ----
"$PY" - "$TMP" <<'EOF' || { echo "FAIL: cannot write test GGUFs"; exit 1; }
import sys, numpy as np, gguf
d = sys.argv[1]
rng = np.random.default_rng(1)
def f32(*shape):  # numpy shape is (ne1, ne0)
    return rng.standard_normal(shape).astype(np.float32)
def llama(path, arch="llama", drop=None, override=None, heads=4, kv=2):
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(1); w.add_context_length(64); w.add_embedding_length(64)
    w.add_feed_forward_length(128); w.add_head_count(heads); w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-5)
    t = {"token_embd.weight": f32(100, 64), "output_norm.weight": f32(64),
         "blk.0.attn_norm.weight": f32(64), "blk.0.attn_q.weight": f32(64, 64),
         "blk.0.attn_k.weight": f32(32, 64), "blk.0.attn_v.weight": f32(32, 64),
         "blk.0.attn_output.weight": f32(64, 64), "blk.0.ffn_norm.weight": f32(64),
         "blk.0.ffn_gate.weight": f32(128, 64), "blk.0.ffn_up.weight": f32(128, 64),
         "blk.0.ffn_down.weight": f32(64, 128)}
    if drop: del t[drop]
    if override: t.update(override)
    for k, v in t.items(): w.add_tensor(k, v)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
llama(f"{d}/gpt2.gguf", arch="gpt2")
llama(f"{d}/missing.gguf", drop="blk.0.ffn_up.weight")
llama(f"{d}/shape.gguf", override={"blk.0.attn_k.weight": f32(48, 64)})
llama(f"{d}/type.gguf", override={"blk.0.ffn_up.weight": np.ones((128, 64), np.int32)})
llama(f"{d}/heads.gguf", heads=4, kv=3)
llama(f"{d}/qwen2.gguf", arch="qwen2")  # qwen2 without its Q/K/V biases
EOF
printf 'this is not a gguf file, just some text\n' >"$TMP/text.gguf"
head -c 20000 /dev/urandom >"$TMP/random.gguf"
long=$(for i in $(seq 1 200); do printf 'word%d ' "$i"; done)
printf 'short text\n' >"$TMP/short.txt"

R="$BIN run -m $MODEL"
# ---- usage errors: exit 2 ----
expect_fail 2 "-n" $R -p hi -n -5
expect_fail 2 "-c" $R -p hi -c -1
expect_fail 2 "unknown option" $R -p hi --bogus
expect_fail 2 "needs a value" $R -p
expect_fail 2 "needs a value" $R -p hi -n
expect_fail 2 "not a number" $R -p hi --temp abc
expect_fail 2 "not an integer" $R -p hi --top-k 1.5
expect_fail 2 "--top-p" $R -p hi --top-p 1.5
expect_fail 2 "prompt" $R
expect_fail 2 "exclusive" $R -p hi -f "$TMP/short.txt"
expect_fail 2 "unknown option" "$BIN" chat -m "$MODEL" -p hi
expect_fail 2 "-f" "$BIN" perplexity -m "$MODEL"
expect_fail 2 "unknown option" "$BIN" perplexity -m "$MODEL" -f "$TMP/short.txt" --nope
expect_fail 2 "-c" "$BIN" perplexity -m "$MODEL" -f "$TMP/short.txt" -c -4

# ---- bad files and values: exit 1 ----
expect_fail 1 "not found" "$BIN" run -m "$TMP/nonexistent.gguf" -p hi
expect_fail 1 "gguf" "$BIN" run -m "$TMP/text.gguf" -p hi
expect_fail 1 "gguf" "$BIN" run -m "$TMP/random.gguf" -p hi
expect_fail 1 "unsupported architecture 'gpt2'" "$BIN" run -m "$TMP/gpt2.gguf" -p hi
expect_fail 1 "tensor 'blk.0.ffn_up.weight' not found" "$BIN" run -m "$TMP/missing.gguf" -p hi
expect_fail 1 "expected [64, 32]" "$BIN" run -m "$TMP/shape.gguf" -p hi
expect_fail 1 "unsupported type" "$BIN" run -m "$TMP/type.gguf" -p hi
expect_fail 1 "head_count_kv 3" "$BIN" run -m "$TMP/heads.gguf" -p hi
expect_fail 1 "attn_q.bias' not found" "$BIN" run -m "$TMP/qwen2.gguf" -p hi
expect_fail 1 "context" $R -c 16 -p "$long"
expect_fail 1 "cannot open" $R -f "$TMP/no-such-prompt.txt"
expect_fail 1 "cache type 'q4_z'" $R -p hi -ctk q4_z
expect_fail 1 "cuda" $R -p hi --device cuda
expect_fail 1 "unknown device" $R -p hi --device tpu
expect_fail 1 "n_gpu_layers" $R -p hi -ngl 5
expect_fail 1 "unknown backend" env MINFER_BACKENDS=gpu,cpu $R -p hi
expect_fail 1 "not found" "$BIN" chat -m "$TMP/nonexistent.gguf"
expect_fail 1 "unsupported architecture" "$BIN" perplexity -m "$TMP/gpt2.gguf" -f "$TMP/short.txt"
expect_fail 1 "fewer than one chunk" "$BIN" perplexity -m "$MODEL" -f "$TMP/short.txt" -c 128
expect_fail 1 "cannot read" "$BIN" perplexity -m "$MODEL" -f "$TMP/no-such.txt"

# ---- context beyond the trained one: refused, one line naming both numbers, never an abort ----
expect_fail 1 "n_ctx 8193 exceeds the model's trained context of 8192" $R -p hi -c 8193
expect_fail 1 "n_ctx 2000000000 exceeds the model's trained context of 8192" $R -p hi -c 2000000000
expect_fail 1 "n_ctx 2147483647 exceeds the model's trained context of 8192" $R -p hi -c 2147483647
expect_fail 1 "n_ctx 20000 exceeds" "$BIN" chat -m "$MODEL" -c 20000
[ ! -s "$TMP/out" ] && pass || fail "the refused chat printed to stdout"

# ---- out of memory shows at session creation (the KV cache and the n_batch graph are
# reserved there), before the prompt is echoed, as one error line. The limit is
# calibrated: a small context must still run under it, else this host is skipped. ----
LIM=400000
if (ulimit -v $LIM; $R -p hi -n 1 -c 256 -t 2 >/dev/null 2>&1); then
    (ulimit -v $LIM; $R -p hi -n 1 -c 8192 -t 2 >"$TMP/out" 2>"$TMP/err"); rc=$?
    if grep -qE 'Segmentation|Sanitizer|Aborted|core dumped|internal error' "$TMP/err"; then
        fail "OOM at -c 8192 crashed: $(cat "$TMP/err")"
    elif [ $rc -ne 1 ]; then fail "OOM at -c 8192 exited $rc: $(cat "$TMP/err")"
    elif [ -s "$TMP/out" ]; then fail "OOM at -c 8192 echoed the prompt first: $(head -c 100 "$TMP/out")"
    elif [ "$(grep -c '^run: ' "$TMP/err")" -ne 1 ] ||
         ! grep -q '^run: session: reserving n_ctx 8192.*bytes.* on cpu.*out of memory' "$TMP/err"; then
        fail "OOM at -c 8192: no single 'run: session: reserving ... out of memory' line: $(cat "$TMP/err")"
    else echo "ok: ulimit -v $LIM, -c 8192 -> $(grep '^run:' "$TMP/err")"; pass; fi
else
    echo "skip: -c 256 does not run under ulimit -v $LIM on this host"
fi

# ---- a model whose logits are NaN: one line naming the position, exit 1 ----
"$PY" - "$TMP/nan.gguf" "$SRC/tests/ref" <<'EOF' || fail "cannot write nan.gguf"
import sys
sys.path.insert(0, sys.argv[2])
import numpy as np, gguf, make_gguf
make_gguf.write(sys.argv[1], "llama", dim=64, layers=1, vocab=300)
r = gguf.GGUFReader(sys.argv[1], "r+")
for t in r.tensors:
    if t.name == "output_norm.weight":
        t.data[3] = np.nan
EOF
expect_fail 1 "logits are not finite at position 0" env MINFER_LOG=error "$BIN" run -m "$TMP/nan.gguf" -p "the" -n 4 --temp 0
expect_fail 1 "logits are not finite at position" env MINFER_LOG=error "$BIN" run -m "$TMP/nan.gguf" -p "the cat" -n 4

# --help tells the truth: every flag it lists is accepted by the parser.
"$BIN" run --help >"$TMP/help" 2>&1 && pass || fail "run --help failed"
for f in -m -p -f -n --chat --logits-out --no-display-prompt -sys --chat-template -c -b -t \
         -ctk -ctv -ngl --device -s --temp --top-k --top-p --min-p --repeat-penalty \
         --repeat-last-n --presence-penalty --frequency-penalty; do
    grep -qF -- "$f" "$TMP/help" && pass || fail "run --help does not mention $f"
done
"$BIN" perplexity --help >/dev/null 2>&1 && pass || fail "perplexity --help failed"
"$BIN" chat --help >/dev/null 2>&1 && pass || fail "chat --help failed"

finish
