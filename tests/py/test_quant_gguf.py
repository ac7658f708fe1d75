"""Bit compatibility of minfer's reference quantizers with the gguf Python package.

For every weight/activation type minfer knows:
  (1) random rows (several distributions) quantized by minfer (tests/tools/quant_tool)
      and dequantized by gguf.quants.dequantize must give the very same floats as
      minfer's own dequantizer;
  (2) where gguf-py has a quantizer for the type, its bytes must equal ours;
  (3) random valid blocks (random bytes, finite scales) dequantized by both must be
      identical.
gguf-py has no Q8_1 / Q8_K classes; for those this file carries a small numpy
dequantizer written from the block layout, and checks the derived fields
(Q8_1 s = d * sum(q), Q8_K bsums) too. The traits table printed by
`quant_tool types` must agree with gguf's GGML_QUANT_SIZES.
Prints one table row per type; exits non-zero on any mismatch.
"""
import os
import subprocess
import sys

import numpy as np
from gguf import GGMLQuantizationType as GT
from gguf import quants as gq
from gguf.constants import GGML_QUANT_SIZES

SRC = os.environ.get("MINFER_SRC", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BUILD = os.environ.get("MINFER_BUILD", os.path.join(SRC, "build"))
TMP = os.environ.get("MINFER_TMP", "/tmp")
os.makedirs(TMP, exist_ok=True)

# minfer name -> (gguf enum, gguf-py can quantize it)
TYPES = {
    "f32": (GT.F32, True), "f16": (GT.F16, True), "bf16": (GT.BF16, True),
    "q4_0": (GT.Q4_0, True), "q4_1": (GT.Q4_1, True), "q5_0": (GT.Q5_0, True),
    "q5_1": (GT.Q5_1, True), "q8_0": (GT.Q8_0, True), "q8_1": (GT.Q8_1, False),
    "q2_K": (GT.Q2_K, False), "q3_K": (GT.Q3_K, False), "q4_K": (GT.Q4_K, False),
    "q5_K": (GT.Q5_K, False), "q6_K": (GT.Q6_K, False), "q8_K": (GT.Q8_K, False),
    "iq4_nl": (GT.IQ4_NL, False), "iq4_xs": (GT.IQ4_XS, False),
}

# byte offsets of the f16 scale fields in one block (made finite in check 3)
F16_FIELDS = {
    "q4_0": [0], "q4_1": [0, 2], "q5_0": [0], "q5_1": [0, 2], "q8_0": [0], "q8_1": [0, 2],
    "q2_K": [80, 82], "q3_K": [108], "q4_K": [0, 2], "q5_K": [0, 2], "q6_K": [208],
    "iq4_nl": [0], "iq4_xs": [0],
}

# gguf-py still lists Q8_1 with the old float d/s layout (40 bytes); ggml has
# stored d and s as halves (36 bytes) since ggml-common.h, and Q8_1 never
# appears in files. minfer follows ggml.
SIZE_OVERRIDES = {"q8_1": (32, 36)}


def sizes(name):
    return SIZE_OVERRIDES.get(name, tuple(GGML_QUANT_SIZES[TYPES[name][0]]))


failures = []


def find_tool():
    for cand in (os.path.join(BUILD, "quant_tool"), os.path.join(BUILD, "tests", "quant_tool")):
        if os.path.exists(cand):
            return cand
    sys.exit(f"FAIL: quant_tool not found under {BUILD} (build the quant_tool target)")


TOOL = find_tool()


def tool(*args, check=True):
    r = subprocess.run([TOOL, *map(str, args)], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"quant_tool {' '.join(map(str, args))}: rc {r.returncode}: {r.stderr.strip()}")
    return r


def ours_quantize(name, x):
    rows, n = x.shape
    fin, fout = os.path.join(TMP, f"qg_{name}.f32"), os.path.join(TMP, f"qg_{name}.q")
    x.astype(np.float32).tofile(fin)
    tool("quantize", name, n, fin, fout)
    return np.fromfile(fout, dtype=np.uint8).reshape(rows, -1)


def ours_dequantize(name, q, n):
    fin, fout = os.path.join(TMP, f"qg_{name}.q"), os.path.join(TMP, f"qg_{name}.out")
    q.tofile(fin)
    tool("dequantize", name, n, fin, fout)
    return np.fromfile(fout, dtype=np.float32).reshape(q.shape[0], n)


def np_dequant_q8(name, q):
    """Independent numpy dequantizer for the two activation formats gguf-py lacks."""
    rows = q.shape[0]
    if name == "q8_1":
        b = q.reshape(-1, 36)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
        qs = b[:, 4:].copy().view(np.int8).astype(np.float32)
        return (qs * d).reshape(rows, -1)
    b = q.reshape(-1, 292)
    d = b[:, 0:4].copy().view(np.float32)
    qs = b[:, 4:260].copy().view(np.int8).astype(np.float32)
    return (d * qs).reshape(rows, -1)


def gguf_dequant(name, q):
    if name in ("q8_1", "q8_K"):
        return np_dequant_q8(name, q)
    out = gq.dequantize(q, TYPES[name][0])
    return out.reshape(q.shape[0], -1).astype(np.float32)


def same_bits(a, b):
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def first_diff(a, b):
    i = np.flatnonzero(np.ascontiguousarray(a).view(np.uint32).ravel() != np.ascontiguousarray(b).view(np.uint32).ravel())
    if i.size == 0:
        return "shapes differ"
    k = i[0]
    return f"{i.size} elements differ, first at {k}: {a.ravel()[k]!r} vs {b.ravel()[k]!r}"


def distributions(rng, rows, n):
    g = rng.standard_normal((rows, n)).astype(np.float32)
    yield "gauss", g
    yield "uniform", rng.uniform(-3, 7, (rows, n)).astype(np.float32)
    o = (rng.standard_normal((rows, n)) * 0.02).astype(np.float32)
    idx = rng.integers(0, n, (rows, max(1, n // 64)))
    for r in range(rows):
        o[r, idx[r]] = rng.choice([-1, 1], idx.shape[1]) * rng.uniform(5, 50, idx.shape[1])
    yield "outliers", o
    yield "tiny", (rng.standard_normal((rows, n)) * 1e-5).astype(np.float32)
    yield "positive", np.abs(rng.standard_normal((rows, n))).astype(np.float32) + 0.5
    # special blocks inside otherwise random rows: zeros, a constant, one spike
    s = rng.standard_normal((rows, n)).astype(np.float32)
    s[0, :256] = 0.0
    s[1 % rows, -256:] = 0.75
    s[2 % rows, :256] = 0.0
    s[2 % rows, 44] = -3.0
    yield "special", s


def random_valid_blocks(rng, name, nblocks):
    """Random bytes for nblocks blocks with every scale a finite value."""
    bs, ts = sizes(name)
    if name in ("f32", "f16", "bf16"):
        if name == "f32":
            u = rng.integers(0, 2**32, nblocks, dtype=np.uint64).astype(np.uint32)
            u = np.where((u & 0x7F800000) == 0x7F800000, u & 0xBFFFFFFF, u).astype(np.uint32)
        else:
            u = rng.integers(0, 2**16, nblocks, dtype=np.uint32).astype(np.uint16)
            emask = 0x7C00 if name == "f16" else 0x7F80
            u = np.where((u & emask) == emask, u & 0xBFFF, u).astype(np.uint16)
        return u.view(np.uint8).reshape(1, -1)
    b = rng.integers(0, 256, (nblocks, ts), dtype=np.uint8)
    if name == "q8_K":
        d = (rng.standard_normal(nblocks) * 0.01).astype(np.float32)
        b[:, 0:4] = d.view(np.uint8).reshape(nblocks, 4)
    else:
        for off in F16_FIELDS[name]:
            h = rng.integers(0, 2**16, nblocks, dtype=np.uint32).astype(np.uint16)
            h = np.where((h & 0x7C00) == 0x7C00, h & 0xBFFF, h).astype(np.uint16)  # no inf/nan
            b[:, off:off + 2] = h.view(np.uint8).reshape(nblocks, 2)
    return b.reshape(1, -1)


def check_traits():
    lines = tool("types").stdout.strip().splitlines()
    seen = {}
    for ln in lines:
        tid, name, bs, ts, isq, cand, canq = ln.split()
        seen[name] = (int(tid), int(bs), int(ts), int(cand), int(canq))
    for name, (gt, _) in TYPES.items():
        if name not in seen:
            failures.append(f"traits: {name} missing from quant_tool types")
            continue
        tid, bs, ts, cand, canq = seen[name]
        if tid != int(gt) or (bs, ts) != sizes(name) or not cand or not canq:
            failures.append(f"traits: {name}: id {tid} block {bs} size {ts} deq {cand} q {canq}, "
                            f"expected id {int(gt)} {sizes(name)}")
    return len(seen)


def check_errors():
    """The tool refuses bad input with a message naming the numbers."""
    fin = os.path.join(TMP, "qg_bad.f32")
    np.ones(100, np.float32).tofile(fin)
    r = tool("quantize", "q4_K", 100, fin, fin + ".q", check=False)
    if r.returncode == 0 or "100" not in r.stderr or "256" not in r.stderr:
        failures.append(f"errors: q4_K row of 100 not refused properly: rc {r.returncode} '{r.stderr.strip()}'")
    r = tool("quantize", "q9_9", 32, fin, fin + ".q", check=False)
    if r.returncode == 0 or "q9_9" not in r.stderr:
        failures.append(f"errors: unknown type not refused: rc {r.returncode} '{r.stderr.strip()}'")
    np.ones(33, np.float32).tofile(fin)
    r = tool("quantize", "q8_0", 32, fin, fin + ".q", check=False)
    if r.returncode == 0 or "132" not in r.stderr:
        failures.append(f"errors: partial row not refused: rc {r.returncode} '{r.stderr.strip()}'")


def main():
    rng = np.random.default_rng(20240611)
    ntypes = check_traits()
    check_errors()
    print(f"traits: {ntypes} types listed by quant_tool, sizes/ids checked against gguf GGML_QUANT_SIZES"
          f" (q8_1: 36-byte ggml layout, gguf-py lists the old 40)")
    print(f"{'type':6} {'(1) ours->gguf deq':>20} {'(2) bytes==gguf-py':>20} {'(3) random blocks':>18}")
    for name, (gt, gguf_can_quantize) in TYPES.items():
        bs, ts = sizes(name)
        n_deq = n_bytes = n_rand = 0
        bytes_note = "n/a (no gguf quantizer)" if not gguf_can_quantize else ""
        for rows, n in ((6, 1024), (3, 256), (2, 4096)):
            for dist, x in distributions(rng, rows, n):
                q = ours_quantize(name, x)
                if q.shape != (rows, n // bs * ts):
                    failures.append(f"{name}/{dist}: quantized shape {q.shape}, expected {(rows, n // bs * ts)}")
                    continue
                a = ours_dequantize(name, q, n)
                b = gguf_dequant(name, q)
                if not same_bits(a, b):
                    failures.append(f"{name}/{dist}/{n}: (1) dequantize differs: {first_diff(a, b)}")
                if not np.all(np.isfinite(a)):
                    failures.append(f"{name}/{dist}/{n}: non-finite value after round trip")
                n_deq += x.size
                if gguf_can_quantize:
                    ref = gq.quantize(x, gt)
                    ref = np.ascontiguousarray(ref).view(np.uint8).reshape(rows, -1)
                    if not np.array_equal(ref, q):
                        bad = np.flatnonzero(ref.ravel() != q.ravel())
                        failures.append(f"{name}/{dist}/{n}: (2) bytes differ from gguf-py at {bad.size} "
                                        f"positions, first byte {bad[0]} (block {bad[0] // ts})")
                    n_bytes += x.size
                if name == "q8_1":  # s = f16(sum(q) * d), d the unrounded f32 scale
                    blk = q.reshape(-1, ts)
                    d = np.abs(x.reshape(-1, 32)).max(axis=1) / np.float32(127)
                    s = blk[:, 2:4].copy().view(np.float16).ravel()
                    sq = blk[:, 4:].copy().view(np.int8).astype(np.int32).sum(axis=1)
                    if not np.array_equal(s, (sq.astype(np.float32) * d).astype(np.float16)):
                        failures.append(f"q8_1/{dist}: s field is not f16(d * sum(q))")
                if name == "q8_K":  # bsums[i] = sum of 16 levels
                    blk = q.reshape(-1, ts)
                    qs = blk[:, 4:260].copy().view(np.int8).astype(np.int32).reshape(-1, 16, 16).sum(axis=2)
                    bsums = blk[:, 260:].copy().view(np.int16).astype(np.int32)
                    if not np.array_equal(qs, bsums):
                        failures.append(f"q8_K/{dist}: bsums are not the 16-level sums")
        for _ in range(4):
            nblocks = 64 if bs > 1 else 4096
            rb = random_valid_blocks(rng, name, nblocks)
            n = nblocks * bs
            a = ours_dequantize(name, rb, n)
            b = gguf_dequant(name, rb)
            if not same_bits(a, b):
                failures.append(f"{name}: (3) random-block dequantize differs: {first_diff(a, b)}")
            n_rand += n
        print(f"{name:6} {n_deq:>12} values {(bytes_note or str(n_bytes) + ' values'):>20} "
              f"{n_rand:>11} values")
    if failures:
        print(f"\n{len(failures)} FAILURES:")
        for f in failures[:40]:
            print("  " + f)
        return 1
    print("all quant/gguf checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
