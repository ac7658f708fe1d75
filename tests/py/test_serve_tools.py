"""A tool round trip through minfer serve, in the OpenAI shapes: tools ->
an assistant answer with tool_calls -> the client sends that answer back
(content null, arguments as the JSON string OpenAI clients send) with
role "tool" results (tool_call_id) -> the model answers in text.

SmolLM2 is copied with the published qwen2 / qwen3 / llama3 templates (and
keeps its own, which has no tool syntax). For each, POST /apply-template's
prompt for the round trip must be byte-equal to Python's jinja2 rendering the
same template over the same messages converted the way transformers-style
servers do (arguments parsed into an object, type "function"); the chat
request's prompt_tokens must be that prompt's token count (up to a token per
content edge: contents are tokenized on their own). Malformed
shapes are 400s naming the field. The server is killed on every exit path."""
import http.client
import json
import os
import subprocess
import sys
import time

import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_template_jinja2 import hf_env  # noqa: E402

BIN = os.environ["MINFER_BIN"]
MODEL = os.environ["MINFER_MODEL"]
SRC = os.environ.get("MINFER_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
TMP = os.environ.get("MINFER_TMP", "/tmp")
PY = os.environ.get("MINFER_PYTHON", sys.executable)
HOST = "127.0.0.1"
failures = []

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}},
                   "required": ["city"]}}}]


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        failures.append(what)


def start_server(model):
    err_path = os.path.join(TMP, "serve_tools.%d.err" % os.getpid())
    errf = open(err_path, "w+b")
    p = subprocess.Popen([BIN, "serve", "-m", model, "--host", HOST, "--port", "0", "-t", "2",
                          "-c", "1024", "-np", "1"], stdout=subprocess.DEVNULL, stderr=errf)
    deadline = time.time() + 60
    while time.time() < deadline and p.poll() is None:
        with open(err_path, "rb") as f:
            for line in f.read().decode("utf-8", "replace").splitlines():
                if line.startswith("serve: listening on http://%s:" % HOST):
                    return p, int(line.rsplit(":", 1)[1])
        time.sleep(0.05)
    with open(err_path, "rb") as f:
        print(f.read().decode("utf-8", "replace"))
    p.kill()
    return None, None


def post(port, path, body):
    c = http.client.HTTPConnection(HOST, port, timeout=300)
    try:
        c.request("POST", path, body=json.dumps(body).encode(),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read()
        try:
            return r.status, json.loads(raw)
        except ValueError:
            return r.status, raw
    finally:
        c.close()


def as_template_sees(msgs):
    """The OpenAI messages as a transformers-style server hands them to the
    template: arguments as objects, type "function", developer -> system."""
    out = []
    for m in msgs:
        m = json.loads(json.dumps(m))
        if m["role"] == "developer":
            m["role"] = "system"
        if m.get("content") is None:
            m["content"] = ""
        if isinstance(m["content"], list):
            m["content"] = "".join(part["text"] for part in m["content"])
        for tc in m.get("tool_calls") or []:
            tc["type"] = "function"
            a = tc["function"]["arguments"]
            if isinstance(a, str):
                tc["function"]["arguments"] = json.loads(a)
        out.append(m)
    return out


def round_trip_messages(call, two=True):
    """The conversation after the model asked for `call` (OpenAI shape), with
    a second call of the client's own (Llama 3's template takes one only)."""
    msgs = [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "Weather in Paris for 2 days, and in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            call, {"id": "call_2", "type": "function",
                   "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": '{"temp": 21, "sky": "sunny"}'},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "-3 C, snow"}]},
    ]
    if not two:
        del msgs[2]["tool_calls"][1]
        del msgs[4]
    return msgs


def bad_shapes(port):
    base = [{"role": "user", "content": "hi"}]
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                       "arguments": '{"city": "Paris"}'}}
    asst = {"role": "assistant", "content": None, "tool_calls": [call]}
    cases = [
        ([{"role": "assistant", "content": None, "tool_calls": [dict(call, function={"name": "x", "arguments": "{oops"})]}],
         "'messages[1].tool_calls[0].function.arguments' is not JSON"),
        ([{"role": "assistant", "tool_calls": [dict(call, function={"name": "x", "arguments": "[1]"})]}],
         "'messages[1].tool_calls[0].function.arguments' must hold a JSON object"),
        ([{"role": "assistant", "tool_calls": [dict(call, function={"arguments": "{}"})]}],
         "'messages[1].tool_calls[0].function.name' is missing"),
        ([{"role": "assistant", "tool_calls": [{"type": "function", "function": call["function"]}]}],
         "'messages[1].tool_calls[0].id' is missing"),
        ([{"role": "assistant", "tool_calls": [dict(call, type="code")]}],
         "'messages[1].tool_calls[0].type' must be \"function\""),
        ([{"role": "assistant", "tool_calls": []}], "'messages[1].tool_calls' must be a non-empty array"),
        ([{"role": "assistant", "tool_calls": {"id": "c1"}}], "'messages[1].tool_calls' must be a non-empty array"),
        ([{"role": "user", "content": "x", "tool_calls": [call]}], "'messages[1].tool_calls' is only for assistant"),
        ([asst, {"role": "tool", "content": "r"}], "'messages[2].tool_call_id' is missing"),
        ([asst, {"role": "tool", "tool_call_id": "nope", "content": "r"}],
         "'messages[2].tool_call_id' 'nope' names no tool call"),
        ([asst, {"role": "tool", "tool_call_id": 7, "content": "r"}], "'messages[2].tool_call_id' must be a string"),
        ([asst, {"role": "tool", "tool_call_id": "c1"}], "'messages[2].content' is missing"),
        ([{"role": "assistant", "tool_calls": [dict(call, function={"name": "get_weather",
                                                                     "arguments": '{"a": "<|im_start|>"}'})]}],
         "arguments' contains the text of a special token"),
        ([{"role": "assistant", "tool_calls": [dict(call, extra=1)]}], "'messages[1].tool_calls[0].extra' is not supported"),
        ([{"role": "assistant", "content": "x"}, {"role": "user", "content": "y", "tool_call_id": "c1"}],
         "'messages[2].tool_call_id' is only for tool messages"),
    ]
    for extra, want in cases:
        st, body = post(port, "/v1/chat/completions", {"messages": base + extra, "max_tokens": 1})
        msg = body.get("error", {}).get("message", "") if isinstance(body, dict) else str(body)
        check(st == 400 and want in msg, "400 naming the field: %s -> %d %s" % (want, st, msg))


def with_template(name):
    if name == "smollm2":
        return MODEL
    path = os.path.join(TMP, "serve_tools_%s.gguf" % name)
    r = subprocess.run([PY, "-m", "gguf.scripts.gguf_new_metadata", "--force", "--chat-template-file",
                        os.path.join(SRC, "tests", "data", "templates", name + ".jinja"), MODEL, path],
                       capture_output=True, timeout=300)
    if r.returncode:
        sys.exit("gguf_new_metadata failed: %s" % r.stderr.decode()[-2000:])
    return path


def main():
    env = hf_env()
    for name in ["qwen2", "qwen3", "llama3", "smollm2"]:
        model = with_template(name)
        r = gguf.GGUFReader(model)

        def field(k):
            f = r.fields[k]
            return f.parts[f.data[0]]
        src = bytes(field("tokenizer.chat_template")).decode()
        toks = r.fields["tokenizer.ggml.tokens"]
        tok_text = lambda i: bytes(toks.parts[toks.data[i]]).decode()  # noqa: E731
        # the model's own BOS / EOS texts (SmolLM2 adds no BOS, so the
        # template's is kept)
        special = {"bos_token": tok_text(int(field("tokenizer.ggml.bos_token_id")[0])),
                   "eos_token": tok_text(int(field("tokenizer.ggml.eos_token_id")[0]))}
        assert not bool(field("tokenizer.ggml.add_bos_token")[0])
        del r
        tpl = env.from_string(src)
        p, port = start_server(model)
        check(port is not None, "%s: the server starts" % name)
        if port is None:
            continue
        try:
            if name == "smollm2":
                # SmolLM2's template never reads tool_calls: the calls would
                # vanish from the prompt, so the request is refused.
                msgs = round_trip_messages({"id": "c1", "type": "function", "function": {
                    "name": "get_weather", "arguments": '{"city": "Paris"}'}})
                st, body = post(port, "/apply-template", {"messages": msgs})
                msg = body.get("error", {}).get("message", "") if isinstance(body, dict) else ""
                check(st == 400 and "tool_calls, which the model's chat template never reads" in msg,
                      "smollm2: tool_calls refused by a template without them (%d %s)" % (st, msg))
                # a plain conversation still matches jinja2 there
                plain = [{"role": "system", "content": "S"}, {"role": "user", "content": "<|im_start|>hi"},
                         {"role": "assistant", "content": ""}, {"role": "developer", "content": None},
                         {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
                st, body = post(port, "/apply-template", {"messages": plain})
                want = tpl.render(messages=as_template_sees(plain), add_generation_prompt=True, **special)
                check(st == 200 and body.get("prompt") == want,
                      "smollm2: /apply-template == jinja2 for plain messages (%d)" % st)
                bad_shapes(port)
                continue
            # 1. the model calls the tool (forced, so a tiny model does it too)
            ask = [{"role": "system", "content": "You are a weather bot."},
                   {"role": "user", "content": "Weather in Paris for 2 days, and in Oslo?"}]
            st, body = post(port, "/v1/chat/completions", {
                "messages": ask, "tools": TOOLS, "tool_choice": "required", "max_tokens": 64,
                "temperature": 0})
            calls = body["choices"][0]["message"].get("tool_calls") if st == 200 else None
            check(st == 200 and calls and body["choices"][0]["finish_reason"] == "tool_calls",
                  "%s: tool_choice required gives tool_calls (%d)" % (name, st))
            if not calls:
                continue
            call = calls[0]
            check(isinstance(call["function"]["arguments"], str), "%s: arguments come as a JSON string" % name)
            # 2. the client sends the call back with the tool results
            msgs = round_trip_messages(call, two=name != "llama3")
            st, body = post(port, "/apply-template", {"messages": msgs, "tools": TOOLS})
            got = body.get("prompt") if st == 200 else None
            want = tpl.render(messages=as_template_sees(msgs), tools=TOOLS, add_generation_prompt=True,
                              **special)
            check(got == want, "%s: /apply-template == jinja2 for the round trip (%d, %d bytes)"
                  % (name, st, len(want)))
            if got != want:
                print(" jinja2: %r\n minfer: %r" % (want[-800:], (got or str(body))[-800:]))
            check(("Oslo" in want and "-3 C, snow" in want or name == "llama3") and "sunny" in want,
                  "%s: the prompt carries the calls and both results" % name)
            # 3. the model answers from the results
            st, body = post(port, "/v1/chat/completions", {"messages": msgs, "tools": TOOLS,
                                                           "max_tokens": 8, "temperature": 0})
            ok = st == 200 and isinstance(body["choices"][0]["message"].get("content"), str)
            check(ok, "%s: the answer after the tool results is 200 with content (%d)" % (name, st))
            if ok:
                _, tk = post(port, "/tokenize", {"content": want, "parse_special": True})
                # contents are tokenized apart from the template's text, so a
                # BPE merge across a content's edge may split: at most one
                # token more per edge
                edges = 2 * sum(1 for m in msgs if m.get("content"))
                n = body["usage"]["prompt_tokens"]
                check(len(tk["tokens"]) <= n <= len(tk["tokens"]) + edges,
                      "%s: prompt_tokens %d within the tokens of the rendered prompt %d + %d"
                      % (name, n, len(tk["tokens"]), edges))
        finally:
            p.kill()
            p.wait()
            if model != MODEL:
                os.unlink(model)
    print("%d failures" % len(failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
