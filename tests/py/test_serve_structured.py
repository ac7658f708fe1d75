"""minfer serve's structured output against the real SmolLM2 model.

Checks, greedy and bounded by max_tokens: response_format json_object gives a
JSON object (and the streamed chunks concatenate to the same text);
json_schema output validates against its schema (jsonschema); a schema the
converter refuses is a 400 naming it; tool_choice "required" and a named
function give tool_calls whose arguments validate against that tool's
parameters, with finish_reason "tool_calls" and content null; tool_choice
"none" answers with content; "auto" returns a bare call of a known tool as
tool_calls and other JSON as content; a forced tool call with stream is a 400.
The server is killed on every exit path.
"""
import http.client
import json
import os
import subprocess
import sys
import time

import jsonschema

BIN = os.environ["MINFER_BIN"]
MODEL = os.environ["MINFER_MODEL"]
TMP = os.environ.get("MINFER_TMP", "/tmp")
HOST = "127.0.0.1"
CC = "/v1/chat/completions"
failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        failures.append(what)


def start_server():
    err_path = os.path.join(TMP, "serve_structured.%d.err" % os.getpid())
    errf = open(err_path, "w+b")
    p = subprocess.Popen([BIN, "serve", "-m", MODEL, "--host", HOST, "--port", "0", "-t", "2",
                          "-c", "512", "-np", "2"], stdout=subprocess.DEVNULL, stderr=errf)
    deadline = time.time() + 30
    while time.time() < deadline and p.poll() is None:
        with open(err_path, "rb") as f:
            for line in f.read().decode("utf-8", "replace").splitlines():
                if line.startswith("serve: listening on http://%s:" % HOST):
                    return p, int(line.rsplit(":", 1)[1])
        time.sleep(0.05)
    return p, None


def post(port, body, stream=False):
    c = http.client.HTTPConnection(HOST, port, timeout=120)
    try:
        c.request("POST", CC, body=json.dumps(body).encode(),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def chat(port, text, max_tokens=96, **extra):
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0}
    body.update(extra)
    return post(port, body)


def streamed_text(raw):
    out = ""
    for line in raw.decode().split("\n"):
        if line.startswith("data: ") and line != "data: [DONE]":
            ev = json.loads(line[6:])
            if "error" in ev:
                check(False, "stream event without error: %s" % line[:200])
            for ch in ev.get("choices", []):
                out += ch.get("delta", {}).get("content") or ""
    return out


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a timezone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 24}},
                   "required": ["tz"]}}}


CAT = 'Answer in JSON: {"name": ..., "color": ...} for a black cat named Tom.'


def main(port):
    # json_object
    st, b = chat(port, CAT,
                 response_format={"type": "json_object"})
    check(st == 200, "json_object: 200 (%d %r)" % (st, b[:200]))
    if st == 200:
        r = json.loads(b)
        text = r["choices"][0]["message"]["content"]
        check(r["choices"][0]["finish_reason"] == "stop", "json_object: finished (%r)" % text)
        try:
            v = json.loads(text)
            check(isinstance(v, dict), "json_object: a JSON object (%r)" % text)
        except ValueError:
            check(False, "json_object: parses as JSON (%r)" % text)
        # streaming with the grammar: the same greedy text
        st2, raw = chat(port, CAT,
                        response_format={"type": "json_object"}, stream=True)
        check(st2 == 200 and streamed_text(raw) == text,
              "json_object stream: same text as unstreamed (%r)" % raw[-200:])

    # json_schema
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}},
        "required": ["name", "age", "tags"]}
    st, b = chat(port, "Invent a person: give a name, an age and some tags.",
                 response_format={"type": "json_schema",
                                  "json_schema": {"name": "person", "schema": schema}})
    check(st == 200, "json_schema: 200 (%d %r)" % (st, b[:200]))
    if st == 200:
        text = json.loads(b)["choices"][0]["message"]["content"]
        try:
            jsonschema.validate(json.loads(text), schema)
            check(True, "json_schema: output validates (%r)" % text)
        except (ValueError, jsonschema.ValidationError) as e:
            check(False, "json_schema: output validates (%r: %s)" % (text, e))

    # bad constraints: 400 naming the problem
    for extra, needle in [
        ({"response_format": {"type": "json_schema", "json_schema": {
            "schema": {"type": "string", "pattern": "^a+$"}}}}, "pattern"),
        ({"response_format": {"type": "xml"}}, "xml"),
        ({"response_format": {"type": "json_schema"}}, "json_schema"),
        ({"tool_choice": "required"}, "tools"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "sometimes"),
        ({"tools": [WEATHER], "tool_choice": "required", "stream": True}, "stream"),
        ({"tools": [{"type": "function", "function": {"name": ""}}]}, "name"),
        ({"grammar": "root ::= \"a\""}, "grammar"),
    ]:
        st, b = chat(port, "hi", max_tokens=4, **extra)
        msg = ""
        try:
            msg = json.loads(b)["error"]["message"]
        except (ValueError, KeyError):
            pass
        check(st == 400 and needle in msg, "%r -> 400 naming %s (%d %r)" % (extra, needle, st, msg))

    # forced tool calls
    for choice, want in [("required", None),
                         ({"type": "function", "function": {"name": "get_time"}}, "get_time")]:
        st, b = chat(port, "What is the weather in Paris, in celsius?", max_tokens=80,
                     tools=[WEATHER, TIME], tool_choice=choice)
        check(st == 200, "tool_choice %r: 200 (%d %r)" % (choice, st, b[:200]))
        if st != 200:
            continue
        ch = json.loads(b)["choices"][0]
        msg = ch["message"]
        calls = msg.get("tool_calls") or []
        check(ch["finish_reason"] == "tool_calls" and msg["content"] is None and len(calls) == 1,
              "tool_choice %r: one tool call, content null (%r)" % (choice, ch))
        if len(calls) != 1:
            continue
        fn = calls[0]["function"]
        check(calls[0]["type"] == "function" and calls[0]["id"].startswith("call_"),
              "tool call id and type (%r)" % calls[0])
        tool = {"get_weather": WEATHER, "get_time": TIME}.get(fn["name"])
        check(tool is not None and (want is None or fn["name"] == want),
              "tool_choice %r: called %r" % (choice, fn["name"]))
        if tool:
            try:
                jsonschema.validate(json.loads(fn["arguments"]), tool["function"]["parameters"])
                check(True, "arguments validate (%s)" % fn["arguments"])
            except (ValueError, jsonschema.ValidationError) as e:
                check(False, "arguments validate (%r: %s)" % (fn["arguments"], e))

    # tool_choice auto: a whole answer that is a call of a known tool comes back
    # as tool_calls (the output is steered there by a response_format schema),
    # any other answer as content
    call_schema = {"type": "object", "properties": {
        "name": {"enum": ["get_weather"]},
        "arguments": WEATHER["function"]["parameters"]}, "required": ["name", "arguments"]}
    st, b = chat(port, "What is the weather in Paris?", max_tokens=80, tools=[WEATHER],
                 tool_choice="auto", response_format={"type": "json_schema",
                                                      "json_schema": {"schema": call_schema}})
    ch = json.loads(b)["choices"][0] if st == 200 else {}
    check(st == 200 and ch["finish_reason"] == "tool_calls" and ch["message"]["content"] is None
          and ch["message"]["tool_calls"][0]["function"]["name"] == "get_weather",
          "tool_choice auto: a bare call is tool_calls (%d %r)" % (st, b[:300]))
    st, b = chat(port, CAT, tools=[WEATHER], tool_choice="auto",
                 response_format={"type": "json_object"})
    ch = json.loads(b)["choices"][0] if st == 200 else {}
    check(st == 200 and isinstance(ch["message"]["content"], str) and
          "tool_calls" not in ch["message"], "tool_choice auto: other JSON is content (%d %r)"
          % (st, b[:300]))

    # tool_choice none: plain content
    st, b = chat(port, "Say hello.", max_tokens=8, tools=[WEATHER], tool_choice="none")
    ch = json.loads(b)["choices"][0] if st == 200 else {}
    check(st == 200 and isinstance(ch["message"]["content"], str) and
          "tool_calls" not in ch["message"], "tool_choice none: content (%d %r)" % (st, b[:200]))


def run():
    p, port = start_server()
    try:
        if not port:
            print("FAIL: the server did not start")
            return 1
        main(port)
    finally:
        p.kill()
        p.wait()
    print("%d failures" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(run())
