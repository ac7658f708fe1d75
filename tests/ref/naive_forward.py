"""A second, deliberately different float64 forward pass, to check ref_forward.

ref_forward runs the whole sequence at once (matrices, einsum, a causal mask).
This one decodes one token at a time with an explicit KV cache, loops over
heads, cache positions and rotation pairs, and builds every rotation with
math.cos/math.sin. It shares nothing with ref_forward but the weight loading
(ref_forward.load), so agreement of the two checks the vectorized math
(masking, GQA mapping, RoPE pairing, norms, biases, tied output).

Slow: only for tiny models.
"""

import math

import numpy as np


def _rms(x, w, eps):
    ss = 0.0
    for v in x:
        ss += float(v) * float(v)
    return np.array([x[i] / math.sqrt(ss / len(x) + eps) * w[i] for i in range(len(x))])


def _rot(vec, p, m):
    out = vec.copy()
    half = m.n_rot // 2
    for i in range(half):
        if m.rope_neox:
            a, b = i, i + half
        else:
            a, b = 2 * i, 2 * i + 1
        ang = p * m.freq_scale * math.pow(m.theta, -2.0 * i / m.n_rot)
        c, s = math.cos(ang), math.sin(ang)
        out[a] = vec[a] * c - vec[b] * s
        out[b] = vec[a] * s + vec[b] * c
    return out


def _mv(m, name, x, bias=None):
    W = m.W(name)
    y = np.array([np.dot(W[o], x) for o in range(W.shape[0])])
    if bias is not None and m.has(bias):
        y = y + m.W(bias)
    return y


def logits(m, tokens):
    """Same contract as ref_forward.logits, computed incrementally."""
    hd = m.head_dim
    group = m.n_head // m.n_head_kv
    kc = [[] for _ in range(m.n_layer)]  # per layer: list over positions of [Hkv, hd]
    vc = [[] for _ in range(m.n_layer)]
    rows = []
    for p, tok in enumerate(tokens):
        x = m.W("token_embd.weight")[tok].copy()
        for il in range(m.n_layer):
            b = f"blk.{il}."
            n1 = _rms(x, m.W(b + "attn_norm.weight"), m.eps)
            q = _mv(m, b + "attn_q.weight", n1, b + "attn_q.bias")
            k = _mv(m, b + "attn_k.weight", n1, b + "attn_k.bias")
            v = _mv(m, b + "attn_v.weight", n1, b + "attn_v.bias")
            qs = [q[h * hd:(h + 1) * hd] for h in range(m.n_head)]
            ks = [k[h * hd:(h + 1) * hd] for h in range(m.n_head_kv)]
            vs = [v[h * hd:(h + 1) * hd] for h in range(m.n_head_kv)]
            if m.has(b + "attn_q_norm.weight"):
                qs = [_rms(t, m.W(b + "attn_q_norm.weight"), m.eps) for t in qs]
                ks = [_rms(t, m.W(b + "attn_k_norm.weight"), m.eps) for t in ks]
            qs = [_rot(t, p, m) for t in qs]
            ks = [_rot(t, p, m) for t in ks]
            kc[il].append(ks)
            vc[il].append(vs)
            att = np.zeros(m.n_head * hd)
            for h in range(m.n_head):
                kvh = h // group
                sc = [float(np.dot(qs[h], kc[il][s][kvh])) / math.sqrt(hd) for s in range(p + 1)]
                mx = max(sc)
                e = [math.exp(s_ - mx) for s_ in sc]
                tot = sum(e)
                acc = np.zeros(hd)
                for s in range(p + 1):
                    acc += (e[s] / tot) * vc[il][s][kvh]
                att[h * hd:(h + 1) * hd] = acc
            x = x + _mv(m, b + "attn_output.weight", att)
            n2 = _rms(x, m.W(b + "ffn_norm.weight"), m.eps)
            g = _mv(m, b + "ffn_gate.weight", n2)
            u = _mv(m, b + "ffn_up.weight", n2)
            act = np.array([g[i] / (1.0 + math.exp(-g[i])) * u[i] for i in range(len(g))])
            x = x + _mv(m, b + "ffn_down.weight", act)
        xn = _rms(x, m.W("output_norm.weight"), m.eps)
        rows.append(_mv(m, "token_embd.weight" if m.tied else "output.weight", xn))
    return np.array(rows)
