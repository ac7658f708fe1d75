"""The float64 reference and the engine on the real SmolLM2-135M (Q4_1, llama).

1. Reference sanity: the reference's greedy continuation of "The capital of
   France is" (tokenized independently of minfer, tests/ref/gguf_tok.py) is
   English that mentions Paris. This pins the llama semantics (NORMAL rope,
   GQA 9/3, tied output, eps/theta from the file) on a trained model, where a
   wrong convention gives gibberish.
2. Engine vs reference on three sequences (that prompt, an English paragraph,
   the prompt + 35 random tokens), each prefilled with logits_all plus 3
   greedy decode steps (tests/tools/dump_logits). Through 30 layers the 8-bit
   activation rounding of the CPU path is chaotic: one rounding that flips
   moves a position's logits by several %, so per-position bounds must be
   loose. The bounds are calibrated against ref_forward.simulate (the
   reference with the CPU's activation rounding modelled), which shows what
   that rounding alone costs (measured: mean KL 0.0027-0.0058, worst rel_l2
   0.21, top-1 86-100 %). The engine must satisfy:
     mean KL(p_ref || p_eng) over all positions <= max(2 x the simulation's, 0.002)
     and <= 0.02
     max KL <= 0.1 per position;  max rel_l2 <= 0.4;  median rel_l2 <= 0.1
     a top-1 disagreement only where the reference's logit gap between its
     top-1 and the engine's pick is <= 0.5 (measured gaps <= 0.18)
   and its own greedy continuation of the prompt starts with " Paris".
Measured values are in tests/ref/README.md.
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
import gguf_tok  # noqa: E402
import ref_forward  # noqa: E402

MODEL = os.environ.get("MINFER_MODEL",
                       os.path.join(HERE, "..", "..", "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
BUILD = os.environ.get("MINFER_BUILD", os.path.join(HERE, "..", "..", "build"))
TMP = os.environ.get("MINFER_TMP") or tempfile.mkdtemp()
DUMP = os.path.join(BUILD, "tests", "dump_logits")

TEXT = ("The quick brown fox jumps over the lazy dog. In 1969, Neil Armstrong became the "
        "first person to walk on the Moon. Python is a programming language that")


def log_softmax(x):
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def kl(ref, other):
    lr, lo = log_softmax(ref), log_softmax(other)
    return (np.exp(lr) * (lr - lo)).sum(axis=1)


def rel_l2(a, ref):
    return np.linalg.norm(a - ref, axis=1) / np.linalg.norm(ref, axis=1)


def main():
    fails = []
    os.makedirs(TMP, exist_ok=True)
    m = ref_forward.load(MODEL)
    tk = gguf_tok.from_gguf(MODEL)
    prompt = tk.encode("The capital of France is").ids
    out = ref_forward.greedy(m, prompt, 6)
    text = tk.decode(out[len(prompt):])
    ok = "Paris" in text
    print(f"{'ok  ' if ok else 'FAIL'} reference greedy: 'The capital of France is' -> {text!r}")
    if not ok:
        fails.append("reference continuation does not mention Paris")

    if not os.path.exists(DUMP):
        fails.append(f"{DUMP} not built")
        seqs = []
    else:
        rng = np.random.default_rng(7)
        seqs = [prompt, tk.encode(TEXT).ids, prompt + rng.integers(0, m.n_vocab, size=35).tolist()]
    kl_eng, kl_sim = [], []
    for si, toks in enumerate(seqs):
        dump = os.path.join(TMP, "fwd_real_dump")
        cmd = [DUMP, MODEL, "--tokens", ",".join(map(str, toks)), "--decode", "3",
               "--threads", "2", "--out", dump]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            fails.append(f"dump_logits failed ({r.returncode}): {r.stderr.strip()}")
            break
        with open(dump + ".json") as f:
            head = json.load(f)
        L = np.fromfile(head["bin"], dtype="<f4").reshape(head["n_rows"], head["n_vocab"])
        L = L.astype(np.float64)
        R = ref_forward.logits(ref_forward.simulate(m, False), head["tokens"])
        S = ref_forward.logits(ref_forward.simulate(m, act=True), head["tokens"])
        ref_forward.simulate(m, False)
        if not np.all(np.isfinite(L)):
            fails.append(f"seq {si}: non-finite logits")
            continue
        e, es = rel_l2(L, R), rel_l2(S, R)
        k, ks = kl(R, L), kl(R, S)
        te, tr = L.argmax(axis=1), R.argmax(axis=1)
        gaps = [R[i, tr[i]] - R[i, te[i]] for i in np.nonzero(te != tr)[0]]
        print(f"seq {si} ({len(toks)} tokens + 3): engine rel_l2 max {e.max():.3f} median "
              f"{np.median(e):.4f}, KL max {k.max():.4f} mean {k.mean():.5f}, top-1 "
              f"{np.mean(te == tr):.3f} (gaps {', '.join(f'{g:.3f}' for g in gaps) or '-'})")
        print(f"      simulated 8-bit rounding: rel_l2 max {es.max():.3f} median "
              f"{np.median(es):.4f}, KL max {ks.max():.4f} mean {ks.mean():.5f}")
        kl_eng.extend(k)
        kl_sim.extend(ks)
        if k.max() > 0.1:
            fails.append(f"seq {si}: max KL {k.max():.4f} > 0.1 at position {k.argmax()}")
        if e.max() > 0.4 or np.median(e) > 0.1:
            fails.append(f"seq {si}: rel_l2 max {e.max():.3f} (> 0.4?) median {np.median(e):.4f} (> 0.1?)")
        if gaps and max(gaps) > 0.5:
            fails.append(f"seq {si}: top-1 differs where the reference's gap is {max(gaps):.3f} > 0.5")
        if si == 0:
            gen = tk.decode(head["tokens"][len(prompt):])
            print(f"      engine greedy (3 steps): {gen!r} [{head.get('backend', '')}]")
            if not gen.startswith(" Paris"):
                fails.append(f"engine continuation {gen!r} does not start with ' Paris'")
    if kl_eng:
        # pooled over all positions: a short sequence's mean is too noisy alone
        lim = min(max(2 * np.mean(kl_sim), 0.002), 0.02)
        print(f"mean KL over {len(kl_eng)} positions: engine {np.mean(kl_eng):.5f}, simulated "
              f"rounding {np.mean(kl_sim):.5f}, bound {lim:.5f}")
        if np.mean(kl_eng) > lim:
            fails.append(f"mean KL {np.mean(kl_eng):.5f} > {lim:.5f}")
    if fails:
        print("FAILED:\n  " + "\n  ".join(fails[:10]))
        return 1
    print("real-model forward checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
