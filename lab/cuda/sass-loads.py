#!/usr/bin/env python3
"""sass-loads.py - where a kernel's loads sit against its first uses, from SASS.

Usage: sass-loads.py FILE.cubin|FILE.sass NAME_SUBSTRING

Prints one kernel's global / shared loads and stores, barriers, dp4a / FMA
runs (a run of one opcode folded into "... xN"), so you can see whether a
batch's loads are all issued before the first instruction that waits for
them (PERF.md entry 19). A .cubin is disassembled with cuobjdump ($CUOBJDUMP,
else on PATH; the dev box's nvcc has none: the PyPI wheel
nvidia-cuda-cuobjdump carries one). Build the cubin with e.g.
  nvcc -arch=sm_90 -std=c++17 -O3 -I src -I include -cubin -o /tmp/v4.cubin \\
       src/backend/cuda/gemv_q8v4.cu
"""
import os
import re
import subprocess
import sys

SHOWN = ("LDG", "LDS", "STS", "STG", "BAR", "ACQBULK", "SHFL", "EXIT", "CCTL", "IDP", "FFMA", "FMUL", "HADD2.F32")
FOLDED = ("IDP", "FFMA", "FMUL", "SHFL", "LDS")


def sass_text(path):
    if path.endswith(".sass"):
        with open(path) as f:
            return f.read()
    tool = os.environ.get("CUOBJDUMP", "cuobjdump")
    return subprocess.run([tool, "-sass", path], check=True, capture_output=True, text=True).stdout


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().split("\n\n")[1])
    funcs = sass_text(sys.argv[1]).split("Function : ")[1:]
    hits = [f for f in funcs if sys.argv[2] in f.split("\n", 1)[0]]
    if not hits:
        sys.exit("sass-loads: no kernel name contains '%s'" % sys.argv[2])
    body = hits[0]
    print("==", body.split("\n", 1)[0].strip())
    prev, n = None, 0
    for line in body.split("\n"):
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if not m:
            continue
        ins = m.group(2)
        op = ins.split()[1] if ins.startswith("@") else ins.split()[0]
        if not op.startswith(SHOWN):
            continue
        key = op.split(".")[0]
        if key in FOLDED and key == prev:
            n += 1
            continue
        if n:
            print("      ... x%d more %s" % (n, prev))
        n, prev = 0, key
        print("  ", m.group(1), ins[:96])
    if n:
        print("      ... x%d more %s" % (n, prev))


if __name__ == "__main__":
    main()
