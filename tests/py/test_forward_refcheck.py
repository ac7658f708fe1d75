"""Checks the float64 reference (tests/ref/ref_forward.py) on its own.

The engine tests trust ref_forward, so it is checked here against
tests/ref/naive_forward.py, an independent token-by-token implementation
with an explicit KV cache and loops (see its docstring), on tiny models
written by gguf.GGUFWriter (tests/ref/make_gguf.py, not by minfer):
llama (NORMAL rope), qwen2 (biases, NEOX), qwen3 (q/k norm, explicit head_dim
!= dim/heads), untied output, partial rotary dims, linear rope scaling, and a
Q8_0-quantized file. Agreement: max|diff| <= 1e-9 * max|logit|.

It also checks the two properties a mistake in the shared parts (loading,
masking) would break and the naive pass could share: causality (logits of a
prefix do not depend on later tokens) and that NORMAL vs NEOX pairing really
changes the result (so the test can tell the modes apart).
"""

import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
import gguf  # noqa: E402
import make_gguf  # noqa: E402
import naive_forward  # noqa: E402
import ref_forward  # noqa: E402

CASES = [
    dict(arch="llama"),
    dict(arch="qwen2"),
    dict(arch="qwen3", head_dim=24),
    dict(arch="llama", tied=False, kv_heads=1),
    dict(arch="qwen2", n_rot=8, rope_scale=4.0),
    dict(arch="qwen3", head_dim=32, kv_heads=4, qtype=gguf.GGMLQuantizationType.Q8_0),
]


def main():
    tmp = os.environ.get("MINFER_TMP") or tempfile.mkdtemp()
    os.makedirs(tmp, exist_ok=True)
    rng = np.random.default_rng(1234)
    fails = 0
    for i, c in enumerate(CASES):
        path = os.path.join(tmp, f"refcheck_{i}.gguf")
        make_gguf.write(path, seed=100 + i, **c)
        m = ref_forward.load(path)
        toks = rng.integers(0, m.n_vocab, size=9).tolist()
        a = ref_forward.logits(m, toks)
        b = naive_forward.logits(m, toks)
        scale = np.abs(b).max()
        err = np.abs(a - b).max()
        ok = a.shape == (9, m.n_vocab) and err <= 1e-9 * scale and np.std(a[-1]) > 1e-3
        # causality: a prefix's logits are the full sequence's first rows
        pre = ref_forward.logits(m, toks[:4])
        caus = np.abs(pre - a[:4]).max() <= 1e-12 * scale
        # the later positions do depend on earlier tokens
        toks2 = list(toks)
        toks2[0] = (toks2[0] + 1) % m.n_vocab
        dep = np.abs(ref_forward.logits(m, toks2)[-1] - a[-1]).max() > 1e-6 * scale
        # pairing mode matters: flipping it must change later positions
        m.rope_neox = not m.rope_neox
        flip = np.abs(ref_forward.logits(m, toks)[-1] - a[-1]).max() > 1e-6 * scale
        m.rope_neox = not m.rope_neox
        good = ok and caus and dep and flip
        fails += not good
        print(f"{'ok  ' if good else 'FAIL'} refcheck {c}: max|ref-naive| {err:.2e} "
              f"(scale {scale:.2f}) causal={caus} depends={dep} mode-sensitive={flip}")
    if fails:
        print(f"FAILED: {fails} of {len(CASES)} cases")
        return 1
    print(f"all {len(CASES)} reference self-checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
