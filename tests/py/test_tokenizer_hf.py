#!/usr/bin/env python3
"""minfer's tokenizer against the Hugging Face `tokenizers` library.

For each vocab (the SmolLM2 GGUF's own, a `minfer synth` qwen2 vocab, and
small BPE vocabs trained here and written as GGUFs with pre = qwen2, llama3,
gpt2, deepseek-llm) a reference HF tokenizer is built from the GGUF's tokens
and merges with the matching pre-tokenizer config, and the ids of a
deterministic corpus of >= 2000 strings must be identical (special-token
texts parsed, and again with them treated as plain text). A sample of the
ids must also detokenize back to the exact input text."""
import json
import os
import random
import subprocess
import sys
import tempfile
import unicodedata

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

BIN = os.environ.get("MINFER_BIN", "build/minfer")
MODEL = os.environ.get("MINFER_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf")
TMP = os.environ.get("MINFER_TMP") or tempfile.mkdtemp()
os.makedirs(TMP, exist_ok=True)

# The split regexes, as the models' tokenizer.json files spell them.
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def deepseek_res():
    sys.path.insert(0, os.path.join(os.environ.get("MINFER_SRC", "."), "scripts"))
    import gen_unicode_tables as g
    return [r"[\r\n]", r"\s?[" + g.DS_LETTERS + "]+", r"\s?[" + g.DS_PUNCT + "]+", r"\s+$",
            "[" + g.DS_CJK + "]+", r"\p{N}+"]


def pre_tokenizer(pre):
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre in ("smollm",):
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False)])
    if pre in ("gpt2", "default"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False)
    if pre == "qwen2":
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_RE), "isolated"), bl])
    if pre == "llama3":
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_RE), "isolated"), bl])
    if pre == "deepseek-llm":
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), "isolated") for r in deepseek_res()] + [bl])
    raise SystemExit("no HF config for pre " + pre)


def read_vocab(path):
    r = gguf.GGUFReader(path)

    def strs(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def scalar_str(key):
        f = r.fields[key]
        return bytes(f.parts[f.data[0]]).decode()

    tokens = strs("tokenizer.ggml.tokens")
    f = r.fields["tokenizer.ggml.token_type"]
    types = [int(f.parts[i][0]) for i in f.data]
    merges = strs("tokenizer.ggml.merges")
    return tokens, types, merges, scalar_str("tokenizer.ggml.pre")


def hf_from_gguf(path):
    tokens, types, merges, pre = read_vocab(path)
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges],
                     ignore_merges=(pre == "llama3"))
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == 4]
    if user:
        tok.add_tokens(user)
    return tok, pre


# ---- the corpus ------------------------------------------------------------------------

WORDS = ("the quick brown fox jumps over lazy dog a I we they you it is was were be "
         "hello world tokenizer model inference engine language large small byte pair "
         "encoding merges vocabulary Paris London New York running jumped happily "
         "don't can't won't isn't they're we've I'm you'll she'd it's").split()
CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n",
    "if __name__ == '__main__':\n    main()\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
    "const x = {a: 1, b: [2, 3]}; // comment\n",
    "SELECT * FROM users WHERE id = 7 AND name LIKE '%bob%';",
    "x += 1;;  y -= 2 ;\r\n\treturn;",
    "    indented\n        more\n\t\ttabs\n",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
    "<html><body class=\"x\">&amp; &lt;tag&gt;</body></html>",
]
EMOJI = ["😀", "👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "❤️", "🧑🏿‍💻", "🤖", "✨", "🐍"]
SCRIPTS = ["Привет мир", "Καλημέρα κόσμε", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया",
           "สวัสดีชาวโลก", "こんにちは世界", "你好，世界！", "안녕하세요 세계", "Xin chào thế giới",
           "Grüße, Jürgen! Ça va? Ñandú", "ǅemal ǈubljana", "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３"]
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start", "im_end|>", "<|", "|>"]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M",
                "'LL", "'D", "'x", "''", "\u2019s"]


def rand_unicode(rng, n):
    out = []
    while len(out) < n:
        r = rng.random()
        cp = (rng.randrange(0x20, 0x800) if r < 0.5 else rng.randrange(0x800, 0x10000)
              if r < 0.85 else rng.randrange(0x10000, 0x30000))
        ch = chr(cp)
        if unicodedata.category(ch) in ("Cs", "Co", "Cn"):
            continue
        out.append(ch)
    return "".join(out)


def corpus():
    rng = random.Random(1234)
    out = []
    for _ in range(300):  # English sentences
        ws = [rng.choice(WORDS) for _ in range(rng.randrange(1, 16))]
        if rng.random() < 0.5:
            ws[0] = ws[0].capitalize()
        if rng.random() < 0.2:
            ws = [w.upper() for w in ws]
        out.append(" ".join(ws) + rng.choice([".", "!", "?", "", ",", "...", " :)"]))
    for i in range(1, 41):  # numbers of all lengths
        out.append("".join(rng.choice("0123456789") for _ in range(i)))
        out.append("x" + "".join(rng.choice("0123456789") for _ in range(i)) + " y")
    for _ in range(100):
        out.append(rng.choice(["", "-", "+", "$"]) + str(rng.randrange(10 ** rng.randrange(1, 15)))
                   + rng.choice(["", ".5", ",000", "%", "e10", " 3/4", "\u0663\u0664"]))
    for _ in range(150):  # whitespace runs
        parts = [rng.choice([" ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2009", "\x0b"])
                 * rng.randrange(1, 6) for _ in range(rng.randrange(1, 5))]
        words = [rng.choice(WORDS + ["1", "42", "!", "."]) for _ in range(len(parts))]
        s = "".join(p + w for p, w in zip(parts, words))
        out.append(s if rng.random() < 0.5 else s + rng.choice([" ", "  ", "\n", "\n\n", " \n "]))
    for _ in range(150):  # code
        s = rng.choice(CODE)
        out.append(s if rng.random() < 0.5 else s * rng.randrange(2, 4))
    for _ in range(150):  # CJK, scripts, emoji, accents
        bits = []
        for _ in range(rng.randrange(1, 6)):
            k = rng.random()
            if k < 0.25:
                bits.append("".join(chr(rng.randrange(0x4E00, 0x9FA6)) for _ in range(rng.randrange(1, 8))))
            elif k < 0.5:
                bits.append(rng.choice(SCRIPTS))
            elif k < 0.7:
                bits.append("".join(rng.choice(EMOJI) for _ in range(rng.randrange(1, 4))))
            elif k < 0.85:
                base = rng.choice(["e", "a", "o", "n", "E", "u"])
                bits.append(base + "".join(chr(rng.randrange(0x300, 0x370)) for _ in range(rng.randrange(1, 4))))
            else:
                bits.append(unicodedata.normalize(rng.choice(["NFC", "NFD"]), "café naïve résumé Ångström"))
        out.append(rng.choice([" ", "", "\n"]).join(bits))
    for _ in range(200):  # contractions
        w = rng.choice(WORDS)
        out.append(w + rng.choice(CONTRACTIONS) + rng.choice(["", " ", " good", "s", "ll", "\n", "9"]))
    for _ in range(200):  # special-token text inside text
        bits = [rng.choice(WORDS + SPECIALS + [" ", "\n", "user", "assistant"]) for _ in range(rng.randrange(1, 8))]
        out.append(rng.choice(["", " "]).join(bits))
    for _ in range(500):  # random unicode
        out.append(rand_unicode(rng, rng.randrange(1, 30)))
    for _ in range(200):  # everything mixed
        bits = [rng.choice(out) for _ in range(rng.randrange(2, 5))]
        out.append(rng.choice(["", " ", "\n", "\t"]).join(bits))
    out += ["", " ", "  ", "\n", "\n\n\n", "\r\n\r\n", "\t\t", " \t \n ", "a", "'", "'s", "''s",
            "x" * 2000, " " * 300 + "end", "1" * 500, "😀" * 50, "a\u0301" * 30]
    assert all("\0" not in s for s in out)
    return out


def minfer_ids(model, texts, extra=()):
    path = os.path.join(TMP, "tok_batch.bin")
    with open(path, "wb") as f:
        f.write(b"\0".join(s.encode("utf-8") for s in texts))
    r = subprocess.run([BIN, "tokenize", "-m", model, "-f", path, "--batch", "--no-bos", *extra],
                       capture_output=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit("minfer tokenize failed: " + r.stderr.decode(errors="replace"))
    lines = r.stdout.decode().splitlines()
    assert len(lines) == len(texts), (len(lines), len(texts))
    return [json.loads(l) for l in lines]


def compare(name, model, texts):
    tok, pre = hf_from_gguf(model)
    fails = 0
    for parse_special, extra in ((True, ()), (False, ("--no-special",))):
        tok.encode_special_tokens = not parse_special
        got = minfer_ids(model, texts, extra)
        for s, ids in zip(texts, got):
            want = tok.encode(s, add_special_tokens=False).ids
            if ids != want:
                fails += 1
                if fails <= 8:
                    print(f"MISMATCH {name} (pre {pre}, parse_special={parse_special}) {s!r}\n"
                          f"  minfer {ids}\n  hf     {want}")
    tok.encode_special_tokens = False
    # round trip: the ids of a sample detokenize to the exact text
    rng = random.Random(7)
    sample = [s for s in rng.sample(texts, 12) if s] + ["héllo 😀 wörld\n\tok"]
    for s in sample:
        ids = tok.encode(s, add_special_tokens=False).ids
        r = subprocess.run([BIN, "detokenize", "-m", model] + [str(i) for i in ids],
                           capture_output=True, timeout=60)
        text = r.stdout.decode("utf-8")[:-1]  # detokenize ends with a newline
        if r.returncode != 0 or text != s:
            fails += 1
            print(f"ROUNDTRIP {name}: {s!r} -> {text!r} ({r.stderr.decode(errors='replace')})")
    print(f"{name}: pre {pre}, {len(texts)} strings x 2 modes, {fails} failures")
    return fails


def train_vocab(pre, texts, path):
    """A small byte-level BPE trained with HF tokenizers, written as a GGUF."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer(pre)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts * 3, trainer)
    m = json.loads(tok.to_str())["model"]
    vocab = sorted(m["vocab"].items(), key=lambda kv: kv[1])
    merges = [" ".join(x) if isinstance(x, list) else x for x in m["merges"]]
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if t in specials else 1 for t, _ in vocab])
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    texts = corpus()
    print(f"corpus: {len(texts)} strings")
    assert len(texts) >= 2000
    fails = compare("SmolLM2", MODEL, texts)

    synth = os.path.join(TMP, "tok_qwen2_synth.gguf")
    r = subprocess.run([BIN, "synth", "--arch", "qwen2", "--preset", "qwen2-0.5b", "--type", "q8_0",
                        "--layers", "1", "-o", synth], capture_output=True, timeout=600)
    if r.returncode == 0:
        fails += compare("synth-qwen2", synth, texts)
        os.remove(synth)
    else:
        print("minfer synth unavailable (" + r.stderr.decode(errors="replace").strip()[:200]
              + "); using trained vocabs only")
    train_texts = texts[:1500]
    for pre in ("qwen2", "llama3", "gpt2", "deepseek-llm"):
        path = os.path.join(TMP, f"tok_trained_{pre}.gguf")
        train_vocab(pre, train_texts, path)
        fails += compare(f"trained-{pre}", path, texts)
        os.remove(path)
    if fails:
        print(f"FAIL: {fails} mismatches")
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
