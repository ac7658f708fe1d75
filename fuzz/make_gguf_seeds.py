"""Writes the seed corpus of fuzz/fuzz_gguf.c into fuzz/corpus/gguf/ (each file < 4 KB).

Run with the project venv: .venv/bin/python fuzz/make_gguf_seeds.py
Seeds cover: every scalar kv type, arrays (strings, numbers, nested),
general.alignment, a tokenizer vocab, tensors of several types and dims, a
version-2 header, and a file with no tensors; plus one hostile file per
class the reader refuses (hostile_*: overlapping / out-of-order tensors, a
tensor count one too low, alignment 1, ESC in key and tensor names, a
token_type array of strings, nested empty arrays).
"""
import os
import struct

import sys

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT, GGUFWriter

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "gguf")
rng = np.random.default_rng(7)


def write(name, build, align=None):
    path = os.path.join(OUT, name)
    w = GGUFWriter(path, "llama")
    if align:
        w.add_custom_alignment(align)
    build(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    size = os.path.getsize(path)
    assert size < 4096, f"{name}: {size} bytes"
    return path


def kv_all(w):
    w.add_key_value("t.u8", 7, VT.UINT8)
    w.add_key_value("t.i8", -7, VT.INT8)
    w.add_key_value("t.u16", 700, VT.UINT16)
    w.add_key_value("t.i16", -700, VT.INT16)
    w.add_key_value("t.u32", 70000, VT.UINT32)
    w.add_key_value("t.i32", -70000, VT.INT32)
    w.add_key_value("t.u64", 2**40, VT.UINT64)
    w.add_key_value("t.i64", -2**40, VT.INT64)
    w.add_key_value("t.f32", 0.5, VT.FLOAT32)
    w.add_key_value("t.f64", 0.25, VT.FLOAT64)
    w.add_key_value("t.bool", True, VT.BOOL)
    w.add_key_value("t.str", "text", VT.STRING)
    w.add_key_value("a.i32", [1, -2, 3], VT.ARRAY)
    w.add_key_value("a.f32", [1.5, 2.5], VT.ARRAY)
    w.add_key_value("a.bool", [True, False], VT.ARRAY)
    w.add_key_value("a.u64", [1, 2], VT.ARRAY, sub_type=VT.UINT64)
    w.add_key_value("a.nested", [[1, 2], [3]], VT.ARRAY)
    w.add_key_value("a.nested3", [[["x"]], [["y", "z"]]], VT.ARRAY)


def vocab(w):
    w.add_key_value("tokenizer.ggml.model", "gpt2", VT.STRING)
    w.add_key_value("tokenizer.ggml.tokens", ["<s>", "</s>", "a", "b", "ab"], VT.ARRAY)
    w.add_key_value("tokenizer.ggml.merges", ["a b"], VT.ARRAY)
    w.add_key_value("tokenizer.ggml.token_type", [3, 3, 1, 1, 1], VT.ARRAY)
    w.add_key_value("llama.block_count", 1, VT.UINT32)


def tensors(w):
    w.add_tensor("f32", rng.standard_normal((2, 3)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 2, 4)).astype(np.float16))
    w.add_tensor("i8", rng.integers(-5, 5, (1, 1, 2, 2)).astype(np.int8))
    w.add_tensor("q8_0", rng.integers(0, 256, (2, 34)).astype(np.uint8), raw_dtype=QT.Q8_0)
    w.add_tensor("q4_0", rng.integers(0, 256, (1, 18)).astype(np.uint8), raw_dtype=QT.Q4_0)


def hostile():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import mutate_run as m

    def out(name, b):
        assert len(b) < 4096, name
        with open(os.path.join(OUT, f"hostile_{name}.gguf"), "wb") as f:
            f.write(b)

    t = open(os.path.join(OUT, "tensors.gguf"), "rb").read()
    v = open(os.path.join(OUT, "vocab.gguf"), "rb").read()
    g = m.Gguf.parse(t)
    g.tensors[1]["offset"] = g.tensors[0]["offset"]
    out("overlap", g.write())
    g = m.Gguf.parse(t)
    g.tensors[0]["offset"], g.tensors[1]["offset"] = g.tensors[1]["offset"], g.tensors[0]["offset"]
    out("out_of_order", g.write())
    out("count_low", m.Gguf.parse(t).write(n_tensors=len(m.Gguf.parse(t).tensors) - 1))
    g = m.Gguf.parse(t)
    g.kvs.append([b"general.alignment", 4, 1])
    out("align1", g.write(align=32))
    g = m.Gguf.parse(t)
    g.tensors[0]["name"] += b"\x1b[31m\n"
    g.kvs.append([b"key\x1b]0;x\x07", 4, 1])
    out("escapes", g.write())
    g = m.Gguf.parse(v)
    g.kv(b"tokenizer.ggml.token_type")[2] = (8, [b"1"] * 5)
    out("token_type_strings", g.write())
    g = m.Gguf.parse(v)
    g.kvs.append([b"general.nested", 9, (9, [(0, [])] * 200)])
    out("nested_empty", g.write())


def main():
    os.makedirs(OUT, exist_ok=True)
    write("kv_all.gguf", kv_all)
    write("vocab.gguf", vocab)
    write("tensors.gguf", tensors)
    write("tensors_align64.gguf", lambda w: (vocab(w), tensors(w)), align=64)
    p = write("v2.gguf", lambda w: (kv_all(w), tensors(w)))
    with open(p, "r+b") as f:  # v2 has the same layout
        f.seek(4)
        f.write(struct.pack("<I", 2))
    write("empty.gguf", lambda w: None)
    hostile()
    print("seeds:", sorted(os.listdir(OUT)))


if __name__ == "__main__":
    main()
