"""A GGUF whose tokenizer.chat_template cannot render is an error at load,
naming the template's problem and place; `serve --chat-template bogus` fails
at start. The broken templates are made by patching a synthetic model's
ChatML template in place with text of the same length."""
import os
import subprocess
import sys

BIN = os.environ["MINFER_BIN"]
TMP = os.environ.get("MINFER_TMP", "/tmp")

GOOD = b"message['content']"
CASES = [
    # (replacement for GOOD or a tag, what the error must name)
    (b"{% endfor %}", b"{% endfoo %}", [b"tokenizer.chat_template", b"unknown tag 'endfoo'"]),
    (GOOD, b"message['contenx']", [b"cannot render one user message", b"undefined"]),
    (b"{% if add_generation_prompt %}", b"{% if add_generation_prompt )}", [b"tokenizer.chat_template", b"1:"]),
]


def run(args, timeout=120):
    return subprocess.run([BIN] + args, capture_output=True, timeout=timeout)


def main():
    base = os.path.join(TMP, "tmpl_base.gguf")
    r = run(["synth", "--arch", "llama", "--dim", "64", "--layers", "1", "--ff", "128", "--heads", "4",
             "--kv-heads", "2", "--vocab", "512", "--ctx", "128", "-o", base])
    if r.returncode:
        sys.exit("synth failed: %s" % r.stderr.decode())
    data = open(base, "rb").read()
    fails = 0
    # The untouched model loads and chats.
    r = run(["run", "-m", base, "--chat", "-p", "hi", "-n", "1", "--temp", "0"])
    if r.returncode:
        print("FAIL: the good model does not run: %s" % r.stderr.decode())
        fails += 1
    for old, new, want in CASES:
        assert len(old) == len(new) and data.count(old) == 1, old
        path = os.path.join(TMP, "tmpl_bad.gguf")
        open(path, "wb").write(data.replace(old, new))
        r = run(["run", "-m", path, "--chat", "-p", "hi", "-n", "1"])
        err = r.stderr.strip()
        ok = r.returncode != 0 and all(w in err for w in want) and b"\n" not in err
        print("%s: %s -> exit %d: %s" % ("ok" if ok else "FAIL", new.decode(), r.returncode, err.decode()))
        fails += not ok
        # A built-in override does not need the GGUF's template.
        r = run(["run", "-m", path, "--chat", "--chat-template", "chatml", "-p", "hi", "-n", "1"])
        ok = r.returncode == 0
        print("%s: the same with --chat-template chatml -> exit %d" % ("ok" if ok else "FAIL", r.returncode))
        fails += not ok
    r = run(["serve", "-m", base, "--chat-template", "bogus", "--port", "0"], timeout=30)
    ok = r.returncode != 0 and b"unknown template 'bogus'" in r.stderr
    print("%s: serve --chat-template bogus -> exit %d: %s" % ("ok" if ok else "FAIL", r.returncode,
                                                                r.stderr.decode().strip()))
    fails += not ok
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
