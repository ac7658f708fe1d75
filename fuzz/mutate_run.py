#!/usr/bin/env python3
"""Mutation run over hostile GGUF files (not part of CI: minutes, not seconds).

Makes N mutated files from several valid models (synth tiny llama / qwen2 /
qwen3, a tiny model carrying SmolLM2's real tokenizer metadata, and the real
SmolLM2 file for header-only mutations), runs each through
`minfer inspect`, `minfer run -n 4` and `minfer tokenize` of a sanitizer
build (ASan + UBSan), and classifies every file:

  rejected  every command that refused it exited non-zero with one line on
            stderr (and no sanitizer report)
  accepted  at least one command exited 0; the mutation operator says why
            such a file is still a valid model (see ACCEPT_WHY)
  crash     a signal, a sanitizer report, a timeout, or a refusal that was
            not one clean line; must be 0

Usage: .venv/bin/python fuzz/mutate_run.py --minfer build-asan/minfer
           [--n 3000] [--seed 1] [--out /tmp/mutate] [--jobs 1] [--keep-crashes DIR]
Prints a summary table (per operator) and writes it as JSON to OUT/summary.json.
Also: --seeds DIR writes a few hostile files per class (fuzz corpus seeds).
"""
import argparse
import concurrent.futures as cf
import json
import os
import pickle
import random
import shutil
import struct
import subprocess
import sys
import tempfile

# ---- a minimal GGUF reader/writer (layout-exact, so mutations are surgical) ----

FIXED = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 11: "<q", 12: "<d"}
T_STR, T_ARR = 8, 9
BLOCK = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
         10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 30: (1, 2),
         24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8)}


class Rd:
    def __init__(self, b):
        self.b, self.p = b, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.b, self.p)[0]
        self.p += struct.calcsize(fmt)
        return v

    def str(self):
        n = self.take("<Q")
        s = bytes(self.b[self.p:self.p + n])
        self.p += n
        return s


def rd_val(r, t):
    if t == T_STR:
        return r.str()
    if t == T_ARR:
        et, n = r.take("<I"), r.take("<Q")
        return (et, [rd_val(r, et) for _ in range(n)])
    return r.take(FIXED[t])


def wr_val(t, v):
    if t == T_STR:
        return struct.pack("<Q", len(v)) + v
    if t == T_ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(wr_val(et, x) for x in items)
    return struct.pack(FIXED[t], v)


class Gguf:
    """header, kvs [(key, type, value)], tensors [dict], data (bytes after the table, aligned)."""

    @staticmethod
    def parse(b):
        g = Gguf()
        r = Rd(b)
        g.magic, g.version = r.take("<I"), r.take("<I")
        nt, nkv = r.take("<Q"), r.take("<Q")
        g.kvs = []
        for _ in range(nkv):
            k = r.str()
            t = r.take("<I")
            g.kvs.append([k, t, rd_val(r, t)])
        g.tensors = []
        for _ in range(nt):
            name = r.str()
            nd = r.take("<I")
            ne = [r.take("<Q") for _ in range(nd)]
            g.tensors.append({"name": name, "ne": ne, "type": r.take("<I"), "offset": r.take("<Q")})
        a = g.alignment()
        start = (r.p + a - 1) // a * a
        g.data = bytes(b[start:])
        return g

    def alignment(self):
        for k, t, v in self.kvs:
            if k == b"general.alignment" and t == 4:
                return v
        return 32

    def kv(self, key):
        for e in self.kvs:
            if e[0] == key:
                return e
        return None

    def write(self, n_tensors=None, n_kv=None, align=None):
        out = bytearray(struct.pack("<IIQQ", self.magic, self.version,
                                    len(self.tensors) if n_tensors is None else n_tensors,
                                    len(self.kvs) if n_kv is None else n_kv))
        for k, t, v in self.kvs:
            out += struct.pack("<Q", len(k)) + k + struct.pack("<I", t) + wr_val(t, v)
        for ti in self.tensors:
            out += struct.pack("<Q", len(ti["name"])) + ti["name"] + struct.pack("<I", len(ti["ne"]))
            out += b"".join(struct.pack("<Q", x) for x in ti["ne"])
            out += struct.pack("<IQ", ti["type"], ti["offset"])
        a = align or self.alignment()
        a = a if a > 0 and (a & (a - 1)) == 0 else 32
        out += b"\0" * ((-len(out)) % a)
        return bytes(out) + self.data


def nbytes(ti):
    bs, ts = BLOCK.get(ti["type"], (1, 4))
    n = 1
    for x in ti["ne"][1:]:
        n *= x
    return ti["ne"][0] // bs * ts * n


def relayout(g):
    """Recomputes contiguous offsets (for mutations that must keep the layout valid)."""
    a, off = g.alignment(), 0
    for ti in g.tensors:
        ti["offset"] = off
        off = (off + nbytes(ti) + a - 1) // a * a


# ---- mutation operators: each returns (bytes, note) -------------------------------------

ESC = [b"\x1b[31m", b"\n", b"\r\x1b[2K", b"\xff\xfe", b"\xc2\x9b", b"\x00", b"\x07"]
NUM_TYPES = [0, 1, 2, 3, 4, 5, 6, 10, 11, 12]


def any_value(rng, depth=0):
    t = rng.choice(NUM_TYPES + [7, T_STR, T_ARR] if depth < 2 else NUM_TYPES + [T_STR])
    if t == T_STR:
        return t, rng.choice([b"", b"x", b"gpt2", b"llama", b"\x1b]0;pwn\x07", b"a" * 300])
    if t == T_ARR:
        et, _ = any_value(rng, depth + 1)
        et = rng.choice([T_STR, T_ARR, 4, 6, 7]) if depth < 1 else rng.choice([T_STR, 4, 6])
        n = rng.choice([0, 1, 3, 259])
        if et == T_ARR:
            return t, (et, [(4, [1, 2])] * min(n, 3))
        return t, (et, [any_value_of(rng, et) for _ in range(n)])
    return t, any_value_of(rng, t)


def any_value_of(rng, t):
    if t == T_STR:
        return rng.choice([b"a", b"a b", b"\xe2\x96\x81x", b"\n"])
    if t == 7:
        return rng.choice([0, 1])
    if t in (6, 12):
        return rng.choice([0.0, -1.0, 1e-6, 1e30, float("nan"), float("inf"), 10000.0])
    lo, hi = {0: (0, 255), 1: (-128, 127), 2: (0, 65535), 3: (-32768, 32767), 4: (0, 2**32 - 1),
              5: (-2**31, 2**31 - 1), 10: (0, 2**64 - 1), 11: (-2**63, 2**63 - 1)}[t]
    return rng.choice([lo, hi, 0, 1, 2, 3, 16, 64, 259, 4096, lo + 1, hi - 1])


def m_kv_retype(g, rng):
    e = rng.choice(g.kvs)
    e[1], e[2] = any_value(rng)
    return g.write(), f"retype {e[0][:40]!r}"


def m_tok_array_type(g, rng):
    key = rng.choice([b"tokenizer.ggml.token_type", b"tokenizer.ggml.scores", b"tokenizer.ggml.merges",
                      b"tokenizer.ggml.tokens"])
    e = g.kv(key)
    n = len(g.kv(b"tokenizer.ggml.tokens")[2][1])
    et = rng.choice([T_STR, T_ARR, 6, 5, 7, 12])
    if e is None:
        e = [key, T_ARR, None]
        g.kvs.append(e)
    if et == T_ARR:
        e[1], e[2] = T_ARR, (T_ARR, [(5, [1])] * n)
    else:
        e[1], e[2] = T_ARR, (et, [any_value_of(rng, et) for _ in range(n)])
    return g.write(), f"{key.decode()} as array of type {et}"


def m_int_hparam(g, rng):
    ints = [e for e in g.kvs if e[1] in (4, 5, 10, 11, 0, 2)]
    e = rng.choice(ints)
    e[2] = rng.choice([0, 1, e[2] - 1 if e[2] > 0 else 0, e[2] + 1, e[2] * 2, 2**31 - 1, 7])
    if e[1] == 4:
        e[2] = min(max(e[2], 0), 2**32 - 1)
    elif e[1] == 5:
        e[2] = min(max(e[2], -2**31), 2**31 - 1)
    elif e[1] == 0:
        e[2] = min(max(e[2], 0), 255)
    elif e[1] == 2:
        e[2] = min(max(e[2], 0), 65535)
    return g.write(), f"{e[0].decode(errors='replace')} = {e[2]}"


def m_float_hparam(g, rng):
    fl = [e for e in g.kvs if e[1] in (6, 12)]
    if not fl:
        return m_int_hparam(g, rng)
    e = rng.choice(fl)
    e[2] = any_value_of(rng, 6)
    return g.write(), f"{e[0].decode()} = {e[2]}"


def m_block_count(g, rng):
    e = next(e for e in g.kvs if e[0].endswith(b".block_count"))
    e[2] = rng.choice([0, max(e[2] - 1, 0), e[2] + 1, e[2] + 5])
    return g.write(), f"block_count = {e[2]}"


def m_tensor_offset(g, rng):
    i = rng.randrange(len(g.tensors))
    t, a = g.tensors[i], g.alignment()
    prev = g.tensors[i - 1]["offset"] if i else 0
    t["offset"] = rng.choice([prev, t["offset"] + a, max(t["offset"] - a, 0), 0, t["offset"] + 1,
                              2**63, len(g.data)])
    return g.write(), f"tensor {i} offset {t['offset']}"


def m_tensor_shape(g, rng):
    i = rng.randrange(len(g.tensors))
    t = g.tensors[i]
    d = rng.randrange(len(t["ne"]))
    t["ne"][d] = rng.choice([t["ne"][d] + 1, t["ne"][d] * 2, max(t["ne"][d] // 2, 1), 1, 2**40])
    if rng.random() < 0.5:
        t["ne"].reverse()
    if rng.random() < 0.3:
        t["ne"] = t["ne"] + [1]
    if rng.random() < 0.5:
        relayout(g)  # keep the layout consistent: only the shape lies
    return g.write(), f"tensor {t['name'][:30]!r} ne {t['ne']}"


def m_tensor_type(g, rng):
    i = rng.randrange(len(g.tensors))
    g.tensors[i]["type"] = rng.choice([0, 1, 2, 8, 12, 14, 24, 26, 30, 4, 5, 99])
    if rng.random() < 0.5:
        relayout(g)
    return g.write(), f"tensor {i} type {g.tensors[i]['type']}"


def m_tensor_count(g, rng):
    k = rng.choice([-1, 1, -2])
    return g.write(n_tensors=len(g.tensors) + k), f"tensor count {k:+d}"


def m_kv_count(g, rng):
    k = rng.choice([-1, 1])
    return g.write(n_kv=len(g.kvs) + k), f"kv count {k:+d}"


def m_drop_tensor(g, rng):
    i = rng.randrange(len(g.tensors))
    name = g.tensors[i]["name"]
    del g.tensors[i]
    if rng.random() < 0.5:
        relayout(g)
    return g.write(), f"drop tensor {name[:40]!r}"


def m_rename_tensor(g, rng):
    i = rng.randrange(len(g.tensors))
    t = g.tensors[i]
    t["name"] = rng.choice([b"blk.99." + t["name"].split(b".", 2)[-1], t["name"] + rng.choice(ESC),
                            g.tensors[(i + 1) % len(g.tensors)]["name"], b"rope_freqs.weight",
                            t["name"].replace(b"blk.0.", b"blk.1.")])
    return g.write(), f"rename tensor {i} to {t['name'][:40]!r}"


def m_dup_kv(g, rng):
    e = rng.choice(g.kvs)
    g.kvs.insert(rng.randrange(len(g.kvs) + 1), list(e))
    return g.write(), f"duplicate key {e[0][:40]!r}"


def m_drop_kv(g, rng):
    i = rng.randrange(len(g.kvs))
    k = g.kvs[i][0]
    del g.kvs[i]
    return g.write(), f"drop key {k[:40]!r}"


def m_escape_string(g, rng):
    strs = [e for e in g.kvs if e[1] == T_STR] + [None]
    e = rng.choice(strs)
    esc = rng.choice(ESC)
    if e is None:  # a key name
        e = rng.choice(g.kvs)
        e[0] = e[0] + esc
        return g.write(), f"key with {esc!r}"
    e[2] = e[2][:3] + esc + e[2][3:]
    return g.write(), f"{e[0].decode()} with {esc!r}"


def m_token_text(g, rng):
    e = g.kv(b"tokenizer.ggml.tokens")
    items = e[2][1]
    i = rng.randrange(len(items))
    items[i] = rng.choice([b"", b"\xe4\xbd" * 2500, b"x" * 5000, items[i] + rng.choice(ESC), b"\xf0\x9f"])
    return g.write(), f"token {i} text of {len(items[i])} bytes"


def m_merge_text(g, rng):
    e = g.kv(b"tokenizer.ggml.merges")
    if not e or not e[2][1]:
        g.kvs.append([b"tokenizer.ggml.merges", T_ARR, (T_STR, [b"nospace", b"a b"])])
        return g.write(), "merges added"
    items = e[2][1]
    i = rng.randrange(len(items))
    items[i] = rng.choice([b"nospace", b" ", b"", b"\x1b[2J \n", items[i] + b" extra"])
    return g.write(), f"merge {i} = {items[i][:20]!r}"


def m_special_id(g, rng):
    key = rng.choice([b"tokenizer.ggml.bos_token_id", b"tokenizer.ggml.eos_token_id",
                      b"tokenizer.ggml.eot_token_id", b"tokenizer.ggml.padding_token_id"])
    e = g.kv(key)
    v = rng.choice([2**32 - 1, 2**31, 10**9, 0, len(g.kv(b"tokenizer.ggml.tokens")[2][1])])
    if e:
        e[1], e[2] = 4, v
    else:
        g.kvs.append([key, 4, v])
    return g.write(), f"{key.decode()} = {v}"


def m_alignment(g, rng):
    v = rng.choice([1, 2, 4, 8, 16, 64, 24, 0])
    e = g.kv(b"general.alignment")
    if e:
        e[1], e[2] = 4, v
    else:
        g.kvs.append([b"general.alignment", 4, v])
    if rng.random() < 0.7 and v and (v & (v - 1)) == 0:
        relayout(g)
        # the data must move to the new alignment as well: rebuild it tensor by tensor
        old = Gguf.parse(ORIG[id(g)])
        data = bytearray()
        for t, o in zip(g.tensors, old.tensors):
            data += b"\0" * (t["offset"] - len(data))
            data += old.data[o["offset"]:o["offset"] + nbytes(o)]
        data += b"\0" * ((-len(data)) % v)
        g.data = bytes(data)
        return g.write(align=v), f"alignment {v} (relaid)"
    return g.write(), f"alignment {v}"


def m_raw_bytes(g, rng):
    b = bytearray(g.write())
    head = len(b) - len(g.data)
    for _ in range(rng.choice([1, 2, 4, 16])):
        p = rng.randrange(head if rng.random() < 0.9 else len(b))
        b[p] = rng.choice([0, 0xff, 0x80, 0x7f, rng.randrange(256), b[p] ^ (1 << rng.randrange(8))])
    try:  # name what the flips changed, so an accepted file can be judged
        new = Gguf.parse(bytes(b))
        old = Gguf.parse(g.write())
        diff = [o[0].decode(errors="replace") for o, n in zip(old.kvs, new.kvs) if o != n]
        diff += [o["name"].decode(errors="replace") for o, n in zip(old.tensors, new.tensors) if o != n]
        what = ", ".join(diff[:3]) or "padding/data bytes"
    except Exception:  # noqa: BLE001 - an unparsable result is the common case
        what = "unparsable"
    return bytes(b), f"raw byte flips in: {what}"


def m_truncate(g, rng):
    b = g.write()
    n = rng.choice([rng.randrange(len(b)), len(b) - len(g.data) + rng.randrange(max(len(g.data), 1)),
                    len(b) - 1])
    return b[:n], f"truncate at {n}"


def m_append(g, rng):
    return g.write() + bytes(rng.choice([1, 31, 32, 4096])), "trailing bytes"


def m_nested(g, rng):
    depth = rng.choice([1, 4, 9])
    v = (4, [1])
    for _ in range(depth):
        v = (T_ARR, [v])
    g.kvs.append([b"general.nested", T_ARR, v])
    return g.write(), f"nested arrays depth {depth}"


OPS = {f.__name__[2:]: f for f in [m_kv_retype, m_tok_array_type, m_int_hparam, m_float_hparam, m_block_count,
                                    m_tensor_offset, m_tensor_shape, m_tensor_type, m_tensor_count, m_kv_count,
                                    m_drop_tensor, m_rename_tensor, m_dup_kv, m_drop_kv, m_escape_string,
                                    m_token_text, m_merge_text, m_special_id, m_alignment, m_raw_bytes,
                                    m_truncate, m_append, m_nested]}
HEADER_ONLY = {"kv_retype", "tok_array_type", "int_hparam", "float_hparam", "block_count", "dup_kv", "drop_kv",
               "escape_string", "token_text", "merge_text", "special_id", "nested", "kv_count"}

# Why a file that a mutation leaves loadable is still a valid model.
ACCEPT_WHY = {
    "kv_retype": "a key minfer does not read, the key's own type again, an integer key retyped to another "
                 "integer type whose value fits, or (real file) a model key that `tokenize` does not read",
    "tok_array_type": "the array's own element type again, or scores as another numeric type",
    "int_hparam": "context_length, general.file_type / quantization_version (display only), or a token id "
                  "inside the vocabulary",
    "float_hparam": "rope.freq_base or the rms epsilon set to another positive finite value (a different but "
                    "well-defined model), or on the real file, which only `tokenize` reads",
    "block_count": "only on the real file, run through `tokenize` alone (the tokenizer does not read "
                   "block_count); `run` refused every changed block_count",
    "tensor_offset": "tensor 0's offset set to 0, its value already",
    "tensor_shape": "never accepted",
    "tensor_type": "the tensor's own type again (same byte size, so the layout still holds)",
    "tensor_count": "never accepted",
    "kv_count": "never accepted",
    "drop_tensor": "never accepted",
    "rename_tensor": "the rename left the name as it was (blk.0. -> blk.1. on a name without it)",
    "dup_kv": "never accepted",
    "drop_kv": "an optional key: general.*, the chat template (the token heuristics pick one), special "
               "ids (absent means none), quantization_version",
    "escape_string": "a string minfer only displays (general.name/type/finetune, an unread key's name; shown "
                     "escaped) or the chat template, whose markers are searched as text",
    "token_text": "a token's text changed: a different, valid vocabulary (a 5,000-byte piece prints whole)",
    "merge_text": "a merge whose parts are not both in the vocabulary can never apply and is skipped "
                  "(tokenizer.h documents it)",
    "special_id": "an id inside the vocabulary (0)",
    "alignment": "a power of two >= 8 with the data relaid to it, or 8/16 where every tensor size is a "
                 "multiple already (the offsets do not change)",
    "raw_bytes": "the flips turned token texts, merges, ids or weight bytes into other valid values (any q8_0 "
                 "bytes with finite scales are a valid weight)",
    "truncate": "the cut removed only padding after the last tensor's data",
    "append": "never accepted",
    "nested": "a nested array under a key minfer does not read, within the depth limit",
}


# ---- bases ---------------------------------------------------------------------------------

def make_bases(minfer, tmp, smollm):
    bases = {}
    for arch in ("llama", "qwen2", "qwen3"):
        p = os.path.join(tmp, f"base_{arch}.gguf")
        subprocess.run([minfer, "synth", "--arch", arch, "--dim", "32", "--layers", "1", "--ff", "32",
                        "--heads", "2", "--kv-heads", "1", "--vocab", "259", "--ctx", "64", "--type", "q8_0",
                        "-o", p], check=True, capture_output=True)
        bases[f"synth-{arch}"] = open(p, "rb").read()
    if smollm and os.path.exists(smollm):
        # SmolLM2's real tokenizer (49,152 tokens, merges, chat template) on a tiny llama body
        real = Gguf.parse(open(smollm, "rb").read())
        tiny = Gguf.parse(bases["synth-llama"])
        keep = [e for e in real.kvs if e[0].startswith(b"tokenizer.")]
        n_vocab = len(real.kv(b"tokenizer.ggml.tokens")[2][1])
        tiny.kvs = [e for e in tiny.kvs if not e[0].startswith(b"tokenizer.") and e[0] != b"llama.vocab_size"]
        tiny.kvs += keep
        emb = next(t for t in tiny.tensors if t["name"] == b"token_embd.weight")
        old = Gguf.parse(bases["synth-llama"])
        data = bytearray()
        for t, o in zip(tiny.tensors, old.tensors):
            if t["name"] in (b"token_embd.weight", b"output.weight"):
                t["ne"] = [t["ne"][0], n_vocab]
            t["offset"] = len(data)
            chunk = old.data[o["offset"]:o["offset"] + nbytes(o)]
            want = nbytes(t)
            chunk = (chunk * (want // max(len(chunk), 1) + 1))[:want]
            data += chunk + b"\0" * ((-len(chunk)) % tiny.alignment())
        tiny.data = bytes(data)
        bases["smollm2-tokenizer"] = tiny.write()
        assert emb is not None
    return bases


ORIG = {}
PARSED = {}  # base bytes id -> pickled Gguf (parsing a 49k-token vocab each time is slow)


def mutate(base, op, rng):
    key = id(base)
    if key not in PARSED:
        PARSED[key] = pickle.dumps(Gguf.parse(base))
    g = pickle.loads(PARSED[key])
    ORIG[id(g)] = base
    try:
        return OPS[op](g, rng)
    finally:
        ORIG.pop(id(g), None)


# ---- running -------------------------------------------------------------------------------

SAN = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:", "UndefinedBehaviorSanitizer",
       "internal error at")


def run_one(minfer, path, real_header_only):
    cmds = [("inspect", [minfer, "inspect", path]),
            ("tokenize", [minfer, "tokenize", "-m", path, "-p", "Hello wörld <|im_start|> 12"])]
    if not real_header_only:
        cmds.insert(1, ("run", [minfer, "run", "-m", path, "-p", "hi", "-n", "4", "-t", "1", "--seed", "1"]))
    res = {}
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=99",
               UBSAN_OPTIONS="halt_on_error=1:exitcode=98:print_stacktrace=1")
    for name, c in cmds:
        try:
            p = subprocess.run(c, capture_output=True, timeout=120, env=env)
            err = p.stderr.decode(errors="replace")
            res[name] = (p.returncode, err)
        except subprocess.TimeoutExpired:
            res[name] = (-999, "timeout")
    return res


def classify(res):
    """The file's class (by the model-loading command: `run`, or `tokenize` for
    header-only mutations of the real file) and which commands accepted it."""
    acc = set()
    for name, (rc, err) in res.items():
        if rc < 0 or rc >= 90 or any(s in err for s in SAN):
            return "crash", f"{name}: rc {rc}: {err[-400:]}", acc
        if rc == 0:
            acc.add(name)
            continue
        lines = [l for l in err.split("\n") if l and not l.startswith("session: ")]
        if len(lines) != 1:
            return "crash", f"{name}: rc {rc}, {len(lines)} stderr lines: {err[-400:]}", acc
    key = "run" if "run" in res else "tokenize"
    return ("accepted" if key in acc else "rejected"), "", acc


def write_seeds(out_dir, bases):
    """Hostile files per class for the fuzz corpora: OUT/loader (whole tiny
    models) and OUT/tokload (the same metadata without tensors)."""
    rng = random.Random(99)
    picks = ["tok_array_type", "tensor_offset", "tensor_count", "block_count", "rename_tensor", "alignment",
             "escape_string", "token_text", "nested", "special_id", "merge_text", "tensor_shape", "kv_retype"]
    files = {f"valid_{n}.gguf": bases[n] for n in ("synth-llama", "synth-qwen2", "synth-qwen3")}
    for k, op in enumerate(picks):
        files[f"{op}.gguf"] = mutate(bases[("synth-llama", "synth-qwen2", "synth-qwen3")[k % 3]], op, rng)[0]
    for sub in ("loader", "tokload"):
        os.makedirs(os.path.join(out_dir, sub), exist_ok=True)
    for name, b in files.items():
        with open(os.path.join(out_dir, "loader", name), "wb") as f:
            f.write(b)
        try:
            g = Gguf.parse(b)
        except Exception:  # noqa: BLE001 - a seed that does not parse is kept whole
            continue
        if name.startswith(("tensor_", "rename_", "block_", "alignment")):
            continue  # tensor classes: the loader's corpus only
        g.tensors, g.data = [], b""
        with open(os.path.join(out_dir, "tokload", name), "wb") as f:
            f.write(g.write())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minfer", required=True)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--smollm", default=os.path.join(os.path.dirname(__file__), "..", "models",
                                                     "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--real-share", type=float, default=0.03,
                    help="share of mutations applied to the real SmolLM2 file (header-only, no `run`)")
    ap.add_argument("--seeds", default=None, help="write corpus seeds under this dir (loader/, tokload/) and exit")
    ap.add_argument("--keep-crashes", default=None)
    a = ap.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="minfer-mutate-")
    os.makedirs(out, exist_ok=True)
    bases = make_bases(a.minfer, out, a.smollm)
    if a.seeds:
        write_seeds(a.seeds, bases)
        return 0
    # every base must be accepted by all three commands first
    for name, b in bases.items():
        p = os.path.join(out, f"check_{name}.gguf")
        open(p, "wb").write(b)
        st, why, acc = classify(run_one(a.minfer, p, False))
        assert st == "accepted" and len(acc) == 3, (name, why, acc)
    real = open(a.smollm, "rb").read() if os.path.exists(a.smollm) else None
    rng = random.Random(a.seed)
    jobs = []
    for i in range(a.n):
        use_real = real is not None and rng.random() < a.real_share
        if use_real:
            op = rng.choice(sorted(HEADER_ONLY))
            base_name, base = "smollm2-real", real
        else:
            op = rng.choice(sorted(OPS))
            base_name = rng.choice(sorted(bases))
            base = bases[base_name]
        jobs.append((i, base_name, base, op, rng.getrandbits(64), use_real))

    def work(j):
        i, base_name, base, op, mseed, use_real = j
        try:
            data, note = mutate(base, op, random.Random(mseed))
        except (StopIteration, IndexError, TypeError, ValueError, struct.error, OverflowError):
            return None  # the operator does not apply to this base
        p = os.path.join(out, f"m{i:05d}.gguf")
        with open(p, "wb") as f:
            f.write(data)
        st, why, acc = classify(run_one(a.minfer, p, use_real))
        if st == "crash" and a.keep_crashes:
            os.makedirs(a.keep_crashes, exist_ok=True)
            shutil.copy(p, a.keep_crashes)
        os.unlink(p)
        return (i, base_name, op, note, st, why, sorted(acc))

    results = []
    with cf.ThreadPoolExecutor(a.jobs) as ex:
        for r in ex.map(work, jobs):
            if r is None:
                continue
            results.append(r)
            if len(results) % 250 == 0:
                print(f"{len(results)} files", file=sys.stderr, flush=True)
            if r[4] == "crash":
                print("CRASH", r, file=sys.stderr)
    per_op = {}
    cols = ("tried", "rejected", "accepted", "crash", "inspect_ok", "tokenize_ok")
    for _, base_name, op, note, st, _, acc in results:
        d = per_op.setdefault(op, dict({k: 0 for k in cols}, accepted_notes=[]))
        d["tried"] += 1
        d[st] += 1
        d["inspect_ok"] += "inspect" in acc
        d["tokenize_ok"] += "tokenize" in acc
        if st == "accepted" and len(d["accepted_notes"]) < 8:
            d["accepted_notes"].append(f"{base_name}: {note}")
    tot = {k: sum(d[k] for d in per_op.values()) for k in cols}
    print(f"{'operator':16} " + " ".join(f"{c:>11}" for c in cols))
    for op in sorted(per_op):
        print(f"{op:16} " + " ".join(f"{per_op[op][c]:11}" for c in cols))
    print(f"{'total':16} " + " ".join(f"{tot[c]:11}" for c in cols))
    summary = {"total": tot, "per_operator": per_op, "accept_why": ACCEPT_WHY,
               "bases": sorted(bases) + (["smollm2-real"] if real else []),
               "crashes": [r for r in results if r[4] == "crash"]}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print("summary:", os.path.join(out, "summary.json"))
    return 1 if tot["crash"] else 0


if __name__ == "__main__":
    sys.exit(main())
