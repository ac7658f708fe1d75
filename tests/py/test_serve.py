"""minfer serve against the real SmolLM2 model, over loopback only.

Starts the server on 127.0.0.1 with --port 0 (the bound port is read from its
"serve: listening on" line), then checks: /health and /v1/models; greedy
completions equal `minfer run --temp 0 --no-display-prompt` byte for byte (a
fixed prompt and a random one with non-ASCII text); a chat answer names Paris;
streamed chunks concatenate to the non-streamed text (completion and chat);
stop strings cut the text in both modes; every malformed request (bad JSON,
wrong types, invalid UTF-8, too-long prompt, unknown path, wrong method, no
Content-Length, oversized body, garbage request line, random bytes) gets the
right status and a JSON error naming the problem, and the server still answers
afterwards; a request queued behind a streaming one is served; SIGTERM exits 0.
Every request has a timeout and the server is killed on any exit path.
"""
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

BIN = os.environ["MINFER_BIN"]
MODEL = os.environ["MINFER_MODEL"]
TMP = os.environ.get("MINFER_TMP", "/tmp")
HOST = "127.0.0.1"
CTX = 256
T_REQ = 30  # seconds, per request

checks = 0
failures = []


def ok(what, since):
    """Prints an ok line when no check failed since the failure count `since`."""
    if len(failures) == since:
        print("ok:", what)


def check(cond, what):
    global checks
    checks += 1
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def start_server():
    err_path = os.path.join(TMP, "serve.%d.err" % os.getpid())
    errf = open(err_path, "w+b")
    p = subprocess.Popen([BIN, "serve", "-m", MODEL, "--host", HOST, "--port", "0", "-t", "2",
                          "-c", str(CTX), "--timeout", "5"],
                         stdout=subprocess.DEVNULL, stderr=errf)
    deadline = time.time() + 30
    port = None
    while time.time() < deadline and p.poll() is None:
        with open(err_path, "rb") as f:
            for line in f.read().decode("utf-8", "replace").splitlines():
                if line.startswith("serve: listening on http://%s:" % HOST):
                    port = int(line.rsplit(":", 1)[1])
        if port:
            break
        time.sleep(0.05)
    return p, port, err_path


def request(port, method, path, body=None, headers=None):
    """(status, headers dict, body bytes) of one request."""
    c = http.client.HTTPConnection(HOST, port, timeout=T_REQ)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def raw(port, data, shut=True):
    """Sends bytes as they are; returns (status, body bytes) of the answer."""
    s = socket.create_connection((HOST, port), timeout=T_REQ)
    try:
        s.sendall(data)
        if shut:
            s.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            k = s.recv(65536)
            if not k:
                break
            out += k
    finally:
        s.close()
    head, _, body = out.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/1.1 ") else -1
    return status, body


def post(port, path, obj):
    st, h, body = request(port, "POST", path, obj, {"Content-Type": "application/json"})
    return st, h, body


def sse_events(body):
    """The data payloads of a text/event-stream body."""
    events = []
    for block in body.decode("utf-8").split("\n\n"):
        if block.strip():
            check(block.startswith("data: "), "SSE block does not start with 'data: ': %r" % block[:80])
            events.append(block[len("data: "):])
    return events


def expect_error(port, status, what, needle, *args, **kw):
    if args and args[0] == "raw":
        st, body = raw(port, *args[1:], **kw)
    else:
        st, _, body = request(port, *args, **kw)
    check(st == status, "%s: status %d, expected %d (%r)" % (what, st, status, body[:200]))
    try:
        e = json.loads(body)["error"]
        good = isinstance(e["message"], str) and e["code"] == status and isinstance(e["type"], str)
        check(good, "%s: error body lacks message/type/code: %r" % (what, body[:200]))
        check(needle.lower() in e["message"].lower(),
              "%s: error message %r does not mention %r" % (what, e["message"], needle))
    except (ValueError, KeyError, TypeError):
        check(False, "%s: error body is not JSON {error: ...}: %r" % (what, body[:200]))


def run_greedy(prompt, n):
    r = subprocess.run([BIN, "run", "-m", MODEL, "-p", prompt, "-n", str(n), "--temp", "0",
                        "--no-display-prompt", "-t", "2", "-c", str(CTX)],
                       capture_output=True, timeout=60)
    check(r.returncode == 0, "minfer run failed: %r" % r.stderr[-300:])
    out = r.stdout
    check(out.endswith(b"\n"), "minfer run output does not end with its newline")
    return out[:-1]


def main():
    seed = int(os.environ.get("MINFER_TEST_SEED", str(int(time.time()) % 100000)))
    rng = random.Random(seed)
    print("seed", seed)
    t_start = time.time()
    p, port, err_path = start_server()
    try:
        if not port:
            with open(err_path, "rb") as f:
                print(f.read().decode("utf-8", "replace"))
            check(False, "the server did not print its listening line")
            return
        print("server on port", port)
        body_checks(port, rng)
        # SIGTERM: a clean exit with status 0.
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            rc = None
        check(rc == 0, "SIGTERM: exit status %r, expected 0" % rc)
        with open(err_path, "rb") as f:
            log = f.read().decode("utf-8", "replace")
        check("serve: shutting down" in log, "no shutdown line on stderr")
        check("Sanitizer" not in log and "Segmentation" not in log, "crash report in stderr")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
        if failures:
            with open(err_path, "rb") as f:
                print("--- server stderr (tail):")
                print(f.read()[-3000:].decode("utf-8", "replace"))
        os.remove(err_path)
    took = time.time() - t_start
    print("took %.1f s" % took)
    check(took < 60, "the test took %.1f s (limit 60)" % took)


def body_checks(port, rng):
    # ---- health and models
    st, h, body = request(port, "GET", "/health")
    check(st == 200 and json.loads(body) == {"status": "ok"}, "/health: %d %r" % (st, body))
    check(h.get("content-type") == "application/json", "/health content-type %r" % h.get("content-type"))
    st, _, body = request(port, "GET", "/v1/models")
    mid = os.path.basename(MODEL)[:-len(".gguf")]
    good = st == 200 and json.loads(body)["data"][0]["id"] == mid
    check(good, "/v1/models: %d %r (expected id %r)" % (st, body, mid))

    # ---- greedy completions equal `minfer run`
    words = ["river", "café", "naïve", "Zürich", "東京", "ocean", "music", "über", "garden",
             "the", "of", "old", "light", "résumé", "jalapeño", "piano"]
    rand_prompt = " ".join(rng.choice(words) for _ in range(rng.randint(4, 9)))
    cases = [("The capital of France is", 24), (rand_prompt, rng.randint(8, 20))]
    texts = {}
    for prompt, n in cases:
        f0 = len(failures)
        st, _, body = post(port, "/v1/completions",
                           {"prompt": prompt, "max_tokens": n, "temperature": 0})
        check(st == 200, "completion %r: status %d %r" % (prompt, st, body[:200]))
        if st != 200:
            continue
        r = json.loads(body)
        text = r["choices"][0]["text"]
        texts[prompt] = (text, n)
        want = run_greedy(prompt, n)
        check(text.encode("utf-8") == want,
              "greedy completion of %r differs from minfer run:\n  serve %r\n  run   %r" %
              (prompt, text, want.decode("utf-8", "replace")))
        check(r["object"] == "text_completion" and r["id"].startswith("cmpl-") and
              isinstance(r["created"], int) and r["model"], "completion envelope: %r" % r)
        u = r["usage"]
        check(u["completion_tokens"] <= n and u["prompt_tokens"] > 0 and
              u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], "usage %r" % u)
        fr = r["choices"][0]["finish_reason"]
        check(fr == ("length" if u["completion_tokens"] == n else "stop"),
              "finish_reason %r with %d of %d tokens" % (fr, u["completion_tokens"], n))
        ok("greedy %r -> %r" % (prompt, text), f0)

    # ---- streaming completion = non-streamed text
    prompt = cases[0][0]
    if prompt in texts:
        f0 = len(failures)
        full, n = texts[prompt]
        st, h, body = post(port, "/v1/completions",
                           {"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True})
        check(st == 200 and h.get("content-type") == "text/event-stream",
              "stream: %d %r" % (st, h.get("content-type")))
        ev = sse_events(body)
        check(ev and ev[-1] == "[DONE]", "stream does not end with [DONE]: %r" % ev[-2:])
        chunks = [json.loads(e) for e in ev[:-1]]
        got = "".join(c["choices"][0]["text"] for c in chunks)
        check(got == full, "streamed text %r != non-streamed %r" % (got, full))
        check(len(chunks) >= 3, "only %d chunks streamed" % len(chunks))
        check(chunks[-1]["choices"][0]["finish_reason"] == "length" and
              all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1]),
              "finish_reason only on the last chunk")
        check(all(c["object"] == "text_completion" for c in chunks), "chunk object names")
        ok("%d streamed chunks concatenate to the completion" % len(chunks), f0)

        # ---- stop strings cut the text where they start, streamed or not
        # A stop string across a token boundary ("es h" of "States has"):
        # streaming must hold back "es" until it knows the match.
        ws = full.split(" ")
        pairs = [(a, b) for a, b in zip(ws, ws[1:]) if len(a) >= 2 and a.isalpha() and b[:1].isalpha()]
        check(len(pairs) > 0, "no word pair in %r to make a stop string from" % full)
        if pairs:
            a, b = pairs[len(pairs) // 2]
            stop = a[-2:] + " " + b[0]
            cut = full[:full.index(stop)]
            f0 = len(failures)
            for stream in (False, True):
                st, _, body = post(port, "/v1/completions",
                                   {"prompt": prompt, "max_tokens": n, "temperature": 0,
                                    "stop": ["\u2603 never", stop], "stream": stream})
                if stream:
                    ev = sse_events(body)
                    chunks = [json.loads(e) for e in ev[:-1]]
                    got = "".join(c["choices"][0]["text"] for c in chunks)
                    fr = chunks[-1]["choices"][0]["finish_reason"]
                else:
                    r = json.loads(body)
                    got, fr = r["choices"][0]["text"], r["choices"][0]["finish_reason"]
                check(st == 200 and got == cut and fr == "stop",
                      "stop %r (stream %s): %r / %r, expected %r / stop" % (stop, stream, got, fr, cut))
            ok("stop string %r cuts the text to %r" % (stop, cut), f0)

    # ---- chat
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    f0 = len(failures)
    st, _, body = post(port, "/v1/chat/completions",
                       {"messages": msgs, "max_tokens": 48, "temperature": 0})
    check(st == 200, "chat: status %d %r" % (st, body[:200]))
    if st == 200:
        r = json.loads(body)
        m = r["choices"][0]["message"]
        check(r["object"] == "chat.completion" and m["role"] == "assistant", "chat envelope %r" % r)
        check("Paris" in m["content"], "chat answer does not mention Paris: %r" % m["content"])
        ok("chat answer %r" % m["content"], f0)
        st, _, body = post(port, "/v1/chat/completions",
                           {"messages": msgs, "max_tokens": 48, "temperature": 0, "stream": True})
        ev = sse_events(body)
        chunks = [json.loads(e) for e in ev[:-1]]
        check(ev[-1] == "[DONE]" and chunks[0]["choices"][0]["delta"].get("role") == "assistant",
              "chat stream opening / [DONE]")
        got = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        check(got == m["content"], "streamed chat %r != %r" % (got, m["content"]))
        check(all(c["object"] == "chat.completion.chunk" for c in chunks), "chat chunk object")
        ok("streamed chat concatenates to the answer", f0)

    # ---- a request queued behind a streaming one is served, not refused
    results = {}

    def slow():
        results["stream"] = post(port, "/v1/completions",
                                 {"prompt": "Once upon a time", "max_tokens": 32,
                                  "temperature": 0, "stream": True})[0]
    th = threading.Thread(target=slow)
    th.start()
    time.sleep(0.05)
    results["health"] = request(port, "GET", "/health")[0]
    th.join(T_REQ)
    check(results == {"stream": 200, "health": 200}, "queued requests: %r" % results)

    # ---- errors: right status, JSON body naming the problem
    C, CC = "/v1/completions", "/v1/chat/completions"
    f0 = len(failures)
    J = {"Content-Type": "application/json"}
    expect_error(port, 400, "malformed JSON", "malformed JSON", "POST", C, b'{"prompt": "hi",', J)
    expect_error(port, 400, "trailing comma", "malformed JSON", "POST", C, b'{"prompt": "hi",}', J)
    expect_error(port, 400, "body not an object", "object", "POST", C, b'["hi"]', J)
    expect_error(port, 400, "empty body", "body", "POST", C, b"", J)
    expect_error(port, 400, "prompt a number", "prompt", "POST", C, {"prompt": 5})
    expect_error(port, 400, "prompt missing", "prompt", "POST", C, {"max_tokens": 5})
    expect_error(port, 400, "max_tokens a string", "max_tokens", "POST", C,
                 {"prompt": "hi", "max_tokens": "ten"})
    expect_error(port, 400, "max_tokens fractional", "max_tokens", "POST", C,
                 {"prompt": "hi", "max_tokens": 2.5})
    expect_error(port, 400, "max_tokens negative", "max_tokens", "POST", C,
                 {"prompt": "hi", "max_tokens": -3})
    expect_error(port, 400, "temperature a string", "temperature", "POST", C,
                 {"prompt": "hi", "temperature": "hot"})
    expect_error(port, 400, "top_p out of range", "top_p", "POST", C, {"prompt": "hi", "top_p": 1.5})
    expect_error(port, 400, "stream a string", "stream", "POST", C, {"prompt": "hi", "stream": "yes"})
    expect_error(port, 400, "stop a number", "stop", "POST", C, {"prompt": "hi", "stop": 7})
    expect_error(port, 400, "NUL in prompt", "NUL", "POST", C, {"prompt": "a\u0000b"})
    expect_error(port, 400, "messages an object", "messages", "POST", CC, {"messages": {"role": "user"}})
    expect_error(port, 400, "message role wrong", "role", "POST", CC,
                 {"messages": [{"role": "wizard", "content": "hi"}]})
    expect_error(port, 400, "message content a number", "content", "POST", CC,
                 {"messages": [{"role": "user", "content": 3}]})
    expect_error(port, 400, "invalid UTF-8", "UTF-8", "POST", C, b'{"prompt": "caf\xc3("}', J)
    expect_error(port, 400, "lone surrogate", "surrogate", "POST", C, b'{"prompt": "\\ud800"}', J)
    expect_error(port, 400, "deep nesting", "nesting", "POST", C, b"[" * 100000 + b"]" * 100000, J)
    long_prompt = " ".join(rng.choice(words) for _ in range(CTX * 2))
    expect_error(port, 400, "prompt longer than the context", "context", "POST", C,
                 {"prompt": long_prompt, "max_tokens": 4})
    expect_error(port, 404, "unknown path", "/v1/nothing", "GET", "/v1/nothing")
    expect_error(port, 405, "GET on completions", "POST", "GET", C)
    expect_error(port, 405, "POST on health", "GET", "POST", "/health", b"{}", J)
    expect_error(port, 413, "oversized body", "exceeds", "POST", C,
                 b'{"prompt": "' + b"a" * (2 << 20) + b'"}', J)
    expect_error(port, 413, "oversized Content-Length", "exceeds", "raw",
                 b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000000\r\n\r\n{}")
    expect_error(port, 411, "POST without Content-Length", "Content-Length", "raw",
                 b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n")
    expect_error(port, 400, "garbage request line", "request line", "raw", b"HELLO\r\n\r\n")
    expect_error(port, 400, "short body", "body bytes", "raw",
                 b"POST /v1/completions HTTP/1.1\r\nContent-Length: 50\r\n\r\n{\"prompt\"")
    expect_error(port, 505, "HTTP/2.0", "version", "raw", b"GET /health HTTP/2.0\r\n\r\n")
    expect_error(port, 431, "huge head", "exceed", "raw",
                 b"GET /health HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n")
    for i in range(8):  # random bytes as a body: a 400, never a crash
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 300)))
        st, _, body = request(port, "POST", C, junk, J)
        check(st == 400 and b'"error"' in body, "random body %d: %d %r" % (i, st, body[:100]))
    ok("error cases", f0)

    # ---- still serving
    st, _, body = request(port, "GET", "/health")
    check(st == 200, "health after the bad requests: %d" % st)
    st, _, body = post(port, C, {"prompt": "Hello", "max_tokens": 3, "temperature": 0.7, "seed": 42,
                                 "top_k": 20, "top_p": 0.9, "min_p": 0.01})
    check(st == 200 and json.loads(body)["usage"]["completion_tokens"] <= 3,
          "sampled completion after the bad requests: %d %r" % (st, body[:200]))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # a crash of the test itself is a failure, with the server killed
        import traceback
        traceback.print_exc()
        failures.append("exception: %r" % e)
    print("%d checks, %d failed" % (checks, len(failures)))
    sys.exit(1 if failures else 0)
