#!/usr/bin/env python3
"""Load generator for `minfer serve`: N concurrent clients for a while.

Each client loops: picks a prompt, streams or not (--stream-frac), greedy or
sampled (--greedy-frac), sends /v1/completions or /v1/chat/completions, and
records the outcome. A prober thread GETs /health every --probe-ms and keeps
its latencies. Greedy answers are checked against the same request sent
alone before the load starts (--check-greedy): any difference is reported.

Reports requests sent / answered / errored (by status), time to first token
and inter-token latency p50 / p99 (streaming requests), /health p50 / p99,
and aggregate generated tokens per second. --json writes the numbers too.
Only the standard library.
"""
import argparse
import http.client
import json
import random
import sys
import threading
import time

PROMPTS = [
    "Once upon a time, in a small village by the sea,",
    "The three most important inventions of the last century are",
    "Write a short note to a friend about the weather today.",
    "Explain in simple words how a bicycle stays upright.",
    "List five fruits and their colours:",
    "The capital of France is",
    "In the beginning of the project, the team decided to",
    "A recipe for a simple tomato soup:",
]


def pct(xs, q):
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = min(len(s) - 1, max(0, int(round(q / 100.0 * (len(s) - 1)))))
    return s[k]


def body_for(i, greedy, stream, chat, max_tokens):
    p = PROMPTS[i % len(PROMPTS)]
    b = {"max_tokens": max_tokens, "stream": stream}
    if greedy:
        b["temperature"] = 0
    else:
        b["temperature"] = 0.8
        b["seed"] = i
    if chat:
        b["messages"] = [{"role": "user", "content": p}]
    else:
        b["prompt"] = p
    return b


def send(host, port, path, body, timeout):
    """Returns (status, text, ttft_s, [inter-token gaps], n_tokens)."""
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    t0 = time.time()
    try:
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            r.read()
            return r.status, None, None, [], 0
        if not body.get("stream"):
            d = json.loads(r.read())
            ch = d["choices"][0]
            text = ch["message"]["content"] if "message" in ch else ch["text"]
            return 200, text, time.time() - t0, [], d["usage"]["completion_tokens"]
        text, ttft, gaps, last, n = [], None, [], None, 0
        buf = b""
        while True:
            line = r.fp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            ev = json.loads(data)
            if "error" in ev:
                return 500, None, ttft, gaps, n
            ch = ev["choices"][0]
            piece = ch.get("delta", {}).get("content", "") if "delta" in ch else ch.get("text", "")
            if piece:
                now = time.time()
                if ttft is None:
                    ttft = now - t0
                elif last is not None:
                    gaps.append(now - last)
                last = now
                n += 1
                text.append(piece)
            if ch.get("finish_reason"):
                n = ev.get("usage", {}).get("completion_tokens", n)
        return 200, "".join(text), ttft, gaps, n
    except Exception as e:  # noqa: BLE001 - a failed request is a result here
        return "exc:" + type(e).__name__, None, None, [], 0
    finally:
        c.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("-c", "--clients", type=int, default=32)
    ap.add_argument("-d", "--duration", type=float, default=60.0, help="seconds")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--stream-frac", type=float, default=0.5)
    ap.add_argument("--greedy-frac", type=float, default=0.5)
    ap.add_argument("--chat-frac", type=float, default=0.5)
    ap.add_argument("--probe-ms", type=float, default=200.0)
    ap.add_argument("--timeout", type=float, default=300.0, help="per request, seconds")
    ap.add_argument("--check-greedy", action="store_true", help="greedy answers must equal alone")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()

    alone = {}
    if a.check_greedy:  # the reference answers, one request at a time
        for i in range(len(PROMPTS)):
            for chat in (False, True):
                st, text, _, _, _ = send(a.host, a.port, "/v1/chat/completions" if chat else "/v1/completions",
                                         body_for(i, True, False, chat, a.max_tokens), a.timeout)
                if st != 200:
                    print("reference request failed: %r" % (st,), file=sys.stderr)
                    return 1
                alone[(i % len(PROMPTS), chat)] = text

    lock = threading.Lock()
    res = {"sent": 0, "ok": 0, "errors": {}, "ttft": [], "itl": [], "tokens": 0, "mismatch": 0,
           "greedy_checked": 0, "health": [], "health_err": 0}
    stop_at = time.time() + a.duration

    def client(k):
        rng = random.Random(k)
        n = 0
        while time.time() < stop_at:
            i = rng.randrange(len(PROMPTS))
            greedy = rng.random() < a.greedy_frac
            stream = rng.random() < a.stream_frac
            chat = rng.random() < a.chat_frac
            body = body_for(i if greedy else i + 1000 * k + n, greedy, stream, chat, a.max_tokens)
            if not chat:
                body["prompt"] = PROMPTS[i]
            else:
                body["messages"] = [{"role": "user", "content": PROMPTS[i]}]
            st, text, ttft, gaps, ntok = send(a.host, a.port, "/v1/chat/completions" if chat else "/v1/completions",
                                              body, a.timeout)
            n += 1
            with lock:
                res["sent"] += 1
                if st == 200:
                    res["ok"] += 1
                    res["tokens"] += ntok
                    if stream and ttft is not None:
                        res["ttft"].append(ttft)
                        res["itl"].extend(gaps)
                    if greedy and a.check_greedy:
                        res["greedy_checked"] += 1
                        if text != alone[(i, chat)]:
                            res["mismatch"] += 1
                else:
                    res["errors"][str(st)] = res["errors"].get(str(st), 0) + 1

    def prober():
        while time.time() < stop_at:
            t0 = time.time()
            try:
                c = http.client.HTTPConnection(a.host, a.port, timeout=10)
                c.request("GET", "/health")
                ok = c.getresponse().status == 200
                c.close()
            except Exception:  # noqa: BLE001
                ok = False
            dt = time.time() - t0
            with lock:
                if ok:
                    res["health"].append(dt)
                else:
                    res["health_err"] += 1
            time.sleep(max(0.0, a.probe_ms / 1000.0 - dt))

    t_start = time.time()
    ths = [threading.Thread(target=client, args=(k,)) for k in range(a.clients)]
    ths.append(threading.Thread(target=prober))
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    wall = time.time() - t_start
    out = {
        "clients": a.clients, "duration_s": round(wall, 2), "max_tokens": a.max_tokens,
        "sent": res["sent"], "answered": res["ok"], "errored": sum(res["errors"].values()),
        "errors": res["errors"], "tokens": res["tokens"], "agg_tok_s": round(res["tokens"] / wall, 2),
        "ttft_p50_ms": round(pct(res["ttft"], 50) * 1e3, 1), "ttft_p99_ms": round(pct(res["ttft"], 99) * 1e3, 1),
        "itl_p50_ms": round(pct(res["itl"], 50) * 1e3, 1), "itl_p99_ms": round(pct(res["itl"], 99) * 1e3, 1),
        "health_p50_ms": round(pct(res["health"], 50) * 1e3, 1),
        "health_p99_ms": round(pct(res["health"], 99) * 1e3, 1), "health_errors": res["health_err"],
        "greedy_checked": res["greedy_checked"], "greedy_mismatch": res["mismatch"],
    }
    print("clients %d, %.1f s: sent %d, answered %d, errored %d %s" % (
        a.clients, wall, out["sent"], out["answered"], out["errored"], out["errors"] or ""))
    print("generated %d tokens: %.1f t/s aggregate" % (out["tokens"], out["agg_tok_s"]))
    print("TTFT p50 %.1f ms p99 %.1f ms; inter-token p50 %.1f ms p99 %.1f ms" % (
        out["ttft_p50_ms"], out["ttft_p99_ms"], out["itl_p50_ms"], out["itl_p99_ms"]))
    print("/health p50 %.1f ms p99 %.1f ms (%d failed)" % (out["health_p50_ms"], out["health_p99_ms"],
                                                           out["health_errors"]))
    if a.check_greedy:
        print("greedy answers identical to alone: %d of %d" % (out["greedy_checked"] - out["greedy_mismatch"],
                                                               out["greedy_checked"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if out["errored"] == 0 and out["greedy_mismatch"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
