"""GGUF interop between minfer's reader/writer and the reference Python `gguf` package.

(1) GGUFWriter writes a file with every kv type (nested arrays included) and
    f32/f16/f64/i32/q8_0/q4_K tensors of random content; our reader
    (tests/tools/gguf_dump json) must report every key, type, value, shape,
    offset and tensor byte hash.
(2) Our writer (gguf_dump copy, kvs through mf_gguf_writer_copy_kv, tensor data
    streamed in uneven chunks, alignment 64) rewrites that file; GGUFReader
    must read every field byte-identical and every tensor identical.
(3) The real SmolLM2 model: our reader against GGUFReader (33 kv, 272
    tensors, every value, shape and data offset), and our copy of it with the
    default alignment must be byte-identical to the original.
Exits non-zero on the first mismatch.
"""
import json
import os
import subprocess
import sys

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, GGUFValueType as VT, GGUFWriter

BUILD = os.environ.get("MINFER_BUILD", os.path.join(os.path.dirname(__file__), "../../build"))
TMP = os.environ.get("MINFER_TMP", "/tmp")
MODEL = os.environ.get("MINFER_MODEL", "")
DUMP = os.path.join(BUILD, "tests", "gguf_dump")

checks = 0


def check(cond, what):
    global checks
    checks += 1
    if not cond:
        print(f"FAIL: {what}")
        sys.exit(1)


def fnv1a(b: bytes) -> str:
    h = 1469598103934665603
    for x in b:
        h = ((h ^ x) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def dump(path, hash_=True):
    args = [DUMP, "json", path] + (["--hash"] if hash_ else [])
    r = subprocess.run(args, capture_output=True)
    check(r.returncode == 0, f"gguf_dump json {path}: {r.stderr.decode()}")
    return json.loads(r.stdout.decode("utf-8"))


rng = np.random.default_rng(20240611)

# key -> (GGUF type name, expected value, element type name or None)
KVS = {
    "t.u8": ("uint8", 200, None),
    "t.i8": ("int8", -100, None),
    "t.u16": ("uint16", 65000, None),
    "t.i16": ("int16", -32000, None),
    "t.u32": ("uint32", 4000000000, None),
    "t.i32": ("int32", -2000000000, None),
    "t.u64": ("uint64", 18000000000000000000, None),
    "t.i64": ("int64", -9000000000000000000, None),
    "t.f32": ("float32", 3.14159, None),
    "t.f64": ("float64", 2.718281828459045, None),
    "t.true": ("bool", True, None),
    "t.false": ("bool", False, None),
    "t.str": ("string", "héllo \"wörld\" ✓\n\t", None),
    "t.empty_str": ("string", "", None),
    "a.i32": ("array", [int(x) for x in rng.integers(-2**31, 2**31, 17)], "int32"),
    "a.u64": ("array", [int(x) for x in rng.integers(0, 2**63, 5)] + [2**64 - 1], "uint64"),
    "a.i16": ("array", [int(x) for x in rng.integers(-2**15, 2**15, 9)], "int16"),
    "a.u8": ("array", [int(x) for x in rng.integers(0, 256, 40)], "uint8"),
    "a.f32": ("array", [float(x) for x in rng.standard_normal(13).astype(np.float32)], "float32"),
    "a.f64": ("array", [float(x) for x in rng.standard_normal(4)], "float64"),
    "a.bool": ("array", [bool(x) for x in rng.integers(0, 2, 11)], "bool"),
    "a.str": ("array", ["", "a", "ü∞", "tok en", "x" * 300], "string"),
    "a.nested": ("array", [[1, 2, 3], [4], [-5, 6]], "array"),
    "a.nested_str": ("array", [["a", "b"], ["ccc"]], "array"),
    "a.nested3": ("array", [[[1.5], [2.5, 3.5]], [[4.5]]], "array"),
    "tokenizer.ggml.tokens": ("array", ["<s>", "</s>", "hi", " there"], "string"),
}
VTYPE = {"uint8": VT.UINT8, "int8": VT.INT8, "uint16": VT.UINT16, "int16": VT.INT16, "uint32": VT.UINT32,
         "int32": VT.INT32, "uint64": VT.UINT64, "int64": VT.INT64, "float32": VT.FLOAT32,
         "float64": VT.FLOAT64, "bool": VT.BOOL, "string": VT.STRING}


def make_tensors():
    t = {}
    t["f32.weight"] = (rng.standard_normal((5, 3)).astype(np.float32), None)
    t["f16.weight"] = (rng.standard_normal((2, 4, 8)).astype(np.float16), None)
    t["f64.weight"] = (rng.standard_normal((3,)).astype(np.float64), None)
    t["i32.weight"] = (rng.integers(-1000, 1000, (2, 2, 2, 3)).astype(np.int32), None)
    # raw quantized blocks: q8_0 is 34 bytes per 32 values, q4_K 144 per 256
    t["q8_0.weight"] = (rng.integers(0, 256, (4, 2 * 34)).astype(np.uint8), QT.Q8_0)
    t["q4_K.weight"] = (rng.integers(0, 256, (3, 144)).astype(np.uint8), QT.Q4_K)
    return t


def expected_ne(arr, raw):
    shape = list(arr.shape)
    if raw == QT.Q8_0:
        shape[-1] = shape[-1] // 34 * 32
    elif raw == QT.Q4_K:
        shape[-1] = shape[-1] // 144 * 256
    return shape[::-1]


def write_with_python(path, tensors):
    w = GGUFWriter(path, "llama")
    for k, (t, v, et) in KVS.items():
        if t == "array":
            sub = VTYPE.get(et) if et != "array" else None
            w.add_key_value(k, v, VT.ARRAY, sub_type=sub)
        else:
            w.add_key_value(k, v, VTYPE[t])
    for name, (arr, raw) in tensors.items():
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def same_value(got, want, et):
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(
            same_value(g, x, et) for g, x in zip(got, want))
    if isinstance(want, float):
        if et == "float32" or (isinstance(got, float) and np.float32(want) == want):
            return np.float32(got) == np.float32(want)
        return got == want
    return got == want and type(got) is type(want)


def part1(tensors, path):
    d = dump(path)
    check(d["version"] == 3 and d["alignment"] == 32 and d["n_parts"] == 1, "header facts")
    kv = {e["key"]: e for e in d["kv"]}
    check(len(kv) == len(KVS) + 1, f"kv count {len(kv)} != {len(KVS) + 1}")
    check(kv["general.architecture"]["value"] == "llama", "general.architecture")
    for k, (t, v, et) in KVS.items():
        check(k in kv, f"key {k} missing")
        e = kv[k]
        check(e["type"] == t, f"{k}: type {e['type']} != {t}")
        if t == "array":
            check(e["elem"] == et, f"{k}: element type {e['elem']} != {et}")
        check(same_value(e["value"], v, et if t == "array" else t), f"{k}: {e['value']!r} != {v!r}")
    r = GGUFReader(path)
    check(len(d["tensors"]) == len(tensors), "tensor count")
    rt = {t.name: t for t in r.tensors}
    for e in d["tensors"]:
        arr, raw = tensors[e["name"]]
        check(e["ne"] == expected_ne(arr, raw), f"{e['name']}: ne {e['ne']} vs {expected_ne(arr, raw)}")
        check(e["nbytes"] == arr.nbytes, f"{e['name']}: nbytes")
        check(e["fnv"] == fnv1a(arr.tobytes()), f"{e['name']}: data hash")
        check(d["data_offset"] + e["offset"] == rt[e["name"]].data_offset, f"{e['name']}: data offset")
        check(e["type"] == int(rt[e["name"]].tensor_type), f"{e['name']}: type")
    print(f"(1) python-written file read by minfer: {len(KVS) + 1} kv, {len(tensors)} tensors ok")


def field_bytes(f):
    return b"".join(p.tobytes() for p in f.parts)


def part2(tensors, src, dst):
    r = subprocess.run([DUMP, "copy", src, dst, "64"], capture_output=True)
    check(r.returncode == 0, f"gguf_dump copy: {r.stderr.decode()}")
    a, b = GGUFReader(src), GGUFReader(dst)
    check(b.alignment == 64, f"alignment {b.alignment}")
    fa = {k: f for k, f in a.fields.items() if not k.startswith("GGUF.")}
    fb = {k: f for k, f in b.fields.items() if not k.startswith("GGUF.")}
    check(set(fb) == set(fa) | {"general.alignment"}, f"keys {sorted(set(fb) ^ set(fa))}")
    check(fb["general.alignment"].contents() == 64, "general.alignment value")
    for k, f in fa.items():
        check(field_bytes(f) == field_bytes(fb[k]), f"field {k} differs after our copy")
        if not (k in KVS and KVS[k][2] == "array"):  # GGUFReader.contents cannot walk nested arrays
            check(f.contents() == fb[k].contents(), f"field {k} contents")
    check(len(b.tensors) == len(tensors), "tensor count after copy")
    for t in b.tensors:
        arr, raw = tensors[t.name]
        check(t.data_offset % 64 == 0, f"{t.name}: data offset {t.data_offset} not 64-aligned")
        check(list(t.shape) == expected_ne(arr, raw), f"{t.name}: shape {list(t.shape)}")
        check(np.asarray(t.data).tobytes() == arr.tobytes(), f"{t.name}: data differ after our copy")
    print(f"(2) minfer-written copy read by GGUFReader: {len(fa)} fields byte-identical, "
          f"{len(tensors)} tensors identical")


def part3():
    if not MODEL or not os.path.exists(MODEL):
        print("(3) real model not found: FAIL (set MINFER_MODEL)")
        sys.exit(1)
    d = dump(MODEL, hash_=False)
    r = GGUFReader(MODEL)
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    check(len(d["kv"]) == 33 and len(fields) == 33, f"kv count {len(d['kv'])} / {len(fields)}")
    check(len(d["tensors"]) == 272 and len(r.tensors) == 272, f"tensor count {len(d['tensors'])}")
    for e in d["kv"]:
        f = fields[e["key"]]
        want = f.contents()
        check(e["type"] == VT(f.types[0]).name.lower(), f"{e['key']}: type")
        check(same_value(e["value"], want, e.get("elem", e["type"])), f"{e['key']}: value differs")
    for e, t in zip(d["tensors"], r.tensors):
        check(e["name"] == t.name and e["type"] == int(t.tensor_type), f"tensor {t.name}")
        check(e["ne"] == [int(x) for x in t.shape], f"{t.name}: shape")
        check(e["nbytes"] == int(t.n_bytes), f"{t.name}: nbytes")
        check(d["data_offset"] + e["offset"] == t.data_offset, f"{t.name}: data offset")
    copy = os.path.join(TMP, "gguf_interop_model_copy.gguf")
    r2 = subprocess.run([DUMP, "copy", MODEL, copy], capture_output=True)
    check(r2.returncode == 0, f"copy of the model: {r2.stderr.decode()}")
    with open(MODEL, "rb") as fa, open(copy, "rb") as fb:
        same = True
        while True:
            x, y = fa.read(1 << 20), fb.read(1 << 20)
            if x != y:
                same = False
                break
            if not x:
                break
    os.unlink(copy)
    check(same, "our copy of the real model is not byte-identical")
    print("(3) real model: 33 kv and 272 tensors match GGUFReader; our copy is byte-identical")


def main():
    check(os.path.exists(DUMP), f"{DUMP} not built")
    os.makedirs(TMP, exist_ok=True)
    src = os.path.join(TMP, "gguf_interop_py.gguf")
    dst = os.path.join(TMP, "gguf_interop_ours.gguf")
    tensors = make_tensors()
    write_with_python(src, tensors)
    part1(tensors, src)
    part2(tensors, src, dst)
    part3()
    for p in (src, dst):
        os.unlink(p)
    print(f"ok: {checks} checks")


if __name__ == "__main__":
    main()
