"""jinjacmp.py SPARKMONO TMPDIR: sparkmono's C chat-template renderer against Jinja2, the
reference, set up as transformers' apply_chat_template sets it up: an immutable sandbox with
trim_blocks and lstrip_blocks, loop controls, the generation tag, the globals raise_exception
and strftime_now (a fixed day here, 2024-07-26, which the C side takes from
SPARKMONO_TEMPLATE_DATE), and a tojson that is json.dumps with ensure_ascii=False.

Every template is rendered by both (through `sparkmono template --batch`) and the bytes must
be identical; a raise_exception must give the same message, an error must be an error on
both sides.  Compared: the templates of templates.py over 150 conversations (the tool ones
over 120 with tools); the model families of families.py, each over its own 60 conversations
(at least 40 must render); every built-in of BUILTINS over BUILTIN_VARS; case mapping and the
is*() classes of every assigned code point.  Then the integer overflows sparkmono must refuse
(OVERFLOWS: an error naming the operation where Python's integers grow), and the templates it
must refuse at load (REFUSED: exit 2 with one line naming the construct and its position).
Prints PASS/FAIL lines and a DONE line."""
import json
import os
import random
import subprocess
import sys
import unicodedata
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from families import FAMILIES, family_cases
from templates import BUILTIN_VARS, BUILTINS, OVERFLOWS, REFUSED, TEMPLATES, TOOL_TEMPLATES

sm, tmp = sys.argv[1], sys.argv[2]
os.makedirs(tmp, exist_ok=True)
os.environ["SPARKMONO_TEMPLATE_DATE"] = "2024-07-26"
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


def strftime_now(fmt):
    return datetime(2024, 7, 26).strftime(fmt)


class Generation(Extension):
    """transformers' {% generation %} tag: its body rendered in place, as a call block."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=[Generation, "jinja2.ext.loopcontrols"])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now


def run_c(name, src, cases):
    """sparkmono's results for cases (one dict a case), or (None, why)."""
    tpath = os.path.join(tmp, name + ".jinja")
    vpath = os.path.join(tmp, name + ".jsonl")
    with open(tpath, "w") as f:
        f.write(src)
    with open(vpath, "w") as f:
        for v in cases:
            f.write(json.dumps(v) + "\n")
    r = subprocess.run([sm, "template", "--template", tpath, "--batch", vpath], capture_output=True)
    if r.returncode != 0:
        return None, f"exit {r.returncode}: {r.stderr.decode(errors='replace').strip()}"
    # one JSON line a case (split at "\n" alone: U+2028 and U+0085 stay raw inside the JSON)
    return [json.loads(line) for line in r.stdout.decode().split("\n") if line], ""


def render_py(t, v):
    try:
        return ("text", t.render(**v))
    except jinja2.exceptions.TemplateError as ex:
        return ("raised" if type(ex) is jinja2.exceptions.TemplateError else "error", str(ex))
    except Exception as ex:  # TypeError, ValueError, ... inside a filter: an error too
        return ("error", f"{type(ex).__name__}: {ex}")


def same(w, g):
    if w[0] == "text":
        return g.get("text") == w[1]
    if w[0] == "raised":
        return g.get("raised") is True and g.get("error") == w[1]
    return "error" in g and not g.get("raised")


def compare(name, src, cases, min_text=None):
    """Render src over cases with Jinja2 and with sparkmono; report the differences.  Returns
    the counts of rendered, raised and failed cases."""
    t = env.from_string(src)
    want = [render_py(t, v) for v in cases]
    got, why = run_c(name, src, cases)
    kinds = {"text": 0, "raised": 0, "error": 0}
    for w in want:
        kinds[w[0]] += 1
    if got is None:
        report(False, f"render_{name}", why)
        return kinds
    bad = [i for i, (w, g) in enumerate(zip(want, got)) if not same(w, g)]
    if len(got) != len(want):
        report(False, f"render_{name}", f"{len(got)} results for {len(want)} cases")
    elif bad:
        i = bad[0]
        report(False, f"render_{name}", f"{len(bad)} of {len(want)} differ; first case {i}: jinja2 {want[i]!r} C {got[i]!r}")
    else:
        report(True, f"render_{name} {len(want)} cases ({kinds['text']} rendered, {kinds['raised']} raise_exception, {kinds['error']} errors)")
    if min_text is not None:
        report(kinds["text"] >= min_text, f"enough_rendered_{name}", f"{kinds} (want >= {min_text} rendered)")
    return kinds


def random_conversations(rng, n):
    contents = ["Hi there", "What is 2+2?", "  padded with spaces  ", "line one\nline two\n", "", "ünïcödé ✓ 日本語",
                "quotes ' and \" and \\ backslash", "tabs\tand\r\nCRLF", "Hi? ", "{{ not a template }}",
                "a much longer message that goes on for a while, with punctuation; and more.", "<|im_end|> inside"]
    roles = ["system", "user", "assistant"]
    out = []
    for i in range(n):
        k = rng.randint(1, 7)
        msgs = []
        if rng.random() < 0.4:
            msgs.append({"role": "system", "content": rng.choice(contents)})
        alternate = rng.random() < 0.7
        for j in range(k):
            role = ("user" if j % 2 == 0 else "assistant") if alternate else rng.choice(roles)
            msgs.append({"role": role, "content": rng.choice(contents)})
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
    contents = ["Hi there", "ünïcödé ✓ 日本語", "quotes ' and \" and \\ backslash", "line one\nline two\n", ""]
    for i in range(n):
        msgs = [{"role": "system", "content": rng.choice(contents)}] if rng.random() < 0.4 else []
        for turn in range(rng.randint(1, 2)):
            msgs.append({"role": "user", "content": rng.choice(contents)})
            calls = []
            for c in range(rng.randint(1, 2)):
                fn = {"name": rng.choice(TOOL_POOL)["function"]["name"]}
                args = {"city": rng.choice(contents), "k": rng.randint(1, 9)}
                fn["arguments"] = json.dumps(args, ensure_ascii=False) if rng.random() < 0.5 else args
                calls.append({"id": "call_%d_%d" % (i, c), "type": "function", "function": fn}
                             if rng.random() < 0.8 else fn)
            msgs.append({"role": "assistant", "content": rng.choice(["", "Let me look."]), "tool_calls": calls})
            for c in calls:
                msgs.append({"role": "tool", "tool_call_id": c.get("id", ""), "content": rng.choice(contents)})
            msgs.append({"role": "assistant", "content": rng.choice(contents)})
        msgs.append({"role": "user", "content": rng.choice(contents)})
        tools = rng.sample(TOOL_POOL, rng.randint(1, 3)) if rng.random() < 0.85 else None
        out.append({"messages": msgs, "add_generation_prompt": rng.random() < 0.6, "bos_token": "<|bos|>",
                    "eos_token": "<|eos|>", "tools": tools})
    return out


# ---- the generic templates
cases = random_conversations(random.Random(7), 150)
for name, src in TEMPLATES.items():
    k = compare(name, src, cases)
    if name == "undefined":
        report(k["error"] > 0 and k["text"] > 0, "undefined_errors_on_some", f"{k}")
    elif name == "mistral":
        report(k["raised"] > 0 and k["text"] > 0, "mistral_raises_on_some", f"{k}")
    else:
        report(k["text"] == len(cases), f"all_rendered_{name}", f"{k}")
tool_cases = tool_conversations(random.Random(11), 120)
for name, src in TOOL_TEMPLATES.items():
    k = compare(name, src, tool_cases)
    report(k["text"] == len(tool_cases), f"all_rendered_{name}", f"{k}")

# ---- the model families, each over its own conversations
for name, src in FAMILIES.items():
    compare("family_" + name, src, family_cases(name, 60), min_text=40)

# ---- every built-in, one line each over the variable sets
bad, nerr = [], 0
for i, src in enumerate(BUILTINS):
    try:
        t = env.from_string(src)
    except jinja2.exceptions.TemplateSyntaxError as ex:
        bad.append(f"line {i}: Jinja2 refuses it: {ex}")
        continue
    want = [render_py(t, v) for v in BUILTIN_VARS]
    got, why = run_c(f"builtin{i}", src, BUILTIN_VARS)
    if got is None:
        bad.append(f"line {i} {src!r}: {why}")
        continue
    nerr += sum(w[0] != "text" for w in want)
    for w, g in zip(want, got):
        if not same(w, g):
            bad.append(f"line {i} {src[:120]!r}: jinja2 {w!r} C {g!r}")
            break
report(not bad, f"builtins {len(BUILTINS)} templates x {len(BUILTIN_VARS)} variable sets ({nerr} errors on both sides)",
       f"{len(bad)} differ; first: {bad[0] if bad else ''}")

# ---- Unicode: case mapping (with the final-sigma rule), str classes, repr, tojson, trim of
# every assigned code point (NUL aside: JSON input cannot hold it), in chunks
UNI = ("{% for c in chars %}{{ c|lower }}{{ c|upper }}{{ c|title }}{{ c|capitalize }}{{ c.title() }}{{ c.swapcase() }}"
       "{{ ('A' ~ c ~ 'Σ')|lower }}{{ (c ~ 'Σ')|lower }}{{ ('AΣ' ~ c)|lower }}{{ c.islower()|int }}{{ c.isupper()|int }}"
       "{{ c.istitle()|int }}{{ c.isspace()|int }}{{ c.isalpha()|int }}{{ c.isdigit()|int }}{{ c.isalnum()|int }}"
       "{{ c.isdecimal()|int }}{{ (c ~ 'x' ~ c)|trim }}{{ c|tojson }}{{ [c] }}{{ c|tojson(true) }}\ue000\ue001{% endfor %}")
cps = [cp for cp in range(1, 0x110000) if unicodedata.category(chr(cp)) not in ("Cn", "Cs")]
chunks = [{"chars": [chr(c) for c in cps[i:i + 4000]]} for i in range(0, len(cps), 4000)]
got, why = run_c("unicode", UNI, chunks)
t = env.from_string(UNI)
ubad = []
for ch, g in zip(chunks, got or []):
    want = t.render(**ch).split("\ue000\ue001")
    for c, w, x in zip(ch["chars"], want, g.get("text", "").split("\ue000\ue001")):
        if w != x:
            ubad.append(f"U+{ord(c):04X}: jinja2 {w!r} C {x!r}")
report(got is not None and len(got) == len(chunks) and not ubad,
       f"unicode_case_and_classes {len(cps)} code points (Python's Unicode {unicodedata.unidata_version})",
       why or f"{len(ubad)} differ; first: {ubad[:1]}")

# ---- integer overflows: Jinja2 renders a big integer, sparkmono refuses, naming the operation
for i, (src, msg) in enumerate(OVERFLOWS):
    v = {"big": 2 ** 63 - 1}
    w = render_py(env.from_string(src), v)
    got, why = run_c(f"overflow{i}", src, [v])
    g = got[0] if got else {}
    report(w[0] == "text" and msg in g.get("error", ""), f"overflow_{i} {src}", f"jinja2 {w!r}, C {g or why!r}, want '{msg}'")

# ---- refused at load
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
