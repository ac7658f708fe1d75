"""minfer synth + minfer quantize, checked from the outside with the gguf
Python package (an independent GGUF reader and dequantizer) and HF tokenizers.

Checks: the synthetic model parses and has the real architecture's keys and
shapes; a numpy forward pass over it stays tame; its vocabulary is a valid
byte-level BPE that HF tokenizers accepts; quantize to Q4_K_M / Q2_K follows
llama.cpp's per-tensor mix (recomputed here independently), copies the
metadata, and dequantizes close to the f16 source; synth is deterministic per
seed and independent of the thread count; synth streams (peak RSS far below
the file size)."""
import hashlib
import os
import resource
import subprocess
import sys

import numpy as np
import gguf
from gguf import quants

BIN = os.environ.get("MINFER_BIN", "minfer")
TMP = os.environ.get("MINFER_TMP", "/tmp")
os.makedirs(TMP, exist_ok=True)
checks = 0


def ok(cond, what):
    global checks
    if not cond:
        print("FAIL:", what)
        sys.exit(1)
    checks += 1


def run(*args):
    r = subprocess.run([BIN, *args], capture_output=True, text=True)
    if r.returncode != 0:
        print("command failed:", " ".join(args), "\n", r.stderr[-2000:])
        sys.exit(1)
    return r


def path(name):
    return os.path.join(TMP, "tools_" + name)


def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def field(r, key):
    f = r.fields.get(key)
    return None if f is None else f.contents()


def tensors(r):
    return {t.name: t for t in r.tensors}


def as_float(t):
    """A tensor as float32 of shape (rows, row_length), via gguf.quants."""
    ne0 = int(t.shape[0])
    if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        a = np.asarray(t.data, dtype=np.float32)
    else:
        a = quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
    return a.reshape(-1, ne0)


# ---- 1. streaming: peak RSS of a large synth stays far below its file size ----
# (first, so RUSAGE_CHILDREN's maximum is this child's)
big = path("rss.gguf")
run("synth", "--preset", "qwen2-1.5b", "--layers", "4", "--type", "f16", "--seed", "3", "-o", big)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
size = os.path.getsize(big)
print(f"synth qwen2-1.5b --layers 4: file {size / 2**20:.0f} MiB, peak RSS {peak / 2**20:.0f} MiB")
ok(size > 700 * 2**20, "qwen2-1.5b 4-layer f16 file is at least 700 MiB")
ok(peak < size / 4, "peak RSS below a quarter of the file size")
rb = gguf.GGUFReader(big)
tb = tensors(rb)
ok(list(tb["token_embd.weight"].shape) == [1536, 151936], "1.5b embedding shape")
ok(list(tb["blk.3.ffn_down.weight"].shape) == [8960, 1536], "1.5b ffn_down shape")
ok("blk.4.attn_q.weight" not in tb and "output.weight" not in tb, "4 layers, tied")
del rb, tb
os.remove(big)

# ---- 2. a small qwen2 at f16, shapes that keep K-quants (rows % 256 == 0) ----
L = 8
shape = ["--arch", "qwen2", "--dim", "512", "--heads", "8", "--kv-heads", "2", "--ff", "1024",
         "--vocab", "3000", "--layers", str(L), "--untied"]
src = path("small_f16.gguf")
run("synth", *shape, "--type", "f16", "--seed", "7", "-o", src)
r = gguf.GGUFReader(src)
ts = tensors(r)
ok(field(r, "general.architecture") == "qwen2", "arch key")
ok(field(r, "qwen2.block_count") == L and field(r, "qwen2.embedding_length") == 512, "shape keys")
ok(field(r, "qwen2.attention.head_count_kv") == 2, "kv heads key")
ok(abs(field(r, "qwen2.rope.freq_base") - 1e6) < 1, "qwen2 default theta")
ok(field(r, "general.file_type") == 1, "f16 file_type")
n_exp = 1 + L * 12 + 2
ok(len(ts) == n_exp, f"tensor count {len(ts)} == {n_exp}")
ok(list(ts["blk.0.attn_k.weight"].shape) == [512, 128], "attn_k ne = {n_in, n_out}")
ok(list(ts["blk.0.attn_output.weight"].shape) == [512, 512], "attn_output shape")
ok(list(ts["blk.0.ffn_down.weight"].shape) == [1024, 512], "ffn_down shape")
ok(list(ts["blk.0.attn_q.bias"].shape) == [512], "qwen2 q bias")
ok(list(ts["output.weight"].shape) == [512, 3000], "untied output")
ok(ts["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32, "norm f32")
ok(ts["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.F16, "weight f16")
norm = np.asarray(ts["blk.1.ffn_norm.weight"].data)
ok(abs(norm.mean() - 1) < 0.02 and 0.02 < norm.std() < 0.1, "norm weights ~ 1 + noise")
wq = as_float(ts["blk.0.attn_q.weight"])
ok(abs(wq.std() * np.sqrt(512) - 1) < 0.05, f"attn_q std 1/sqrt(n_in) ({wq.std():.4f})")
ok(abs(wq.mean()) < 0.002, "attn_q centered")

# a numpy forward pass (RMSNorm, GQA attention with RoPE, SwiGLU): every
# layer's residual stays O(1) and logits are finite, spread and not degenerate
def forward(r, ids, n_head, n_kv, eps=1e-6, theta=1e6):
    t = {k: as_float(v) for k, v in tensors(r).items()}
    x = t["token_embd.weight"][ids]
    T, d = x.shape
    hd = d // n_head

    def rms(v, w):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w.reshape(-1)

    def rope(v):  # v (T, h, hd), NEOX style as qwen2
        half = hd // 2
        f = theta ** (-np.arange(half) / half)
        a = np.arange(T)[:, None] * f[None, :]
        c, s = np.cos(a)[:, None, :], np.sin(a)[:, None, :]
        x1, x2 = v[..., :half], v[..., half:]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    rms_per_layer = []
    for l in range(L):
        p = lambda n: t[f"blk.{l}.{n}"]
        h = rms(x, p("attn_norm.weight"))
        q = h @ p("attn_q.weight").T + p("attn_q.bias").reshape(-1)
        k = h @ p("attn_k.weight").T + p("attn_k.bias").reshape(-1)
        v = h @ p("attn_v.weight").T + p("attn_v.bias").reshape(-1)
        q, k, v = q.reshape(T, n_head, hd), k.reshape(T, n_kv, hd), v.reshape(T, n_kv, hd)
        q, k = rope(q), rope(k)
        rep = n_head // n_kv
        k, v = np.repeat(k, rep, 1), np.repeat(v, rep, 1)
        s = np.einsum("thd,uhd->htu", q, k) / np.sqrt(hd)
        s = s + np.triu(np.full((T, T), -np.inf), 1)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("htu,uhd->thd", a, v).reshape(T, d)
        x = x + o @ p("attn_output.weight").T
        h = rms(x, p("ffn_norm.weight"))
        g, u = h @ p("ffn_gate.weight").T, h @ p("ffn_up.weight").T
        x = x + (g / (1 + np.exp(-g)) * u) @ p("ffn_down.weight").T
        rms_per_layer.append(float(np.sqrt((x * x).mean())))
    logits = rms(x, t["output_norm.weight"]) @ t["output.weight"].T
    return logits, rms_per_layer

ids = np.array([5, 300, 42, 1000, 7, 2999, 256, 17])
logits, rmss = forward(r, ids, 8, 2)
print("residual rms per layer:", " ".join(f"{v:.2f}" for v in rmss),
      f"| logits std {logits.std():.2f}")
ok(all(0.2 < v < 5 for v in rmss), "residual stream stays O(1) through the layers")
ok(np.isfinite(logits).all(), "logits finite")
ok(1 < logits.std() < 10, "logits spread but tame")
ok(len(set(logits.argmax(-1).tolist())) > 1 and (logits.std(-1) > 0.5).all(),
   "logits not degenerate")

# ---- 3. the vocabulary: valid byte-level BPE, exact size, specials at the end ----
toks = field(r, "tokenizer.ggml.tokens")
ttype = field(r, "tokenizer.ggml.token_type")
merges = field(r, "tokenizer.ggml.merges")
ok(len(toks) == 3000 and len(ttype) == 3000, "vocab size exactly --vocab")
ok(len(set(toks)) == len(toks), "tokens unique")
ok(toks[-3:] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "specials at the end")
ok(list(ttype[-3:]) == [3, 3, 3] and set(ttype[:-3]) == {1}, "token types")
ok(field(r, "tokenizer.ggml.model") == "gpt2" and field(r, "tokenizer.ggml.pre") == "qwen2",
   "tokenizer model/pre")
ok(field(r, "tokenizer.ggml.eos_token_id") == 2999, "eos = <|im_end|>")
ok(field(r, "tokenizer.ggml.bos_token_id") == 2997, "bos = <|endoftext|>")
ok("<|im_start|>" in field(r, "tokenizer.chat_template"), "ChatML template")
ok(500 < len(merges) <= 4000, f"merges learned ({len(merges)})")
vocab = {s: i for i, s in enumerate(toks)}
pairs = [tuple(m.split(" ")) for m in merges]
ok(all(len(p) == 2 and p[0] in vocab and p[1] in vocab and p[0] + p[1] in vocab for p in pairs),
   "every merge a b has a, b and ab in the vocab")
from tokenizers import Tokenizer, models, pre_tokenizers, decoders
tk = Tokenizer(models.BPE(vocab, pairs))
tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tk.decoder = decoders.ByteLevel()
text = "The river ran past the mill in 1969; def main(): return 0 # Café 🙂 naïve"
enc = tk.encode(text)
ok(tk.decode(enc.ids) == text, "HF tokenizers round-trips text with this vocab")
ok(len(enc.ids) < len(text.encode()) * 0.6, "merges compress common text")
ok(" the" in [tk.decode([i]) for i in enc.ids], "' the' is one token")
small = path("v300.gguf")
run("synth", *shape, "--vocab", "300", "--layers", "1", "-o", small)
rs = gguf.GGUFReader(small)
ok(len(field(rs, "tokenizer.ggml.tokens")) == 300, "tiny vocab exact")
ok(len(field(rs, "tokenizer.ggml.merges")) == 300 - 259, "tiny vocab: merges capped")

# ---- 4. quantize Q4_K_M: llama.cpp's mix, recomputed here independently ----
def more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2

Q = gguf.GGMLQuantizationType
dst = path("small_q4km.gguf")
res = run("quantize", src, dst, "q4_k_m", "--threads", "2")
ok("blk.0.attn_q.weight" in res.stderr and "-> q4_K" in res.stderr, "progress lines")
ok("MiB ->" in res.stderr, "size summary")
rq = gguf.GGUFReader(dst)
tq = tensors(rq)
ok(field(rq, "general.file_type") == 15 and field(rq, "general.quantization_version") == 2,
   "file_type 15 (Q4_K_M), quantization_version 2")
ok(field(rq, "tokenizer.ggml.merges") == merges and field(rq, "qwen2.block_count") == L,
   "other metadata copied")
ok(list(tq) == list(ts), "same tensors in the same order")
ok(tq["output.weight"].tensor_type == Q.Q6_K, "output q6_K")
ok(tq["token_embd.weight"].tensor_type == Q.Q4_K, "untied token_embd keeps the mix type")
for l in range(L):
    want = Q.Q6_K if more_bits(l, L) else Q.Q4_K
    ok(tq[f"blk.{l}.attn_v.weight"].tensor_type == want, f"blk.{l}.attn_v {want.name}")
    ok(tq[f"blk.{l}.ffn_down.weight"].tensor_type == want, f"blk.{l}.ffn_down {want.name}")
    ok(tq[f"blk.{l}.attn_q.weight"].tensor_type == Q.Q4_K, f"blk.{l}.attn_q q4_K")
    ok(tq[f"blk.{l}.attn_norm.weight"].tensor_type == Q.F32, "norms f32")
    ok(tq[f"blk.{l}.attn_q.bias"].tensor_type == Q.F32, "biases f32")
ok(sum(tq[f"blk.{l}.attn_v.weight"].tensor_type == Q.Q6_K for l in range(L)) == 4,
   "4 of 8 attn_v get q6_K (layers 0, 3, 6, 7)")

bound = {Q.IQ4_NL: 0.1, Q.IQ4_XS: 0.1, Q.Q4_K: 0.12, Q.Q6_K: 0.03, Q.Q5_0: 0.07, Q.Q8_0: 0.01, Q.Q3_K: 0.25, Q.Q2_K: 0.45,
         Q.F32: 1e-7, Q.Q5_K: 0.06, Q.Q4_0: 0.15}

def rel_err(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))

def check_close(tq_, names, label):
    for n in names:
        a, b = as_float(tq_[n]), as_float(ts[n])
        e = rel_err(a, b)
        t = tq_[n].tensor_type
        ok(e < bound[t], f"{label} {n} ({t.name}) relative error {e:.4f} < {bound[t]}")
        # and against another tensor of the same shape it must be far off
        if n == "blk.0.attn_q.weight":
            ok(rel_err(a, as_float(ts["blk.1.attn_q.weight"])) > 1.0, "errors are discriminating")
        print(f"  {label} {n:28s} {t.name:5s} rel err {e:.4f}")

check_close(tq, ["blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.1.attn_v.weight",
                 "blk.2.ffn_down.weight", "output.weight", "blk.0.ffn_norm.weight"], "Q4_K_M")

# ---- 5. Q2_K and q8_0: other rules ----
d2 = path("small_q2k.gguf")
run("quantize", src, d2, "Q2_K")
r2 = gguf.GGUFReader(d2)
t2 = tensors(r2)
ok(field(r2, "general.file_type") == 10, "Q2_K file_type 10")
ok(t2["blk.0.attn_q.weight"].tensor_type == Q.Q2_K, "Q2_K base type")
ok(t2["blk.0.attn_v.weight"].tensor_type == Q.Q4_K, "Q2_K attn_v q4_K (n_gqa 4)")
ok(t2["blk.0.ffn_down.weight"].tensor_type == Q.Q3_K, "Q2_K ffn_down q3_K")
ok(t2["blk.0.attn_output.weight"].tensor_type == Q.Q3_K, "Q2_K attn_output q3_K")
check_close(t2, ["blk.0.attn_q.weight", "blk.0.ffn_down.weight"], "Q2_K")
# Q3_K_S: q3_K everywhere but the output; Q3_K_L: attn_v, attn_output and
# ffn_down q5_K (llama.cpp's rules); both load and run
for mix, ft, special in (("Q3_K_S", 11, Q.Q3_K), ("Q3_K_L", 13, Q.Q5_K)):
    d3 = path(f"small_{mix}.gguf")
    run("quantize", src, d3, mix)
    r3 = gguf.GGUFReader(d3)
    t3 = tensors(r3)
    ok(field(r3, "general.file_type") == ft, f"{mix} file_type {ft}")
    ok(t3["output.weight"].tensor_type == Q.Q6_K, f"{mix} output q6_K")
    for l in range(L):
        ok(t3[f"blk.{l}.attn_q.weight"].tensor_type == Q.Q3_K, f"{mix} blk.{l}.attn_q q3_K")
        for n in ("attn_v", "attn_output", "ffn_down"):
            ok(t3[f"blk.{l}.{n}.weight"].tensor_type == special, f"{mix} blk.{l}.{n} {special.name}")
    check_close(t3, ["blk.0.attn_q.weight", "blk.0.attn_v.weight"], mix)
    ok(run("run", "-m", d3, "-p", "hello", "-n", "2", "--temp", "0").returncode == 0, f"{mix} model runs")
# IQ4_NL / IQ4_XS: every 2-D weight that type but the output (q6_K); the
# dequantized weights are close and the file runs
# (CPU kernels: scalar dots, checked in test_cpu_kernels)
for name, ft, qt in (("iq4_nl", 25, Q.IQ4_NL), ("iq4_xs", 30, Q.IQ4_XS)):
    d4 = path(f"small_{name}.gguf")
    run("quantize", src, d4, name)
    r4 = gguf.GGUFReader(d4)
    t4 = tensors(r4)
    ok(field(r4, "general.file_type") == ft, f"{name} file_type {ft}")
    ok(t4["output.weight"].tensor_type == Q.Q6_K, f"{name} output q6_K")
    ok(all(t4[f"blk.{l}.{n}.weight"].tensor_type == qt for l in range(L)
           for n in ("attn_q", "attn_v", "ffn_down", "ffn_up")), f"{name} everywhere")
    check_close(t4, ["blk.0.attn_q.weight", "blk.1.ffn_down.weight"], name)
    ok(run("run", "-m", d4, "-p", "hello", "-n", "4", "--temp", "0").returncode == 0, f"{name} model runs")
d8 = path("small_q80.gguf")
run("quantize", src, d8, "Q8_0")
t8 = tensors(gguf.GGUFReader(d8))
ok(t8["output.weight"].tensor_type == Q.Q8_0 and t8["blk.3.attn_v.weight"].tensor_type == Q.Q8_0,
   "Q8_0 everywhere, output included")
check_close(t8, ["blk.3.attn_v.weight", "token_embd.weight"], "Q8_0")
dp = path("small_pure.gguf")
run("quantize", src, dp, "q4_K", "--pure")
tp = tensors(gguf.GGUFReader(dp))
ok(tp["output.weight"].tensor_type == Q.Q4_K and tp["blk.0.attn_v.weight"].tensor_type == Q.Q4_K,
   "--pure: every 2-D weight q4_K")

# ---- 6. row lengths not a multiple of 256 fall back (real qwen2-0.5b widths) ----
w0 = path("q05_f16.gguf")
run("synth", "--preset", "qwen2-0.5b", "--layers", "2", "--vocab", "1000", "-o", w0)
w1 = path("q05_q4km.gguf")
run("quantize", w0, w1, "Q4_K_M")
tw = tensors(gguf.GGUFReader(w1))
ok(tw["blk.0.attn_q.weight"].tensor_type == Q.Q5_0, "896-wide q4_K falls back to q5_0")
ok(tw["blk.1.attn_v.weight"].tensor_type == Q.Q8_0, "896-wide q6_K falls back to q8_0")
ok(tw["blk.0.ffn_down.weight"].tensor_type == Q.Q4_K, "4864-wide rows keep q4_K")
ok(tw["token_embd.weight"].tensor_type == Q.Q8_0, "tied token_embd as output: q8_0 (896 % 256)")
ts_w0 = tensors(gguf.GGUFReader(w0))
e = rel_err(as_float(tw["blk.0.attn_q.weight"]), as_float(ts_w0["blk.0.attn_q.weight"]))
ok(e < bound[Q.Q5_0], f"q5_0 fallback dequantizes close ({e:.4f})")

# ---- 7. determinism ----
a, b, c = path("det_a.gguf"), path("det_b.gguf"), path("det_c.gguf")
common = ["--arch", "qwen2", "--dim", "256", "--heads", "4", "--ff", "512", "--vocab", "1000",
          "--layers", "2", "--type", "q4_K"]
run("synth", *common, "--seed", "11", "--threads", "1", "-o", a)
run("synth", *common, "--seed", "11", "--threads", "3", "-o", b)
run("synth", *common, "--seed", "12", "-o", c)
ok(sha(a) == sha(b), "same seed -> identical bytes (any thread count)")
ok(sha(a) != sha(c), "different seed -> different bytes")
ta, tc = tensors(gguf.GGUFReader(a)), tensors(gguf.GGUFReader(c))
ok(rel_err(as_float(ta["blk.0.attn_q.weight"]), as_float(tc["blk.0.attn_q.weight"])) > 1.0,
   "different seeds give unrelated weights")

# ---- 8. qwen3 and llama presets ----
p3 = path("qwen3.gguf")
run("synth", "--preset", "qwen3-0.6b", "--layers", "2", "--vocab", "2000", "--type", "q8_0", "-o", p3)
r3 = gguf.GGUFReader(p3)
t3 = tensors(r3)
ok(field(r3, "general.architecture") == "qwen3", "qwen3 arch")
ok(field(r3, "qwen3.attention.key_length") == 128 and field(r3, "qwen3.attention.value_length") == 128,
   "qwen3 explicit head dim")
ok(field(r3, "qwen3.attention.head_count") == 16 and field(r3, "qwen3.attention.head_count_kv") == 8,
   "qwen3 heads")
ok(field(r3, "qwen3.embedding_length") == 1024 and field(r3, "qwen3.feed_forward_length") == 3072,
   "qwen3 widths")
ok(list(t3["blk.0.attn_q.weight"].shape) == [1024, 2048], "qwen3 attn_q 1024 -> 16*128")
ok(list(t3["blk.0.attn_k.weight"].shape) == [1024, 1024], "qwen3 attn_k 1024 -> 8*128")
ok(list(t3["blk.0.attn_output.weight"].shape) == [2048, 1024], "qwen3 attn_output")
ok(list(t3["blk.1.attn_q_norm.weight"].shape) == [128], "qwen3 q_norm")
ok(list(t3["blk.1.attn_k_norm.weight"].shape) == [128], "qwen3 k_norm")
ok("blk.0.attn_q.bias" not in t3 and "output.weight" not in t3, "qwen3: no biases, tied")
ok(t3["blk.0.attn_q.weight"].tensor_type == Q.Q8_0, "q8_0 weights")

pl = path("smollm.gguf")
run("synth", "--preset", "smollm2-135m", "--layers", "1", "-o", pl)
rl = gguf.GGUFReader(pl)
tl = tensors(rl)
ok(field(rl, "general.architecture") == "llama", "llama arch")
ok(field(rl, "llama.context_length") == 8192 and abs(field(rl, "llama.rope.freq_base") - 1e5) < 1,
   "smollm2 ctx / theta")
ok(field(rl, "llama.rope.dimension_count") == 64 and field(rl, "llama.vocab_size") == 49152,
   "llama rope dims / vocab_size")
ok(field(rl, "tokenizer.ggml.pre") == "smollm", "smollm pre-tokenizer")
ok(len(field(rl, "tokenizer.ggml.tokens")) == 49152, "smollm2 vocab exact")
ok(list(tl["token_embd.weight"].shape) == [576, 49152], "smollm2 embedding")
ok(list(tl["blk.0.attn_k.weight"].shape) == [576, 192], "smollm2 attn_k 576 -> 3*64")
ok(list(tl["blk.0.ffn_gate.weight"].shape) == [576, 1536], "smollm2 ffn_gate")
ok("blk.0.attn_q.bias" not in tl and "blk.0.attn_q_norm.weight" not in tl, "llama: plain attention")

p7 = path("q7.gguf")
run("synth", "--preset", "qwen2-7b", "--layers", "1", "--vocab", "512", "--ff", "512", "-o", p7)
t7 = tensors(gguf.GGUFReader(p7))
ok(list(t7["output.weight"].shape) == [3584, 512], "qwen2-7b untied output")
ok(list(t7["blk.0.attn_k.weight"].shape) == [3584, 512], "qwen2-7b 4 kv heads of 128")

# ---- 9. --fast: same tensors, types and sizes as the full synth; the first
# 512 rows of a tensor are genuine draws, the rest repeat them ----
fa, fb = path("fast_a.gguf"), path("fast_b.gguf")
fshape = ["--arch", "qwen2", "--dim", "256", "--heads", "4", "--ff", "1024", "--vocab", "2000",
          "--layers", "1", "--type", "q4_K", "--seed", "5"]
run("synth", *fshape, "--fast", "-o", fa)
run("synth", *fshape, "-o", fb)
tfa, tfb = tensors(gguf.GGUFReader(fa)), tensors(gguf.GGUFReader(fb))
ok(sorted(tfa) == sorted(tfb), "--fast: same tensor names")
ok(all(tfa[k].tensor_type == tfb[k].tensor_type and list(tfa[k].shape) == list(tfb[k].shape)
       for k in tfa), "--fast: same types and shapes")
emb = as_float(tfa["token_embd.weight"])  # 2000 rows of 256: past the 512-row pool
ref_rows = as_float(tfb["token_embd.weight"])
ok(np.isfinite(emb).all() and abs(emb.std() / ref_rows.std() - 1) < 0.05,
   f"--fast: finite, same spread as the full draw ({emb.std():.4f} vs {ref_rows.std():.4f})")
uniq = len({emb[i].tobytes() for i in range(emb.shape[0])})
ok(uniq == 512, f"--fast: the rows repeat a pool of 512 distinct rows ({uniq})")
ok(sha(fa) != sha(fb), "--fast differs from the full draw")

for f in (src, small, dst, d2, d8, dp, w0, w1, a, b, c, p3, pl, p7, fa, fb):
    os.remove(f)
print(f"test_tools_synth_quant: {checks} checks passed")
