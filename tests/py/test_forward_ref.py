"""End-to-end forward-pass correctness: minfer's logits vs the float64 reference.

For each architecture (llama, qwen2, qwen3) and weight type (F32, F16, Q8_0,
Q4_0, Q4_K, Q6_K) a small model is synthesized with `minfer synth --pure` (d
256, 2 layers, ff 512, 4 heads, 2 kv heads, vocab 512; qwen3 with an explicit
head_dim 64), plus real widths, 2 layers: qwen2 d 896 (14 heads, 2 kv, ff
4864) in F32/Q8_0/Q4_0 (K-quants need rows % 256 == 0, and 896 is not), qwen3
d 1024 (16 heads, 8 kv, head_dim 128, ff 3072) in Q4_K, llama d 576 (9 heads,
3 kv, ff 1536) in Q8_0. For prompts of 1, 7 and 64 random tokens the engine (tests/tools/
dump_logits: prefill with logits_all, then 3 greedy decode steps) and the
reference (tests/ref/ref_forward.py, on the exact token sequence the engine
produced) give every position's logits, and they are compared per position.

The reference reads the same quantized weights (dequantized exactly), so
weight quantization error is NOT part of the difference. What remains is the
engine's own arithmetic: f32 accumulation, f16 conversions and, on the CPU,
activations quantized to 8 bits per matmul (Q8_0 / Q8_K) for quantized
weights. The bounds (BOUNDS and MEAN_VS_SIM, documented with measured values in
tests/ref/README.md) were set from measured errors with margin:
  rel_max = max|l - r| / max|r|   per position  (F32 weights: <= 1e-3)
  rel_l2  = ||l - r|| / ||r||     per position  (every other case)
  mean rel_l2 per quantized group <= 1.5 x that of ref_forward.simulate (the
  reference with the CPU's 8-bit activation rounding modelled): catches a
  systematic error hiding under the per-position bounds.
  top-1: the engine's argmax equals the reference's at >= 99 % of the
  positions of each group (the positions of one weight type over all archs),
  a position whose exact reference has a top-2 margin below 2 x bound x
  max|r| is a "near-tie" (the 8-bit activation rounding may flip it; reported,
  not failed); and, strictly, the engine's top-1 equals that of the reference
  with the 8-bit activation rounding modelled (ref_forward.simulate) at >= 99 %
  of ALL positions of each quantized group.
Variants on one model each: KV cache f16 / q8_0 (also vs the reference with
the same K/V rounding simulated), --backends ref,cpu (F32 and Q4_0: the ref
backend computes in float), a 64-token prompt prefilled in 16-token chunks
(batches at n_past > 0). Also checked: each decode token is the argmax of the
engine's previous row.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
import gguf  # noqa: E402
import ref_forward  # noqa: E402

BIN = os.environ.get("MINFER_BIN", "minfer")
BUILD = os.environ.get("MINFER_BUILD", os.path.join(HERE, "..", "..", "build"))
TMP = os.environ.get("MINFER_TMP") or tempfile.mkdtemp()
DUMP = os.path.join(BUILD, "tests", "dump_logits")
THREADS = "2"

PROMPT_LENS = (1, 7, 64)
N_DECODE = 3

# Per-position bounds: ("max", x) bounds rel_max, ("l2", x) bounds rel_l2.
# Measured values and reasons are in tests/ref/README.md.
BOUNDS = {
    "f32": ("max", 1e-3),          # measured 2.8e-7
    "f16": ("l2", 3e-3),           # measured 2.2e-7 (f32 activations); room for f16 ones
    "q8_0": ("l2", 3e-2),          # measured 9.7e-3  (Q8_0 activations)
    "q4_0": ("l2", 3e-2),          # measured 1.0e-2  (Q8_0 activations)
    "q4_K": ("l2", 4e-2),          # measured 1.45e-2 (Q8_K activations)
    "q6_K": ("l2", 4e-2),          # measured 1.43e-2 (Q8_K activations)
    "cache-f16": ("l2", 2e-3),     # measured 1.6e-4
    "cache-q8_0": ("l2", 1.5e-2),  # measured 4.1e-3
    "ref-backend": ("max", 1e-3),  # measured 1.3e-7 (float math even on q4_0)
    # vs the reference with the same K/V rounding simulated (ref_forward.simulate)
    "sim-cache-f16": ("l2", 1e-3),   # measured 2.4e-5
    "sim-cache-q8_0": ("l2", 1e-3),  # measured 2.2e-7
}

# Worst-position bounds above leave room for rounding flips; a systematic error
# (e.g. a 1 % scale slip in the activation quantizer: worst 2.3e-2, within
# them) shows in the mean instead. Per group, the mean rel_l2 must stay within
# this factor of the mean rel_l2 of ref_forward.simulate(act=True), the exact
# reference with the CPU's 8-bit activation rounding modelled (measured ratio
# 0.98-1.02; the 1 % slip gives 2.5).
MEAN_VS_SIM = {"q8_0": 1.5, "q4_0": 1.5, "q4_K": 1.5, "q6_K": 1.5}

SMALL = ["--dim", "256", "--layers", "2", "--ff", "512", "--heads", "4", "--kv-heads", "2",
         "--vocab", "512"]
WIDE = ["--dim", "896", "--layers", "2", "--ff", "4864", "--heads", "14", "--kv-heads", "2",
        "--vocab", "512"]
# qwen3-0.6b (head_dim 128) and smollm2-135m widths: d 1024 takes K-quants, d 576 not.
WIDE_QWEN3 = ["--dim", "1024", "--layers", "2", "--ff", "3072", "--heads", "16", "--kv-heads",
              "8", "--vocab", "512"]
WIDE_LLAMA = ["--dim", "576", "--layers", "2", "--ff", "1536", "--heads", "9", "--kv-heads", "3",
              "--vocab", "512"]


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def synth(arch, wtype, seed, shape, tag, head_dim=64):
    """Synthesizes a model (cached by name in TMP); returns its path."""
    path = os.path.join(TMP, f"fwd_{tag}_{arch}_{wtype}.gguf")
    if os.path.exists(path):
        return path
    extra = list(shape)
    if arch == "qwen3":
        extra += ["--head-dim", str(head_dim)]
    cmd = [BIN, "synth", "--arch", arch] + extra + ["--type", wtype, "--seed", str(seed),
                                                   "-o", path]
    # --pure keeps every 2-D weight at the named type (no q6_K output rule),
    # so each type is exercised everywhere.
    r = run(cmd + ["--pure"])
    if r.returncode != 0:
        raise RuntimeError(f"synth failed ({r.returncode}): {' '.join(cmd)} --pure\n{r.stderr}")
    return path


def engine(model, tokens, *flags):
    """Runs dump_logits; returns (tokens incl. generated, logits [R, V] float64)."""
    out = os.path.join(TMP, "fwd_dump")
    cmd = [DUMP, model, "--tokens", ",".join(map(str, tokens)), "--decode", str(N_DECODE),
           "--threads", THREADS, "--out", out] + list(flags)
    r = run(cmd)
    if r.returncode != 0:
        raise RuntimeError(f"dump_logits failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr}")
    with open(out + ".json") as f:
        head = json.load(f)
    L = np.fromfile(head["bin"], dtype="<f4").reshape(head["n_rows"], head["n_vocab"])
    return head["tokens"], L.astype(np.float64), head.get("backend", "")


def types_of(path):
    r = gguf.GGUFReader(path)
    return sorted({t.tensor_type.name for t in r.tensors if len(t.shape) == 2})


class Group:
    """Positions of one tolerance group, for the top-1 rule and the summary."""

    def __init__(self, name):
        self.name, self.n, self.mism, self.ties = name, 0, 0, 0
        self.worst_max = self.worst_l2 = 0.0
        self.sum_l2 = 0.0
        self.sum_sim, self.n_sim = 0.0, 0  # simulated rounding vs exact (MEAN_VS_SIM)
        self.sim_mism = 0  # engine top-1 != simulated-rounding top-1, every position


GROUPS = {}
FAILS = []


def compare(label, gkey, eng, ref, count_top1=True):
    """Checks every row of eng against ref under BOUNDS[gkey]; returns a summary."""
    kind, tol = BOUNDS[gkey]
    g = GROUPS.setdefault(gkey, Group(gkey))
    bad = []
    w_max = w_l2 = 0.0
    for i in range(ref.shape[0]):
        l, r = eng[i], ref[i]
        if not np.all(np.isfinite(l)):
            bad.append(f"pos {i}: non-finite logits")
            continue
        rel_max = np.abs(l - r).max() / np.abs(r).max()
        rel_l2 = np.linalg.norm(l - r) / np.linalg.norm(r)
        w_max, w_l2 = max(w_max, rel_max), max(w_l2, rel_l2)
        err = rel_max if kind == "max" else rel_l2
        if err > tol:
            bad.append(f"pos {i}: rel_{kind} {err:.3e} > {tol:.0e}")
        g.n += 1
        g.sum_l2 += rel_l2
        if count_top1 and int(np.argmax(l)) != int(np.argmax(r)):
            top2 = np.sort(r)[-2:]
            # a near-tie: the reference's own margin is within the tolerance
            if top2[1] - top2[0] <= 2 * tol * np.abs(r).max():
                g.ties += 1
            else:
                g.mism += 1
    g.worst_max, g.worst_l2 = max(g.worst_max, w_max), max(g.worst_l2, w_l2)
    if bad:
        FAILS.append(f"{label} vs {gkey}: " + "; ".join(bad[:4]) + (" ..." if len(bad) > 4 else ""))
    return not bad, f"{gkey}: rel_max {w_max:.2e} rel_l2 {w_l2:.2e}"


def check_model(label, path, gkey, prompts, flags=(), lens=PROMPT_LENS, sim=None):
    """Engine vs reference for each prompt length; with sim (kwargs of
    ref_forward.simulate) also vs the engine-numerics simulation, group
    "sim-" + gkey."""
    m = ref_forward.load(path)
    for n in lens:
        toks, L, backend = engine(path, prompts[n], *flags)
        if toks[:n] != prompts[n] or len(toks) != n + N_DECODE or L.shape != (n + N_DECODE, m.n_vocab):
            FAILS.append(f"{label} n={n}: engine returned tokens {len(toks)} logits {L.shape}")
            continue
        # the engine's greedy tokens must be the argmax of its own rows
        for d in range(N_DECODE):
            if toks[n + d] != int(np.argmax(L[n + d - 1])):
                FAILS.append(f"{label} n={n}: decode token {d} is not the argmax of the previous row")
        R = ref_forward.logits(ref_forward.simulate(m, False), toks)
        ok, msg = compare(label, gkey, L, R)
        if gkey in MEAN_VS_SIM:
            S = ref_forward.logits(ref_forward.simulate(m, act=True), toks)
            ref_forward.simulate(m, False)
            g = GROUPS[gkey]
            g.sum_sim += float(np.sum(np.linalg.norm(S - R, axis=1) / np.linalg.norm(R, axis=1)))
            g.n_sim += R.shape[0]
            g.sim_mism += int(np.sum(np.argmax(L, axis=1) != np.argmax(S, axis=1)))
        if sim is not None:
            S = ref_forward.logits(ref_forward.simulate(m, **sim), toks)
            ok2, msg2 = compare(label, "sim-" + gkey, L, S, count_top1=False)
            ok, msg = ok and ok2, msg + "; " + msg2
        print(f"{'ok  ' if ok else 'FAIL'} {label} prompt {n} [{backend}]: {n + N_DECODE} positions, {msg}")
    return m


def main():
    t0 = time.time()
    os.makedirs(TMP, exist_ok=True)
    for f in os.listdir(TMP):  # never reuse a model an older synth wrote
        if f.startswith("fwd_"):
            os.remove(os.path.join(TMP, f))
    if not os.path.exists(DUMP):
        print(f"FAIL: {DUMP} not built")
        return 1
    rng = np.random.default_rng(20240611)
    prompts = {n: rng.integers(0, 512, size=n).tolist() for n in PROMPT_LENS}
    try:
        seed = 1
        quantized = ("q8_0", "q4_0", "q4_K", "q6_K")
        for wtype in ("f32", "f16") + quantized:
            for arch in ("llama", "qwen2", "qwen3"):
                p = synth(arch, wtype, seed, SMALL, "small")
                seed += 1
                label = f"{arch} {wtype} d256 ({','.join(types_of(p))})"
                check_model(label, p, wtype, prompts)
        for wtype in ("f32", "q8_0", "q4_0"):
            p = synth("qwen2", wtype, 100 + len(wtype), WIDE, "wide")
            check_model(f"qwen2 {wtype} d896 ({','.join(types_of(p))})", p, wtype, prompts)
        p = synth("qwen3", "q4_K", 200, WIDE_QWEN3, "wide", head_dim=128)
        check_model(f"qwen3 q4_K d1024 hd128 ({','.join(types_of(p))})", p, "q4_K", prompts)
        p = synth("llama", "q8_0", 201, WIDE_LLAMA, "wide")
        check_model(f"llama q8_0 d576 ({','.join(types_of(p))})", p, "q8_0", prompts)
        # variants on one model each
        p = synth("qwen2", "f32", 2, SMALL, "small")
        for kv in ("f16", "q8_0"):
            check_model(f"qwen2 f32 d256 cache {kv}", p, "cache-" + kv, prompts, ("--cache", kv),
                        sim=dict(act=False, kv=kv))
        check_model("qwen2 f32 d256 chunked prefill 16", p, "f32", prompts, ("--chunk", "16"),
                    lens=(64,))
        # the ref backend computes in float (no 8-bit activations): tight even on q4_0
        check_model("qwen2 f32 d256 --backends ref,cpu", p, "ref-backend", prompts,
                    ("--backends", "ref,cpu"))
        p = synth("llama", "q4_0", 7, SMALL, "small")
        check_model("llama q4_0 d256 --backends ref,cpu", p, "ref-backend", prompts,
                    ("--backends", "ref,cpu"))
    except RuntimeError as e:
        print(f"FAIL: {e}")
        return 1

    print("\ngroup           positions  worst rel_max  worst rel_l2  mean rel_l2  bound          top-1 mism  near-ties")
    for k, g in GROUPS.items():
        kind, tol = BOUNDS[k]
        print(f"{k:15s} {g.n:9d}  {g.worst_max:13.2e}  {g.worst_l2:12.2e}  {g.sum_l2 / max(g.n, 1):11.2e}  rel_{kind:3s} {tol:<7g}"
              f"  {g.mism:10d}  {g.ties:9d}")
        if g.n_sim:
            ms, me = g.sum_sim / g.n_sim, g.sum_l2 / g.n
            print(f"{'':15s} mean rel_l2 of the simulated 8-bit rounding {ms:.2e}: engine/sim "
                  f"{me / ms:.2f} (bound {MEAN_VS_SIM[k]}); top-1 vs it differs at {g.sim_mism}")
            if me > MEAN_VS_SIM[k] * ms:
                FAILS.append(f"group {k}: mean rel_l2 {me:.2e} > {MEAN_VS_SIM[k]} x the simulated "
                             f"rounding's {ms:.2e}: a systematic error, not rounding noise")
        if g.mism > 0.01 * g.n:
            FAILS.append(f"group {k}: top-1 differs at {g.mism} of {g.n} positions (> 1 %)")
        # Strict form of the rule: against the float64 reference with the
        # engine's 8-bit activation rounding modelled, every position counts.
        if g.n_sim and g.sim_mism > 0.01 * g.n_sim:
            FAILS.append(f"group {k}: top-1 differs from the simulated rounding at {g.sim_mism} "
                         f"of {g.n_sim} positions (> 1 %)")
    print(f"time {time.time() - t0:.1f} s")
    if FAILS:
        print("\nFAILED:")
        for f in FAILS:
            print("  " + f)
        return 1
    print("all forward-pass checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
