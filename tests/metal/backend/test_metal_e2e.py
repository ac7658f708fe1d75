"""End to end on the Metal backend under the MSL emulator: logits of tiny
synthetic llama / qwen2 / qwen3 models of every weight type vs the float64
reference (tests/ref/ref_forward.py), and the run-to-run properties.

Each model (`minfer synth --pure`, d 256, 2 layers, ff 512, 4 heads, 2 kv
heads, vocab 512; qwen3 head_dim 64; q2_K through the Q2_K mix) runs through
tests/metal/backend/metal_logits (engine with [metal, cpu]): a 7-token
prefill with every row's logits, then 3 greedy decode steps with the fused
decode ops. The reference reads the same quantized weights exactly, and the
Metal path keeps activations in f32, so the bound is rel_max = max|l - r| /
max|r| <= 1e-3 per position for every weight type (KV cache f16 / q8_0: vs
the reference with the same K/V rounding, ref_forward.simulate).

Also: the greedy tokens are identical across two runs, a graph rebuild per
step, fusions off, and each matmul tier forced; a fully registered model is
one Metal split (MINFER_GRAPH_TRACE=1 prints the split table); a withheld
weight sends the whole graph to the CPU with a message naming it;
MINFER_OP_PROFILE=1 prints the per-op table.
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "ref"))
import ref_forward  # noqa: E402

BIN = os.environ.get("MINFER_BIN", "minfer")
HELPER = os.environ.get("MINFER_METAL_LOGITS", "metal_logits")
TMP = os.environ.get("MINFER_TMP") or tempfile.mkdtemp()
SHAPE = ["--dim", "256", "--layers", "2", "--ff", "512", "--heads", "4", "--kv-heads", "2",
         "--vocab", "512"]
TYPES = ["f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q3_K", "q4_K", "q5_K",
         "q6_K", "Q2_K"]
PROMPT = [17, 301, 5, 88, 411, 2, 250]
N_DEC = 3
BOUND = 1e-3

failures = []
n_cases = 0


def check(cond, msg):
    global n_cases
    n_cases += 1
    if not cond:
        failures.append(msg)
        print("FAIL", msg, flush=True)


def synth(arch, wtype, seed):
    path = os.path.join(TMP, f"metal_{arch}_{wtype}.gguf")
    if os.path.exists(path):
        return path
    cmd = [BIN, "synth", "--arch", arch] + SHAPE + ["--type", wtype, "--seed", str(seed), "-o", path]
    if arch == "qwen3":
        cmd += ["--head-dim", "64"]
    if wtype != "Q2_K":
        cmd += ["--pure"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"synth failed: {' '.join(cmd)}\n{r.stderr}")
    return path


def metal(model, *flags, env=None, tokens=PROMPT, n_dec=N_DEC):
    out = os.path.join(TMP, "metal_dump")
    cmd = [HELPER, model, "--tokens", ",".join(map(str, tokens)), "--decode", str(n_dec),
           "--out", out] + list(flags)
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=600)
    if r.returncode:
        raise RuntimeError(f"metal_logits failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr}")
    with open(out + ".json") as f:
        head = json.load(f)
    L = np.fromfile(head["bin"], dtype="<f4").reshape(head["n_rows"], head["n_vocab"])
    return head, L.astype(np.float64), r.stderr


def compare(label, L, R):
    worst = 0.0
    for i in range(len(R)):
        worst = max(worst, float(np.max(np.abs(L[i] - R[i])) / np.max(np.abs(R[i]))))
    check(worst <= BOUND, f"{label}: rel_max {worst:.3g} > {BOUND}")
    return worst


def main():
    seed = 11
    for arch in ("llama", "qwen2", "qwen3"):
        for wt in TYPES:
            seed += 1
            path = synth(arch, wt, seed)
            head, L, err = metal(path)
            m = ref_forward.simulate(ref_forward.load(path), act=False)
            R = ref_forward.logits(m, head["tokens"])
            w = compare(f"{arch} {wt}", L, R)
            check(head["splits"] == 1 and head["metal_nodes"] > 0,
                  f"{arch} {wt}: {head['splits']} splits, {head['metal_nodes']} metal nodes")
            # each decode token is the argmax of the row before it
            for s in range(N_DEC):
                row = len(PROMPT) - 1 + s
                check(head["tokens"][len(PROMPT) + s] == int(np.argmax(L[row])),
                      f"{arch} {wt}: decode token {s} is not the argmax of its row")
            print(f"ok {arch} {wt}: rel_max {w:.2e}", flush=True)

    # KV cache types vs the reference with the same rounding
    path = synth("qwen2", "q4_0", 99)
    for cache in ("f16", "q8_0"):
        head, L, _ = metal(path, "--cache", cache)
        m = ref_forward.simulate(ref_forward.load(path), act=False, kv=cache)
        w = compare(f"qwen2 q4_0 cache {cache}", L, ref_forward.logits(m, head["tokens"]))
        print(f"ok cache {cache}: rel_max {w:.2e}", flush=True)

    # determinism: runs, rebuilds, fusions, schedules (matmul tiers)
    for arch, wt in (("qwen3", "q4_K"), ("llama", "q8_0")):
        path = synth(arch, wt, 7)
        base, L0, _ = metal(path, n_dec=5)
        for flags, env, what in (((), None, "second run"), (("--rebuild",), None, "graph rebuilds"),
                                 (("--no-fuse",), None, "fusions off"),
                                 ((), {"MINFER_METAL_GEMM": "1"}, "gemm tier forced"),
                                 ((), {"MINFER_METAL_GEMM": "0"}, "gemv tier forced"),
                                 ((), {"MINFER_ATTN_CHUNK": "2"}, "attention chunks of 2"),
                                 ((), {"MINFER_EMU_SCHEDULE": "reverse"}, "reverse schedule"),
                                 ((), {"MINFER_EMU_SCHEDULE": "random:5"}, "random schedule")):
            head, L, _ = metal(path, *flags, env=env, n_dec=5)
            if what == "fusions off":
                check(head["dispatches"] > base["dispatches"] > 0,
                      f"{arch} {wt}: a fused decode step makes {base['dispatches']} dispatches, "
                      f"unfused {head['dispatches']}")
            check(head["tokens"] == base["tokens"], f"{arch} {wt}: greedy tokens differ with {what}: "
                  f"{head['tokens']} vs {base['tokens']}")
            if what == "second run":
                check(np.array_equal(L, L0), f"{arch} {wt}: logits differ between two runs")
        print(f"ok determinism {arch} {wt}", flush=True)

    # the split table and the gate
    path = synth("qwen2", "q8_0", 5)
    head, _, err = metal(path, env={"MINFER_GRAPH_TRACE": "1"}, n_dec=1)
    check(head["splits"] == 1, f"fully registered: {head['splits']} splits")
    check("1 splits" in err and "split 0: metal" in err,
          f"MINFER_GRAPH_TRACE shows no single metal split:\n{err[-2000:]}")
    head, L, err = metal(path, "--withhold", "blk.1.ffn_up.weight", env={"MINFER_GRAPH_TRACE": "1"}, n_dec=1)
    check("blk.1.ffn_up.weight" in err and "CPU" in err, f"withheld weight: no message naming it:\n{err[-2000:]}")
    check(head["metal_nodes"] == 0, f"withheld weight: {head['metal_nodes']} nodes still on metal")
    check("split 0: cpu" in err and "split 0: metal" not in err,
          f"withheld weight: the split table does not show the graph on the CPU:\n{err[-2000:]}")

    # MINFER_OP_PROFILE (the engine's) times the Metal nodes, fused ones included
    _, _, err = metal(path, env={"MINFER_OP_PROFILE": "1"}, n_dec=1)
    check("op profile" in err and "fused_qkv" in err and "matmul" in err,
          f"MINFER_OP_PROFILE=1 printed no per-op table:\n{err[-2000:]}")

    print(f"metal e2e cases: {n_cases}, failed: {len(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
