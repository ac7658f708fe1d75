"""Float64 reference forward pass for minfer (llama, qwen2, qwen3).

Reads a GGUF with gguf.GGUFReader, dequantizes every tensor with
gguf.quants.dequantize and does all arithmetic in float64, following
/work/briefs/semantics.md (the contract every engine path agrees on):

    h   = x + Wo attn(rope(Wq n1(x) [+bq]), rope(Wk n1(x) [+bk]), Wv n1(x) [+bv])
    out = h + Wdown (silu(Wgate n2(h)) * Wup n2(h))
    logits = Wout rmsnorm(x, output_norm)      (Wout = token_embd when tied)

API:
    model = load(path)                 # dict-like Model
    L = logits(model, tokens)          # [n_tokens, n_vocab] float64, positions 0..n-1

The dequantized values are exact in float32 (the block formats hold f16
scales and small integers), so large models keep weights as float32 and
widen each one to float64 at its use: the arithmetic is the same float64
arithmetic either way, only the resident memory differs.
"""

import math
import sys

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover - the venv has it
    sys.exit("ref_forward: the 'gguf' python package is required")

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3")
# Weights above this many parameters stay float32 at rest (see module doc).
F64_RESIDENT_MAX_PARAMS = 60_000_000


class Model:
    """Hyperparameters (attributes) and dequantized weights (self.w[name])."""

    def __init__(self):
        self.w = {}
        self.types = {}  # name -> gguf.GGMLQuantizationType
        # Engine-numerics simulation (off by default, see simulate()):
        self.sim_act = False   # round matmul inputs to 8 bits like the CPU
        self.sim_kv = None     # None, "f16" or "q8_0": round cached K/V

    def W(self, name):
        """The tensor as float64 (n_out rows of n_in for a matrix)."""
        t = self.w[name]
        return t if t.dtype == np.float64 else t.astype(np.float64)

    def has(self, name):
        return name in self.w


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


def load(path):
    """Reads the GGUF at path: hyperparameters and every tensor dequantized.

    Raises ValueError for an architecture or feature the reference does not
    implement (it never guesses)."""
    r = gguf.GGUFReader(path)
    m = Model()
    arch = _field(r, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"ref_forward: architecture {arch!r} not supported")
    m.arch = arch
    a = arch + "."

    def need(key):
        v = _field(r, a + key)
        if v is None:
            raise ValueError(f"ref_forward: '{path}' lacks {a + key}")
        return v

    m.n_embd = int(need("embedding_length"))
    m.n_layer = int(need("block_count"))
    m.n_ff = int(need("feed_forward_length"))
    m.n_head = int(need("attention.head_count"))
    m.n_head_kv = int(_field(r, a + "attention.head_count_kv", m.n_head))
    m.head_dim = int(_field(r, a + "attention.key_length", m.n_embd // m.n_head))
    m.head_dim_v = int(_field(r, a + "attention.value_length", m.head_dim))
    if m.head_dim_v != m.head_dim:
        raise ValueError("ref_forward: value_length != key_length not supported")
    m.eps = float(need("attention.layer_norm_rms_epsilon"))
    m.theta = float(_field(r, a + "rope.freq_base", 10000.0))
    m.n_rot = int(_field(r, a + "rope.dimension_count", m.head_dim))
    scaling = _field(r, a + "rope.scaling.type", "none")
    m.freq_scale = 1.0
    if scaling == "linear":
        m.freq_scale = 1.0 / float(_field(r, a + "rope.scaling.factor", 1.0))
    elif scaling not in ("none", None):
        raise ValueError(f"ref_forward: rope scaling {scaling!r} not supported")
    m.n_ctx_train = int(_field(r, a + "context_length", 0))
    # NORMAL rotates adjacent pairs (llama GGUFs have Q/K pre-permuted);
    # NEOX rotates (i, i + n_rot/2).
    m.rope_neox = arch in ("qwen2", "qwen3")

    if m.n_head % m.n_head_kv != 0:
        raise ValueError(f"ref_forward: n_head {m.n_head} % n_head_kv {m.n_head_kv} != 0")

    n_params = sum(int(np.prod(t.shape)) for t in r.tensors)
    keep64 = n_params <= F64_RESIDENT_MAX_PARAMS
    for t in r.tensors:
        if t.name == "rope_freqs.weight":
            raise ValueError("ref_forward: rope_freqs (llama3 rope scaling) not supported")
        d = gguf.quants.dequantize(t.data, t.tensor_type)
        # numpy shape is ne reversed: a matrix is [n_out, n_in].
        shape = tuple(int(x) for x in reversed(t.shape))
        d = np.asarray(d).reshape(shape)
        m.w[t.name] = d.astype(np.float64 if keep64 else np.float32)
        m.types[t.name] = gguf.GGMLQuantizationType(t.tensor_type)
    m.n_vocab = m.w["token_embd.weight"].shape[0]
    m.tied = "output.weight" not in m.w
    return m


# ---- ops -------------------------------------------------------------------------

def rmsnorm(x, w, eps):
    """x [..., n] / sqrt(mean(x^2) + eps) * w [n]."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, m):
    """Rotates x [T, H, head_dim] at positions pos [T]; dims >= n_rot pass."""
    half = m.n_rot // 2
    inv = np.power(m.theta, -2.0 * np.arange(half, dtype=np.float64) / m.n_rot)
    ang = pos.astype(np.float64)[:, None] * m.freq_scale * inv[None, :]  # [T, half]
    c = np.cos(ang)[:, None, :]
    s = np.sin(ang)[:, None, :]
    y = x.copy()
    if m.rope_neox:
        x0 = x[..., :half]
        x1 = x[..., half:m.n_rot]
        y[..., :half] = x0 * c - x1 * s
        y[..., half:m.n_rot] = x0 * s + x1 * c
    else:
        x0 = x[..., 0:m.n_rot:2]
        x1 = x[..., 1:m.n_rot:2]
        y[..., 0:m.n_rot:2] = x0 * c - x1 * s
        y[..., 1:m.n_rot:2] = x0 * s + x1 * c
    return y


# ---- engine-numerics simulation ---------------------------------------------------
#
# Not the reference: a model of the rounding the CPU path is allowed to do, so a
# test can tell "error of the expected size and shape" from a bug. With it on,
# every matmul input is rounded the way the CPU quantizes activations for that
# weight type (Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for K-quants;
# f32/f16/bf16 weights see the f32 activations), and K (after RoPE) and V are
# rounded to the KV cache type. Ties of the rounding may go the other way than
# the engine's, so agreement is close, not bit-exact.

_Q = gguf.GGMLQuantizationType
_ACT_Q8_0 = {_Q.Q4_0, _Q.Q5_0, _Q.Q8_0}
_ACT_Q8_1 = {_Q.Q4_1, _Q.Q5_1}
_ACT_Q8_K = {_Q.Q2_K, _Q.Q3_K, _Q.Q4_K, _Q.Q5_K, _Q.Q6_K}


def _round_q8_blocks(x, bs, f16_scale):
    """Rounds rows of x to signed 8-bit blocks of bs with scale amax/127."""
    shp = x.shape
    xb = x.reshape(-1, bs)
    amax = np.abs(xb).max(axis=1, keepdims=True)
    d = amax / 127.0
    if f16_scale:
        d = d.astype(np.float16).astype(np.float64)
    inv = np.divide(1.0, amax / 127.0, out=np.zeros_like(amax), where=amax > 0)
    q = np.clip(np.round(xb * inv), -127, 127)
    return (q * d).reshape(shp)


def _round_q8_k(x):
    """Q8_K: blocks of 256, scale from the signed extreme (-127/max), f32 scale."""
    shp = x.shape
    xb = x.reshape(-1, 256)
    idx = np.abs(xb).argmax(axis=1)
    mx = xb[np.arange(xb.shape[0]), idx][:, None]
    iscale = np.divide(-127.0, mx, out=np.zeros_like(mx), where=mx != 0)
    iscale = iscale.astype(np.float32).astype(np.float64)
    q = np.minimum(127, np.round(xb * iscale))
    d = np.divide(1.0, iscale, out=np.zeros_like(iscale), where=iscale != 0)
    d = d.astype(np.float32).astype(np.float64)
    return (q * d).reshape(shp)


def _sim_act(m, x, name):
    t = m.types.get(name)
    n_in = x.shape[-1]
    if t in _ACT_Q8_0 or t in _ACT_Q8_1:
        return _round_q8_blocks(x, 32, True) if n_in % 32 == 0 else x
    if t in _ACT_Q8_K:
        return _round_q8_k(x) if n_in % 256 == 0 else x
    return x


def _sim_cache(m, x):
    """Rounds K or V [T, Hkv, hd] to the simulated cache type."""
    if m.sim_kv == "f16":
        return x.astype(np.float16).astype(np.float64)
    if m.sim_kv == "q8_0":
        T = x.shape[0]
        return _round_q8_blocks(x.reshape(T, -1), 32, True).reshape(x.shape)
    return x


def simulate(m, act=True, kv=None):
    """Turns the engine-numerics simulation on (act: 8-bit matmul inputs; kv:
    None/"f16"/"q8_0") for later logits() calls; simulate(m, False) is exact."""
    m.sim_act, m.sim_kv = act, kv
    return m


def linear(m, x, name, bias=None):
    if m.sim_act:
        x = _sim_act(m, x, name)
    y = x @ m.W(name).T
    if bias is not None and m.has(bias):
        y = y + m.W(bias)
    return y


def attention(q, k, v, m):
    """Causal GQA attention: q [T, H, hd], k/v [T, Hkv, hd] -> [T, H*hd]."""
    T = q.shape[0]
    group = m.n_head // m.n_head_kv
    # query head h reads kv head h // group
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    s = np.einsum("thd,shd->hts", q, k) / math.sqrt(m.head_dim)
    mask = np.triu(np.ones((T, T), dtype=bool), k=1)  # s > t
    s = np.where(mask[None], -np.inf, s)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    o = np.einsum("hts,shd->thd", p, v)
    return o.reshape(T, m.n_head * m.head_dim)


def silu(x):
    return x / (1.0 + np.exp(-x))


def hidden(m, tokens):
    """Final hidden state before output_norm: [T, n_embd] float64."""
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.ndim != 1 or len(tokens) == 0:
        raise ValueError("ref_forward: tokens must be a non-empty 1-D sequence")
    if tokens.min() < 0 or tokens.max() >= m.n_vocab:
        raise ValueError(f"ref_forward: token out of range [0, {m.n_vocab})")
    T = len(tokens)
    pos = np.arange(T)
    x = m.W("token_embd.weight")[tokens] if m.w["token_embd.weight"].dtype == np.float64 \
        else m.w["token_embd.weight"][tokens].astype(np.float64)
    hd = m.head_dim
    for il in range(m.n_layer):
        b = f"blk.{il}."
        n1 = rmsnorm(x, m.W(b + "attn_norm.weight"), m.eps)
        q = linear(m, n1, b + "attn_q.weight", b + "attn_q.bias").reshape(T, m.n_head, hd)
        k = linear(m, n1, b + "attn_k.weight", b + "attn_k.bias").reshape(T, m.n_head_kv, hd)
        v = linear(m, n1, b + "attn_v.weight", b + "attn_v.bias").reshape(T, m.n_head_kv, hd)
        if m.has(b + "attn_q_norm.weight"):
            q = rmsnorm(q, m.W(b + "attn_q_norm.weight"), m.eps)
        if m.has(b + "attn_k_norm.weight"):
            k = rmsnorm(k, m.W(b + "attn_k_norm.weight"), m.eps)
        q = rope(q, pos, m)
        k = rope(k, pos, m)
        if m.sim_kv:
            k, v = _sim_cache(m, k), _sim_cache(m, v)
        a = attention(q, k, v, m)
        x = x + linear(m, a, b + "attn_output.weight")
        n2 = rmsnorm(x, m.W(b + "ffn_norm.weight"), m.eps)
        g = linear(m, n2, b + "ffn_gate.weight")
        u = linear(m, n2, b + "ffn_up.weight")
        x = x + linear(m, silu(g) * u, b + "ffn_down.weight")
    return x


def logits(m, tokens):
    """Full causal pass over tokens (positions 0..n-1): [n, n_vocab] float64."""
    x = hidden(m, tokens)
    x = rmsnorm(x, m.W("output_norm.weight"), m.eps)
    return linear(m, x, "token_embd.weight" if m.tied else "output.weight")


def greedy(m, tokens, n):
    """Appends n greedy tokens (argmax of a full recomputation each step)."""
    toks = list(tokens)
    for _ in range(n):
        toks.append(int(np.argmax(logits(m, toks)[-1])))
    return toks


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="float64 reference logits of a GGUF model")
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--decode", type=int, default=0, help="greedy steps to append")
    args = ap.parse_args()
    mdl = load(args.model)
    toks = [int(t) for t in args.tokens.split(",") if t]
    toks = greedy(mdl, toks, args.decode)
    L = logits(mdl, toks)
    print("tokens:", toks)
    for i, row in enumerate(L):
        top = np.argsort(-row)[:5]
        print(f"pos {i}: top5 {top.tolist()} max {row.max():.5f} mean {row.mean():.5f}")
