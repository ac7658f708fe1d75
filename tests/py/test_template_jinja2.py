"""Chat templates rendered by minfer's Jinja interpreter compared byte for
byte with Python's jinja2 set up as Hugging Face's apply_chat_template sets
it up (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, raise_exception, tojson = json.dumps(ensure_ascii=False)).

Templates: SmolLM2's own (read from the model's GGUF with the gguf package),
the published qwen2 / qwen3 / llama3 / gemma / phi3 / mistral templates in
tests/data/templates, and features.jinja (every construct we claim). Each
is rendered over many generated conversations: system messages in every
position, multi-turn, tools and tool calls, add_generation_prompt on and off,
unicode and whitespace at the edges. Where jinja2 raises (raise_exception,
an undefined attribute, ...) minfer must fail too."""
import json
import os
import random
import subprocess
import sys

import gguf
import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

SRC = os.environ.get("MINFER_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("MINFER_BUILD", os.path.join(SRC, "build"))
MODEL = os.environ.get("MINFER_MODEL", os.path.join(SRC, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
TMP = os.environ.get("MINFER_TMP", "/tmp")
TOOL = os.path.join(BUILD, "tests", "template_render")
CASES_PER_TEMPLATE = int(os.environ.get("MINFER_TEMPLATE_CASES", "400"))


def hf_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


TEXTS = ["Hello!", "What is the capital of France?", "  padded with spaces  ", "\nnewlines\n\n",
         "héllo wörld ✓", "日本語のテキスト", "emoji 🎉 here", "quotes ' and \" inside", "tab\tseparated",
         "<think>\nreasoning here\n</think>\n\nThe answer is 4.", "", "multi\nline\ncontent",
         "<tool_response>x</tool_response>", "He said: {{ not a tag }}", "back\\slash", "x" * 300]

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
                    "days": {"type": "integer"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Søg på nettet — unicode",
     "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "safe": {"type": "boolean"},
                    "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["q", "safe"]},
     "return": {"type": "string"}}},
]


def tool_call(rng):
    args = rng.choice([{"city": "Paris", "days": 3}, {"q": "naïve 'query'", "safe": True, "tags": []},
                       {"nested": {"a": [1, 2, {"b": None}]}, "flag": False}])
    fn = {"name": rng.choice(["get_weather", "search"]),
          "arguments": json.dumps(args) if rng.random() < 0.3 else args}
    call = {"type": "function", "function": fn}
    if rng.random() < 0.85:
        call["id"] = "".join(rng.choice("abcdefghij0123456789") for _ in range(9))
    return call


def conversation(rng):
    n = rng.randint(0, 7)
    msgs = []
    strict = rng.random() < 0.6  # alternating user/assistant, as most templates demand
    for i in range(n):
        if strict:
            role = "user" if i % 2 == 0 else "assistant"
        else:
            role = rng.choice(["user", "assistant", "system", "tool", "user", "assistant"])
        m = {"role": role, "content": rng.choice(TEXTS)}
        if role == "assistant" and rng.random() < 0.25:
            m["tool_calls"] = [tool_call(rng) for _ in range(rng.choice([1, 1, 2]))]
            if rng.random() < 0.3:
                m["content"] = ""
        if role == "tool":
            m["tool_call_id"] = "".join(rng.choice("abc123") for _ in range(rng.choice([9, 9, 5])))
            if rng.random() < 0.3:
                m["content"] = json.dumps({"temp": 21, "unit": "C"})
        if role == "assistant" and rng.random() < 0.1:
            m["reasoning_content"] = "thinking about it"
        msgs.append(m)
    where = rng.random()
    if where < 0.35:
        msgs.insert(0, {"role": "system", "content": rng.choice(TEXTS)})
    elif where < 0.45:
        msgs.append({"role": "system", "content": "late system"})
    elif where < 0.5:
        msgs = [{"role": "system", "content": "alone"}]
    elif where < 0.55 and msgs:
        msgs.insert(rng.randrange(len(msgs)), {"role": "system", "content": "middle system"})
    ctx = {"messages": msgs, "add_generation_prompt": rng.random() < 0.6,
           "bos_token": "<s>", "eos_token": "</s>"}
    if rng.random() < 0.3:
        ctx["tools"] = TOOLS[: rng.randint(1, 2)]
    if rng.random() < 0.2:
        ctx["enable_thinking"] = rng.random() < 0.5
    return ctx


def round_trips():
    """Tool round trips as minfer serve hands them to a template: the OpenAI
    answer with tool_calls sent back (content null -> "", arguments parsed
    into objects), then role "tool" results, with and without the tools."""
    out = []
    for n_calls in (1, 2):
        for with_tools in (True, False):
            calls = [{"id": "call_%d" % k, "type": "function", "function": {
                "name": "get_weather", "arguments": {"city": c, "days": k}}}
                for k, c in enumerate(["Paris", "Oslo"][:n_calls])]
            msgs = [{"role": "user", "content": "Weather?"},
                    {"role": "assistant", "content": "", "tool_calls": calls}]
            msgs += [{"role": "tool", "tool_call_id": c["id"], "content": '{"temp": %d}' % k}
                     for k, c in enumerate(calls)]
            for tail in ([], [{"role": "assistant", "content": "Sunny."},
                              {"role": "user", "content": "Thanks"}]):
                ctx = {"messages": msgs + tail, "add_generation_prompt": True,
                       "bos_token": "<s>", "eos_token": "</s>"}
                if with_tools:
                    ctx["tools"] = TOOLS[:1]
                out.append(ctx)
    return out


def jinja2_render(tpl, ctx):
    try:
        return True, tpl.render(**ctx)
    except Exception as e:  # jinja2's own error: minfer must fail as well
        return False, "%s: %s" % (type(e).__name__, e)


def minfer_render(path, ctxs):
    jl = os.path.join(TMP, "template_cases.jsonl")
    with open(jl, "w", encoding="utf-8") as f:
        for c in ctxs:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    out = subprocess.run([TOOL, path, jl], capture_output=True, timeout=300).stdout
    res, i = [], 0
    while i < len(out):
        nl = out.index(b"\n", i)
        kind, n = out[i:nl].split(b" ")
        if kind == b"PARSE":
            raise SystemExit("minfer cannot parse %s: %s" % (path, out.decode()))
        n = int(n)
        body = out[nl + 1: nl + 1 + n]
        res.append((kind == b"OK", body.decode("utf-8")))
        i = nl + 1 + n
    return res


def main():
    if not os.path.exists(TOOL):
        sys.exit("missing %s (build the tests)" % TOOL)
    r = gguf.GGUFReader(MODEL)
    f = r.fields["tokenizer.chat_template"]
    smol = bytes(f.parts[f.data[0]]).decode("utf-8")
    smol_path = os.path.join(TMP, "smollm2.jinja")
    with open(smol_path, "w", encoding="utf-8") as fh:
        fh.write(smol)
    tdir = os.path.join(SRC, "tests", "data", "templates")
    templates = [("smollm2", smol_path)] + [
        (n, os.path.join(tdir, n + ".jinja"))
        for n in ["qwen2", "qwen3", "llama3", "gemma", "phi3", "mistral", "hermes_tools", "call_errors", "features"]]
    env = hf_env()
    total = failures = 0
    for name, path in templates:
        rng = random.Random(sum(map(ord, name)))
        ctxs = [conversation(rng) for _ in range(CASES_PER_TEMPLATE)] + round_trips()
        src = open(path, encoding="utf-8").read()
        tpl = env.from_string(src)  # compiled once: rendering is the part under test
        want = [jinja2_render(tpl, c) for c in ctxs]
        got = minfer_render(path, ctxs)
        assert len(got) == len(ctxs), (name, len(got), len(ctxs))
        ok_cases = err_cases = 0
        for i, (c, w, g) in enumerate(zip(ctxs, want, got)):
            total += 1
            if w[0] != g[0] or (w[0] and w[1] != g[1]):
                failures += 1
                if failures <= 5:
                    print("MISMATCH %s case %d\n ctx: %s\n jinja2: %r\n minfer: %r" % (
                        name, i, json.dumps(c, ensure_ascii=False)[:600], w[1][:1500], g[1][:1500]))
            elif w[0]:
                ok_cases += 1
            else:
                err_cases += 1
        print("%-9s %d cases: %d rendered identically, %d errors on both sides" % (
            name, len(ctxs), ok_cases, err_cases))
    print("template comparison: %d cases, %d mismatches" % (total, failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
