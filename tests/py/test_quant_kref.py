"""K-quant quantizers against an independent float32 model of the ggml reference.

gguf-py can dequantize but not quantize Q2_K..Q6_K / Q8_K, so byte equality with
the ecosystem cannot be checked there. This file re-states the ggml reference
quantizers (quantize_row_*_ref with make_qkx2_quants / make_q3_quants /
make_qx_quants; see src/quant/quant.c) as slow, scalar, numpy-float32 Python,
one operation at a time in ggml's order, and requires minfer's bytes
(tests/tools/quant_tool) to be identical for random blocks of several
distributions. Prints one line per type; exits non-zero on any difference.
"""
import os
import struct
import subprocess
import sys

import numpy as np

F = np.float32
BUILD = os.environ.get("MINFER_BUILD", "build")
TMP = os.environ.get("MINFER_TMP", "/tmp")
os.makedirs(TMP, exist_ok=True)
TOOL = next((p for p in (os.path.join(BUILD, "quant_tool"), os.path.join(BUILD, "tests", "quant_tool"))
             if os.path.exists(p)), os.path.join(BUILD, "tests", "quant_tool"))
QK = 256


def nint(v):
    """ggml nearest_int: add 1.5 * 2^23 in float32, read the low mantissa bits."""
    t = F(v) + F(12582912.0)
    (u,) = struct.unpack("<I", struct.pack("<f", t))
    return (u & 0x007FFFFF) - 0x00400000


def h16(v):
    """f32 -> f16 bits (round to nearest even) and the value read back."""
    h = np.float16(F(v))
    return int(h.view(np.uint16)), F(h)


def qkx2(x, w, nmax, rmin, rdelta, nstep, use_mad):
    n = len(x)
    mn = x[0]
    mx = x[0]
    sum_w = w[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < mn:
            mn = x[i]
        if x[i] > mx:
            mx = x[i]
        sum_w = sum_w + w[i]
        sum_x = sum_x + w[i] * x[i]
    if mn > 0:
        mn = F(0)
    if mx == mn:
        return F(0), -mn, [0] * n
    iscale = F(nmax) / (mx - mn)
    scale = F(1) / iscale
    L = [0] * n
    best = F(0)
    for i in range(n):
        L[i] = max(0, min(nmax, nint(iscale * (x[i] - mn))))
        diff = scale * F(L[i]) + mn - x[i]
        diff = abs(diff) if use_mad else diff * diff
        best = best + w[i] * diff
    for s in range(nstep + 1):
        iscale = (F(rmin) + F(rdelta) * F(s) + F(nmax)) / (mx - mn)
        sl = sl2 = sxl = F(0)
        La = [0] * n
        for i in range(n):
            l = max(0, min(nmax, nint(iscale * (x[i] - mn))))
            La[i] = l
            sl = sl + w[i] * F(l)
            sl2 = sl2 + w[i] * F(l) * F(l)
            sxl = sxl + w[i] * F(l) * x[i]
        D = sum_w * sl2 - sl * sl
        if D > 0:
            this_scale = (sum_w * sxl - sum_x * sl) / D
            this_min = (sl2 * sum_x - sl * sxl) / D
            if this_min > 0:
                this_min = F(0)
                this_scale = sxl / sl2
            err = F(0)
            for i in range(n):
                diff = this_scale * F(La[i]) + this_min - x[i]
                diff = abs(diff) if use_mad else diff * diff
                err = err + w[i] * diff
            if err < best:
                L, best, scale, mn = La, err, this_scale, this_min
    return scale, -mn, L


def amax_signed(x):
    mx = F(0)
    am = F(0)
    for v in x:
        if abs(v) > am:
            am = abs(v)
            mx = v
    return mx, am


def q3(x, nmax):
    n = len(x)
    mx, am = amax_signed(x)
    if am < F(1e-15):
        return F(0), [0] * n
    iscale = F(-nmax) / mx
    L = [0] * n
    slx = sl2 = F(0)
    for i in range(n):
        L[i] = max(-nmax, min(nmax - 1, nint(iscale * x[i])))
        w = x[i] * x[i]
        slx = slx + w * x[i] * F(L[i])
        sl2 = sl2 + w * F(L[i]) * F(L[i])
    for _ in range(5):
        changed = 0
        for i in range(n):
            w = x[i] * x[i]
            a = slx - w * x[i] * F(L[i])
            if a > 0:
                b = sl2 - w * F(L[i]) * F(L[i])
                nl = max(-nmax, min(nmax - 1, nint(x[i] * b / a)))
                if nl != L[i]:
                    a = a + w * x[i] * F(nl)
                    b = b + w * F(nl) * F(nl)
                    if b > 0 and a * a * sl2 > slx * slx * b:
                        L[i], slx, sl2 = nl, a, b
                        changed += 1
        if not changed:
            break
    return slx / sl2, [l + nmax for l in L]


def qx(x, nmax):
    n = len(x)
    mx, am = amax_signed(x)
    if am < F(1e-15):
        return F(0), [0] * n

    def trial(iscale):
        slx = sl2 = F(0)
        Ls = []
        for i in range(n):
            l = max(-nmax, min(nmax - 1, nint(iscale * x[i])))
            Ls.append(l + nmax)
            w = x[i] * x[i]
            slx = slx + w * x[i] * F(l)
            sl2 = sl2 + w * F(l) * F(l)
        return slx, sl2, Ls

    slx, sl2, L = trial(F(-nmax) / mx)
    scale = slx / sl2 if sl2 else F(0)
    best = scale * slx
    for s in range(-9, 10):
        if s == 0:
            continue
        a, b, Ls = trial(-(F(nmax) + F(0.1) * F(s)) / mx)
        if b > 0 and a * a > best * b:
            L, scale = Ls, a / b
            best = scale * a
    return scale, L


def pack2(L):
    out = bytearray(64)
    for j in range(0, QK, 128):
        for l in range(32):
            out[j // 4 + l] = L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6)
    return out


def q2_K(x):
    L = [0] * QK
    sc = [F(0)] * 16
    mins = [F(0)] * 16
    for j in range(16):
        xs = x[16 * j:16 * j + 16]
        sc[j], mins[j], L[16 * j:16 * j + 16] = qkx2(xs, [abs(v) for v in xs], 3, -0.5, 0.1, 15, True)
    max_scale = max([F(0)] + sc)
    max_min = max([F(0)] + mins)
    scales = [0] * 16
    if max_scale > 0:
        iscale = F(15) / max_scale
        scales = [nint(iscale * s) & 0xFF for s in sc]
        dbits, d = h16(max_scale / F(15))
    else:
        dbits, d = h16(0)
    if max_min > 0:
        iscale = F(15) / max_min
        scales = [(scales[j] | (nint(iscale * mins[j]) << 4)) & 0xFF for j in range(16)]
        mbits, dm0 = h16(max_min / F(15))
    else:
        mbits, dm0 = h16(0)
    for j in range(16):
        dd = d * F(scales[j] & 0xF)
        if not dd:
            continue
        dm = dm0 * F(scales[j] >> 4)
        for i in range(16):
            L[16 * j + i] = max(0, min(3, nint((x[16 * j + i] + dm) / dd)))
    return bytes(scales) + bytes(pack2(L)) + struct.pack("<HH", dbits, mbits)


def q3_K(x):
    L = [0] * QK
    sc = [F(0)] * 16
    for j in range(16):
        sc[j], L[16 * j:16 * j + 16] = q3(x[16 * j:16 * j + 16], 4)
    max_scale, am = amax_signed(sc)
    s = [0] * 12
    if max_scale:
        iscale = F(-32) / max_scale
        for j in range(16):
            l = max(-32, min(31, nint(iscale * sc[j]))) + 32
            if j < 8:
                s[j] = l & 0xF
            else:
                s[j - 8] |= (l & 0xF) << 4
            s[8 + j % 4] |= (l >> 4) << (2 * (j // 4))
        dbits, d = h16(F(1) / iscale)
    else:
        dbits, d = h16(0)
    for j in range(16):
        lo = s[j] & 0xF if j < 8 else s[j - 8] >> 4
        v = (lo | (((s[8 + j % 4] >> (2 * (j // 4))) & 3) << 4)) - 32
        dd = d * F(v)
        if not dd:
            continue
        for i in range(16):
            L[16 * j + i] = max(-4, min(3, nint(x[16 * j + i] / dd))) + 4
    hmask = bytearray(32)
    for e in range(QK):
        if L[e] > 3:
            hmask[e % 32] |= 1 << (e // 32)
            L[e] -= 4
    return bytes(hmask) + bytes(pack2(L)) + bytes(s) + struct.pack("<H", dbits)


def k4(x, nmax, rmin, nstep):
    L = [0] * QK
    sc = [F(0)] * 8
    mins = [F(0)] * 8
    for j in range(8):
        xs = x[32 * j:32 * j + 32]
        sx2 = F(0)
        for v in xs:
            sx2 = sx2 + v * v
        av = np.sqrt(sx2 / F(32))
        sc[j], mins[j], L[32 * j:32 * j + 32] = qkx2(xs, [av + abs(v) for v in xs], nmax, rmin, 0.1, nstep, False)
    max_scale = max([F(0)] + sc)
    max_min = max([F(0)] + mins)
    inv_s = F(63) / max_scale if max_scale > 0 else F(0)
    inv_m = F(63) / max_min if max_min > 0 else F(0)
    s = [0] * 12
    for j in range(8):
        ls = min(63, nint(inv_s * sc[j]))
        lm = min(63, nint(inv_m * mins[j]))
        if j < 4:
            s[j] = ls & 0xFF
            s[j + 4] = lm & 0xFF
        else:
            s[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
            s[j - 4] |= (ls >> 4) << 6
            s[j] |= (lm >> 4) << 6
        s = [v & 0xFF for v in s]
    dbits, d = h16(max_scale / F(63))
    mbits, dmin = h16(max_min / F(63))
    for j in range(8):
        if j < 4:
            a, m = s[j] & 63, s[j + 4] & 63
        else:
            a, m = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)
        dd = d * F(a)
        if not dd:
            continue
        dm = dmin * F(m)
        for i in range(32):
            L[32 * j + i] = max(0, min(nmax, nint((x[32 * j + i] + dm) / dd)))
    return struct.pack("<HH", dbits, mbits) + bytes(s), L


def q4_K(x):
    head, L = k4(x, 15, -1.0, 20)
    qs = bytearray(128)
    for j in range(0, QK, 64):
        for l in range(32):
            qs[j // 2 + l] = L[j + l] | (L[j + l + 32] << 4)
    return head + bytes(qs)


def q5_K(x):
    head, L = k4(x, 31, -0.5, 15)
    qh = bytearray(32)
    qs = bytearray(128)
    for j in range(0, QK, 64):
        for l in range(32):
            a, b = L[j + l], L[j + l + 32]
            if a > 15:
                qh[l] |= 1 << (j // 32)
            if b > 15:
                qh[l] |= 2 << (j // 32)
            qs[j // 2 + l] = (a & 0xF) | ((b & 0xF) << 4)
    return head + bytes(qh) + bytes(qs)


def q6_K(x):
    L = [0] * QK
    sc = [F(0)] * 16
    for j in range(16):
        sc[j], L[16 * j:16 * j + 16] = qx(x[16 * j:16 * j + 16], 32)
    max_scale, am = amax_signed(sc)
    if am < F(1e-15):
        return bytes(210)
    iscale = F(-128) / max_scale
    dbits, d = h16(F(1) / iscale)
    scales = [min(127, nint(iscale * v)) for v in sc]
    for j in range(16):
        dd = d * F(scales[j])
        if not dd:
            continue
        for i in range(16):
            L[16 * j + i] = max(-32, min(31, nint(x[16 * j + i] / dd))) + 32
    ql = bytearray(128)
    qh = bytearray(64)
    for h, j in enumerate(range(0, QK, 128)):
        for l in range(32):
            a, b, c, e = L[j + l], L[j + l + 32], L[j + l + 64], L[j + l + 96]
            ql[64 * h + l] = (a & 0xF) | ((c & 0xF) << 4)
            ql[64 * h + l + 32] = (b & 0xF) | ((e & 0xF) << 4)
            qh[32 * h + l] = (a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6)
    return bytes(ql) + bytes(qh) + bytes(v & 0xFF for v in scales) + struct.pack("<H", dbits)


def q8_K(x):
    mx, am = amax_signed(x)
    if not am:
        return bytes(292)
    iscale = F(-127) / mx
    qs = [min(127, nint(iscale * v)) for v in x]
    bsums = [sum(qs[16 * j:16 * j + 16]) for j in range(16)]
    return (struct.pack("<f", F(1) / iscale) + struct.pack("<256b", *qs) + struct.pack("<16h", *bsums))


MODELS = {"q2_K": q2_K, "q3_K": q3_K, "q4_K": q4_K, "q5_K": q5_K, "q6_K": q6_K, "q8_K": q8_K}


def blocks(rng):
    yield "gauss", rng.standard_normal(QK)
    yield "uniform", rng.uniform(-1, 3, QK)
    yield "positive", np.abs(rng.standard_normal(QK)) + 0.25
    o = rng.standard_normal(QK) * 0.01
    o[rng.integers(0, QK, 4)] = rng.uniform(-8, 8, 4)
    yield "outliers", o
    yield "tiny", rng.standard_normal(QK) * 1e-4
    z = rng.standard_normal(QK)
    z[:48] = 0
    z[100:116] = 0.5
    yield "groups", z


def main():
    if not os.path.exists(TOOL):
        sys.exit(f"FAIL: {TOOL} not found (build the quant_tool target)")
    rng = np.random.default_rng(7)
    failures = []
    for name, model in MODELS.items():
        n = 0
        for rep in range(2):
            for dist, x in blocks(rng):
                x = x.astype(np.float32)
                fin, fout = os.path.join(TMP, "kref.f32"), os.path.join(TMP, "kref.q")
                x.tofile(fin)
                r = subprocess.run([TOOL, "quantize", name, str(QK), fin, fout], capture_output=True, text=True)
                if r.returncode != 0:
                    failures.append(f"{name}: quant_tool failed: {r.stderr.strip()}")
                    continue
                ours = open(fout, "rb").read()
                ref = model([F(v) for v in x])
                n += 1
                if ours != ref:
                    bad = [i for i in range(min(len(ours), len(ref))) if ours[i] != ref[i]]
                    failures.append(f"{name}/{dist}: {len(bad)} of {len(ref)} bytes differ from the model, "
                                    f"first at byte {bad[0] if bad else -1}")
        print(f"{name:5} {n} blocks byte-compared with the float32 model of the ggml reference")
    if failures:
        print(f"{len(failures)} FAILURES:")
        for f in failures:
            print("  " + f)
        return 1
    print("all K-quant reference checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
