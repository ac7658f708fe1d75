"""Structured output with the real model: `minfer run --json-schema` output
always parses as JSON and validates against its schema (python jsonschema),
over several prompts, schemas and sampling seeds; --grammar output matches
its GBNF's language; bad grammars and schemas fail with one line."""
import json
import os
import subprocess
import sys

import jsonschema

BIN = os.environ["MINFER_BIN"]
MODEL = os.environ["MINFER_MODEL"]
TMP = os.environ.get("MINFER_TMP", "/tmp")

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                      "age": {"type": "integer"}}, "required": ["name", "age"]},
    {"type": "object", "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 20},
        "population": {"type": "number"},
        "tags": {"type": "array", "items": {"enum": ["big", "old", "coastal", "capital"]},
                 "minItems": 1, "maxItems": 3},
        "capital": {"type": "boolean"}},
     "required": ["city", "tags", "capital"], "additionalProperties": False},
    {"$defs": {"item": {"type": "object", "properties": {"id": {"type": "integer"},
                                                          "ok": {"type": ["boolean", "null"]}},
                        "required": ["id"]}},
     "type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 3},
    {"anyOf": [{"const": "yes"}, {"const": "no"}, {"type": "integer"}]},
]
PROMPTS = ["Describe a person as JSON.", "Tell me about Paris in JSON.",
           "List some items with ids.", "Answer yes or no: is the sky blue?"]


def run(args, timeout=600):
    return subprocess.run([BIN, "run", "-m", MODEL, "--no-display-prompt", "-t", "2"] + args,
                          capture_output=True, timeout=timeout)


def main():
    fails = cases = 0
    for si, schema in enumerate(SCHEMAS):
        for pi, prompt in enumerate(PROMPTS[si:si + 2] if si < 3 else PROMPTS[3:]):
            for seed in ([-1] if pi else [1, 2]):
                temp = ["--temp", "0"] if seed < 0 else ["--temp", "0.9", "-s", str(seed)]
                r = run(["--chat", "-p", prompt, "-n", "160", "--json-schema", json.dumps(schema)] + temp)
                out = r.stdout.decode("utf-8").rstrip("\n")
                cases += 1
                try:
                    if r.returncode:
                        raise ValueError("exit %d: %s" % (r.returncode, r.stderr.decode()))
                    jsonschema.validate(json.loads(out), schema)
                    print("ok   schema %d seed %d: %s" % (si, seed, out.replace("\n", " ")[:100]))
                except Exception as e:  # noqa: BLE001 - report every kind of miss
                    fails += 1
                    print("FAIL schema %d seed %d: %r: %s" % (si, seed, out[:300], e))
    # A plain GBNF grammar: the output is in its language.
    r = run(["-p", "The colors are", "-n", "40", "--temp", "0.7", "-s", "3", "--grammar",
             'root ::= " " color (", " color){2,4} "."\ncolor ::= "red" | "green" | "blue" | "pale " color'])
    out = r.stdout.decode().rstrip("\n")
    import re
    ok = r.returncode == 0 and re.fullmatch(r" ((pale )*(red|green|blue))(, (pale )*(red|green|blue)){2,4}\.", out)
    print("%s grammar: %r" % ("ok  " if ok else "FAIL", out))
    fails += not ok
    cases += 1
    # Bad constraints: exit 1, one line naming the problem.
    for args, want in [(["--grammar", "root ::= [a-"], "grammar: 1:10"),
                       (["--json-schema", '{"type":"string","pattern":"x"}'], "'pattern' is not supported"),
                       (["--grammar", "x ::= \"a\""], "no rule 'root'"),
                       (["--json-schema", "@/nonexistent.json"], "cannot open"),
                       (["--grammar", "root ::= \"a\"", "--json-schema", "{}"], "exclude each other")]:
        r = run(["-p", "hi", "-n", "4"] + args, timeout=120)
        err = r.stderr.decode().strip()
        ok = r.returncode != 0 and want in err and "\n" not in err
        print("%s %s -> %d: %s" % ("ok  " if ok else "FAIL", args[-1][:30], r.returncode, err))
        fails += not ok
    print("grammar cases: %d, failures: %d" % (cases, fails))
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
