"""jinjacmp.py SPARKMONO TMPDIR: sparkmono's C chat-template renderer against Jinja2, the
reference (set up as transformers' apply_chat_template sets it up: an immutable sandbox with
trim_blocks and lstrip_blocks, loop controls, raise_exception, a tojson that keeps non-ASCII).
Every template of templates.py is rendered over many message lists by both (through
`sparkmono template --batch`; the tool templates over conversations with tools, tool calls
and tool answers), and the bytes must be identical; a raise_exception must give
the same message; the refused templates must exit 2 with one line naming the construct and
its position.  Prints PASS/FAIL lines and a DONE line."""
import json
import os
import random
import subprocess
import sys

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from templates import REFUSED, TEMPLATES, TOOL_TEMPLATES

sm, tmp = sys.argv[1], sys.argv[2]
os.makedirs(tmp, exist_ok=True)
npass = nfail = 0


def report(ok, name, why=""):
    global npass, nfail
    if ok:
        npass += 1
        print(f"PASS {name}")
    else:
        nfail += 1
        print(f"FAIL {name} ({why})")


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

CONTENTS = ["Hi there", "What is 2+2?", "  padded with spaces  ", "line one\nline two\n", "", "ünïcödé ✓ 日本語",
            "quotes ' and \" and \\ backslash", "tabs\tand\r\nCRLF", "Hi? ", "{{ not a template }}",
            "a much longer message that goes on for a while, with punctuation; and more.", "<|im_end|> inside"]
ROLES = ["system", "user", "assistant"]


def conversations(rng, n):
    out = []
    for i in range(n):
        k = rng.randint(1, 7)
        msgs = []
        if rng.random() < 0.4:
            msgs.append({"role": "system", "content": rng.choice(CONTENTS)})
        alternate = rng.random() < 0.7
        for j in range(k):
            role = ("user" if j % 2 == 0 else "assistant") if alternate else rng.choice(ROLES)
            msgs.append({"role": role, "content": rng.choice(CONTENTS)})
        out.append({"messages": msgs, "add_generation_prompt": rng.random() < 0.6, "bos_token": "<|bos|>",
                    "eos_token": "<|eos|>", "tools": None})
    return out


TOOL_POOL = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather of a city, now.",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "search-docs", "description": "Söker i dokumenten ✓ \"quoted\"",
                                      "parameters": {"type": "object", "properties": {
                                          "q": {"type": "string"}, "k": {"type": "integer", "minimum": 1},
                                          "tags": {"type": "array", "items": {"type": "string"}}}}}},
    {"type": "function", "function": {"name": "now"}},
]


def tool_conversations(rng, n):
    """Conversations with tools: a user asks, the assistant calls 1-2 tools (arguments a JSON
    string, an object, with or without the "function" wrapper), 1-2 tool answers follow, the
    assistant answers; some without tools at all."""
    out = []
    for i in range(n):
        msgs = [{"role": "system", "content": rng.choice(CONTENTS)}] if rng.random() < 0.4 else []
        for turn in range(rng.randint(1, 2)):
            msgs.append({"role": "user", "content": rng.choice(CONTENTS)})
            calls = []
            for c in range(rng.randint(1, 2)):
                fn = {"name": rng.choice(TOOL_POOL)["function"]["name"]}
                args = {"city": rng.choice(CONTENTS), "k": rng.randint(1, 9)}
                fn["arguments"] = json.dumps(args, ensure_ascii=False) if rng.random() < 0.5 else args
                calls.append({"id": "call_%d_%d" % (i, c), "type": "function", "function": fn}
                             if rng.random() < 0.8 else fn)
            msgs.append({"role": "assistant", "content": rng.choice(["", "Let me look."]), "tool_calls": calls})
            for c in calls:
                msgs.append({"role": "tool", "tool_call_id": c.get("id", ""), "content": rng.choice(CONTENTS)})
            msgs.append({"role": "assistant", "content": rng.choice(CONTENTS)})
        msgs.append({"role": "user", "content": rng.choice(CONTENTS)})
        tools = rng.sample(TOOL_POOL, rng.randint(1, 3)) if rng.random() < 0.85 else None
        out.append({"messages": msgs, "add_generation_prompt": rng.random() < 0.6, "bos_token": "<|bos|>",
                    "eos_token": "<|eos|>", "tools": tools})
    return out


def compare(name, src, cases):
    """Render src over cases with Jinja2 and with sparkmono; report the differences."""
    tpath = os.path.join(tmp, name + ".jinja")
    vpath = os.path.join(tmp, name + ".jsonl")
    with open(tpath, "w") as f:
        f.write(src)
    with open(vpath, "w") as f:
        for v in cases:
            f.write(json.dumps(v) + "\n")
    t = env.from_string(src)
    want = []
    for v in cases:
        try:
            want.append(("text", t.render(**v)))
        except jinja2.exceptions.TemplateError as ex:
            raised = type(ex) is jinja2.exceptions.TemplateError
            want.append(("raised" if raised else "error", str(ex)))
    r = subprocess.run([sm, "template", "--template", tpath, "--batch", vpath], capture_output=True)
    if r.returncode != 0:
        report(False, f"render_{name}", f"exit {r.returncode}: {r.stderr.decode(errors='replace').strip()}")
        return
    got = [json.loads(line) for line in r.stdout.decode().splitlines()]
    bad, kinds = [], {"text": 0, "raised": 0, "error": 0}
    for i, (w, g) in enumerate(zip(want, got)):
        kinds[w[0]] += 1
        if w[0] == "text":
            ok = g.get("text") == w[1]
        elif w[0] == "raised":
            ok = g.get("raised") is True and g.get("error") == w[1]
        else:
            ok = "error" in g and not g.get("raised")
        if not ok:
            bad.append(i)
    if len(got) != len(want):
        report(False, f"render_{name}", f"{len(got)} results for {len(want)} cases")
    elif bad:
        i = bad[0]
        report(False, f"render_{name}", f"{len(bad)} of {len(want)} differ; first case {i}: jinja2 {want[i]!r} C {got[i]!r}")
    else:
        report(True, f"render_{name} {len(want)} cases ({kinds['text']} rendered, {kinds['raised']} raise_exception, {kinds['error']} errors)")
    if name == "undefined":
        report(kinds["error"] > 0 and kinds["text"] > 0, "undefined_errors_on_some", f"{kinds}")
    elif name != "mistral":
        report(kinds["text"] == len(want), f"all_rendered_{name}", f"{kinds}")
    else:
        report(kinds["raised"] > 0 and kinds["text"] > 0, "mistral_raises_on_some", f"{kinds}")


rng = random.Random(7)
cases = conversations(rng, 150)
for name, src in TEMPLATES.items():
    compare(name, src, cases)
tool_cases = tool_conversations(random.Random(11), 120)
for name, src in TOOL_TEMPLATES.items():
    compare(name, src, tool_cases)

for i, (src, msg) in enumerate(REFUSED):
    tpath = os.path.join(tmp, f"refused{i}.jinja")
    with open(tpath, "w") as f:
        f.write(src)
    r = subprocess.run([sm, "template", "--template", tpath], capture_output=True)
    err = r.stderr.decode().strip()
    ok = r.returncode == 2 and err.count("\n") == 0 and msg in err and err.startswith(tpath + ": ")
    report(ok, f"refused_{i}", f"exit {r.returncode}, want '{msg}' in '{err}'")

print(f"DONE {npass} passed, {nfail} failed")
sys.exit(1 if nfail else 0)
