"""Generation text on the CLI: long pieces are never cut, and an answer cut
by the token limit inside a UTF-8 character does not end in U+FFFD.

A tiny synth llama generates one greedy token after "hello" (the token of
byte 'C' for this seed). The file is then rewritten with only that token's
text changed, so the weights and therefore the greedy choice are the same:
  1. a 5,000-byte piece: the CLI prints all 5,000 bytes (the text buffer was
     a fixed 1,100 bytes);
  2. the first two bytes of a three-byte character: `run -n 1` stops inside
     it and prints nothing for it (not the U+FFFD the model never produced).
The rewrite uses the layout-exact GGUF reader/writer of fuzz/mutate_run.py.
"""
import http.client
import json
import os
import subprocess
import sys
import time

SRC = os.environ.get("MINFER_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SRC, "fuzz"))
import mutate_run as gg  # noqa: E402

BIN = os.environ["MINFER_BIN"]
TMP = os.environ.get("MINFER_TMP", "/tmp")


def gen(path, prompt, n):
    p = subprocess.run([BIN, "run", "-m", path, "-p", prompt, "-n", str(n), "--temp", "0", "-t", "1"],
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    return p.stdout


def serve_text(path, prompt, n):
    """The server's /v1/completions text of n greedy tokens after prompt."""
    err_path = os.path.join(TMP, f"gen_text_{os.getpid()}.serve.err")
    with open(err_path, "w+b") as errf:
        p = subprocess.Popen([BIN, "serve", "-m", path, "--host", "127.0.0.1", "--port", "0", "-t", "1",
                              "-c", "64"], stdout=subprocess.DEVNULL, stderr=errf)
    try:
        port, deadline = None, time.time() + 30
        while port is None and time.time() < deadline and p.poll() is None:
            with open(err_path, "rb") as f:
                for line in f.read().decode("utf-8", "replace").splitlines():
                    if line.startswith("serve: listening on http://127.0.0.1:"):
                        port = int(line.rsplit(":", 1)[1])
            time.sleep(0.05)
        assert port, open(err_path, "rb").read().decode(errors="replace")
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        c.request("POST", "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0}),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        body = r.read()
        assert r.status == 200, body
        return json.loads(body)["choices"][0]["text"]
    finally:
        p.terminate()
        p.wait(timeout=30)
        os.unlink(err_path)


def gpt2_symbols(bs):
    """The GPT-2 byte-level symbols of bytes bs (the vocab's spelling)."""
    keep = set(range(0x21, 0x7f)) | set(range(0xa1, 0xad)) | set(range(0xae, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + extra)
            extra += 1
    return "".join(table[b] for b in bs).encode()


def main():
    base = os.path.join(TMP, f"gen_text_{os.getpid()}.gguf")
    subprocess.run([BIN, "synth", "--arch", "llama", "--dim", "32", "--layers", "1", "--ff", "32", "--heads", "2",
                    "--kv-heads", "1", "--vocab", "259", "--ctx", "64", "--type", "f32", "-o", base],
                   check=True, capture_output=True)
    out = gen(base, "hello", 1)
    assert out.startswith(b"hello") and out.endswith(b"\n"), out
    piece = out[len(b"hello"):-1]
    assert len(piece) == 1, f"expected one byte token after 'hello', got {piece!r}"
    g0 = gg.Gguf.parse(open(base, "rb").read())
    tid = g0.kv(b"tokenizer.ggml.tokens")[2][1].index(gpt2_symbols(piece))

    def with_text(text, name):
        g = gg.Gguf.parse(open(base, "rb").read())
        g.kv(b"tokenizer.ggml.tokens")[2][1][tid] = text
        p = os.path.join(TMP, f"gen_text_{os.getpid()}_{name}.gguf")
        with open(p, "wb") as f:
            f.write(g.write())
        return p

    long_path = with_text(b"x" * 5000, "long")
    out = gen(long_path, "hello", 1)
    assert out == b"hello" + b"x" * 5000 + b"\n", f"long piece: {len(out)} bytes printed"

    cut_path = with_text(gpt2_symbols(b"\xe4\xbd"), "cut")  # 2 of the 3 bytes of U+4F60
    out = gen(cut_path, "hello", 1)
    assert b"\xef\xbf\xbd" not in out, f"U+FFFD printed for a character cut by -n: {out!r}"
    assert out == b"hello\n", out

    # the server: the same two cases through /v1/completions
    text = serve_text(long_path, "hello", 1)
    assert text == "x" * 5000, f"server, long piece: {len(text)} characters"
    text = serve_text(cut_path, "hello", 1)
    assert "\ufffd" not in text and text == "", f"server, cut character: {text!r}"
    for p in (base, long_path, cut_path):
        os.unlink(p)
    print("ok: 5000-byte piece whole and cut character dropped, CLI and server")


if __name__ == "__main__":
    main()
