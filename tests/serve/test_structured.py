"""test_structured.py: structured outputs of `sparkmono serve` (src/serve/serve_struct.c over the
engine's constraints, src/constrain/) through the official `openai` client and raw HTTP:
response_format (json_object, json_schema), vLLM's structured_outputs object and its older
guided_* fields, on /v1/completions and /v1/chat/completions.  The tiny model is random, so
under a constraint its text is shaped by the constraint alone: every answer, greedy and sampled
with several seeds, must parse and validate (jsonschema with its format checker, re.fullmatch,
one of the choices) and end with "stop"; JSON is compact by default; streamed answers equal
plain ones; n choices and lists of prompts share the constraint; logprobs are the masked
distribution's (at least the unmasked ones, exact where every allowed id is listed) and the
JSON never holds -inf or NaN (-9999.0 for a masked alternative, as vLLM writes it); an answer
cut by max_tokens is a prefix of a valid one; stop strings still cut; a speculative server
answers token for token what a plain one does; compiled constraints are cached (GET /metrics);
every bad field is a 400 naming the field and the problem."""
import json
import re
import threading

import numpy as np
import pytest
import requests

from conftest import TIMEOUT, Server
from smtest import raw_logits

jsonschema = pytest.importorskip("jsonschema")

PROMPT = [5, 6, 7, 8, 5, 6]
SAMPLINGS = [dict(temperature=0), dict(temperature=1.0, seed=1), dict(temperature=1.0, seed=2),
             dict(temperature=0.8, top_p=0.9, seed=3)]

# small schemas a random model ends: bounded strings, integers, enums, arrays
SCHEMAS = {
    "flat": {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 20},
                                              "color": {"enum": ["red", "green", "blue"]}},
             "required": ["ok", "n", "color"]},
    "optional": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                                  "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
                 "required": ["name"]},
    "array": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 4},
    "anyof": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "boolean"}, {"type": "null"}]},
    "ref": {"$defs": {"p": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 1, "maximum": 3},
                                                             "b": {"const": "x"}}, "required": ["a", "b"]}},
            "type": "array", "items": {"$ref": "#/$defs/p"}, "minItems": 1, "maxItems": 2},
    "pattern": {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"},
                                                 "size": {"type": "string", "minLength": 2, "maxLength": 4}},
                "required": ["code", "size"]},
    "nested": {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "age": {"type": "integer", "minimum": 18, "maximum": 99}, "admin": {"type": "boolean"}}, "required": ["age", "admin"]},
        "level": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 4}}, "required": ["user", "level"]},
    "formats": {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"},
                                                 "ip": {"type": "string", "format": "ipv4"},
                                                 "day": {"type": "string", "format": "date"}},
                "required": ["id", "ip", "day"]},
}
REGEXES = [r"[a-z]{1,8}", r"\d{3}-\d{4}", r"(cat|dog|bird)s?", r"[A-Z][a-z]{2,5} [0-9]{1,2}", r"\w{1,5}@\w{1,5}\.(com|org)",
           r"(0|[1-9][0-9]{0,2})(\.[0-9]{1,2})?", r"[^\n]{3,6}"]
CHOICES = [["yes", "no"], ["alpha", "beta", "gamma delta", "é ü"], ["1", "12", "123"]]


@pytest.fixture(scope="module")
def srv(tmp, model_dir):
    """A speculative server (R = 8) with the tokenizer, room for n = 3 of two prompts."""
    s = Server(model_dir, tmp, "--max-requests", "4", "--queue", "16", "--model-name", "tiny-struct")
    yield s
    assert s.stop() == 0, s.read_log()


@pytest.fixture(scope="module")
def plain(tmp, model_dir):
    """A server without speculation: one row a request a step."""
    s = Server(model_dir, tmp, "--request-rows", "1", "--max-requests", "2")
    yield s
    assert s.stop() == 0, s.read_log()


def strict_json(text):
    """json.loads refusing NaN and Infinity, which are not JSON."""
    def refuse(c):
        raise ValueError("the body holds %s, which is not JSON" % c)
    return json.loads(text, parse_constant=refuse)


def post(s, path, body, status=200):
    r = requests.post(s.url + path, data=json.dumps(dict({"model": s.name}, **body)), timeout=TIMEOUT)
    assert r.status_code == status, r.text
    return strict_json(r.text)


def complete(s, **kw):
    return post(s, "/v1/completions", dict({"prompt": PROMPT, "max_tokens": 200, "temperature": 0}, **kw))["choices"]


def chat(s, **kw):
    body = dict({"messages": [{"role": "user", "content": "Answer."}], "max_tokens": 200, "temperature": 0}, **kw)
    return post(s, "/v1/chat/completions", body)["choices"]


def validate(schema, text):
    obj = json.loads(text)
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(obj)
    return obj


def compact(text):
    """True when text has no whitespace outside its JSON strings."""
    in_str = esc = False
    for ch in text:
        if in_str:
            esc, in_str = (False, True) if esc else (ch == "\\", ch != '"')
        elif ch == '"':
            in_str = True
        elif ch in " \t\r\n":
            return False
    return True


# ---- validity --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(SCHEMAS))
def test_json_schema_completions(srv, name):
    """Each of the fields that carry a schema, greedy and sampled: valid, compact, ended by eos."""
    schema = SCHEMAS[name]
    fields = [{"response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}},
              {"structured_outputs": {"json": schema}}, {"guided_json": json.dumps(schema)},
              {"structured_outputs": {"json": json.dumps(schema), "disable_any_whitespace": True}}]
    for samp, field in zip(SAMPLINGS, fields):
        c = complete(srv, **samp, **field)[0]
        assert c["finish_reason"] == "stop", (samp, c)
        validate(schema, c["text"])
        assert compact(c["text"]), c["text"]


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_json_schema_chat_openai(srv, name):
    """response_format through the openai client's own argument, chat completions."""
    schema, client = SCHEMAS[name], srv.client()
    for samp in SAMPLINGS:
        r = client.chat.completions.create(model=srv.name, messages=[{"role": "user", "content": "Give JSON."}],
                                           max_tokens=200, response_format={"type": "json_schema", "json_schema": {
                                               "name": name, "schema": schema, "strict": True}}, **samp)
        assert r.choices[0].finish_reason == "stop", samp
        validate(schema, r.choices[0].message.content)


@pytest.mark.parametrize("rx", REGEXES)
def test_regex(srv, rx):
    client = srv.client()
    for samp in SAMPLINGS:
        for c in (complete(srv, guided_regex=rx, **samp)[0], chat(srv, structured_outputs={"regex": rx}, **samp)[0]):
            text = c["text"] if "text" in c else c["message"]["content"]
            assert c["finish_reason"] == "stop" and re.fullmatch(rx, text), (samp, c)
        r = client.completions.create(model=srv.name, prompt=PROMPT, max_tokens=100, extra_body={"guided_regex": rx}, **samp)
        assert re.fullmatch(rx, r.choices[0].text), r.choices[0].text


@pytest.mark.parametrize("k", range(len(CHOICES)))
def test_choice(srv, k):
    ch = CHOICES[k]
    for samp in SAMPLINGS:
        for c in (complete(srv, guided_choice=ch, **samp)[0], complete(srv, structured_outputs={"choice": ch}, **samp)[0],
                  chat(srv, guided_choice=ch, **samp)[0]):
            text = c["text"] if "text" in c else c["message"]["content"]
            assert c["finish_reason"] == "stop" and text in ch, (samp, c)


def test_guided_choice_yes_no_openai(srv):
    client = srv.client()
    seen = set()
    for seed in range(8):
        r = client.chat.completions.create(model=srv.name, messages=[{"role": "user", "content": "Yes or no?"}],
                                           max_tokens=20, temperature=1.0, seed=seed,
                                           extra_body={"guided_choice": ["yes", "no"]})
        assert r.choices[0].message.content in ("yes", "no")
        seen.add(r.choices[0].message.content)
    assert seen == {"yes", "no"}, seen  # sampling reaches both


def test_json_object(srv):
    """Any JSON object: one that ends parses as an object; one cut by max_tokens begins as one."""
    for samp in SAMPLINGS:
        for c in (complete(srv, response_format={"type": "json_object"}, max_tokens=60, **samp)[0],
                  complete(srv, structured_outputs={"json_object": True}, max_tokens=60, **samp)[0]):
            if c["finish_reason"] == "stop":
                assert isinstance(json.loads(c["text"]), dict), c
            else:
                assert c["text"].startswith("{") and len(c["token_ids"]) == 60, c


def test_any_whitespace(srv):
    """structured_outputs.disable_any_whitespace false allows whitespace (vLLM's default); still valid."""
    schema = SCHEMAS["flat"]
    spaced = 0
    for seed in range(6):
        c = complete(srv, structured_outputs={"json": schema, "disable_any_whitespace": False}, temperature=1.0, seed=seed,
                     max_tokens=300)[0]
        if c["finish_reason"] == "stop":
            validate(schema, c["text"])
        spaced += not compact(c["text"])
    assert spaced > 0, "no answer used whitespace"


# ---- the API around it -----------------------------------------------------------------------

def test_stream_equals_plain(srv):
    client = srv.client()
    schema = SCHEMAS["nested"]
    for samp in SAMPLINGS:
        extra = {"guided_json": schema}
        want = client.completions.create(model=srv.name, prompt=PROMPT, max_tokens=200, extra_body=extra, **samp)
        parts = list(client.completions.create(model=srv.name, prompt=PROMPT, max_tokens=200, extra_body=extra,
                                               stream=True, **samp))
        assert "".join(p.choices[0].text for p in parts) == want.choices[0].text
        assert parts[-1].choices[0].finish_reason == "stop"
        validate(schema, want.choices[0].text)
        msgs = [{"role": "user", "content": "JSON please"}]
        rf = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
        want = client.chat.completions.create(model=srv.name, messages=msgs, max_tokens=200, response_format=rf, **samp)
        parts = list(client.chat.completions.create(model=srv.name, messages=msgs, max_tokens=200, response_format=rf,
                                                    stream=True, **samp))
        assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == want.choices[0].message.content
        validate(schema, want.choices[0].message.content)


def test_stream_raw_no_infinity(srv):
    """Streamed chunks with logprobs under a constraint: strict JSON (-9999.0, never -Infinity)."""
    body = {"model": srv.name, "prompt": PROMPT, "max_tokens": 50, "guided_choice": ["yes", "no"], "logprobs": 10,
            "stream": True, "temperature": 0}
    r = requests.post(srv.url + "/v1/completions", data=json.dumps(body), stream=True, timeout=TIMEOUT)
    assert r.status_code == 200
    text, masked = "", 0
    for line in r.iter_lines():
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            ev = strict_json(line[6:].decode())
            ch = ev["choices"][0]
            text += ch["text"]
            for m in (ch["logprobs"] or {}).get("top_logprobs") or []:
                masked += sum(v == -9999.0 for v in m.values())
    assert text in ("yes", "no") and masked > 0


def test_n_and_prompt_list(srv):
    """n = 3 of two prompts: six choices, every one valid, sharing one compiled constraint."""
    schema = SCHEMAS["optional"]
    cs = post(srv, "/v1/completions", {"prompt": [PROMPT, [9, 10, 11]], "n": 3, "max_tokens": 200, "temperature": 1.0,
                                       "seed": 11, "guided_json": schema})["choices"]
    assert sorted(c["index"] for c in cs) == list(range(6))
    for c in cs:
        assert c["finish_reason"] == "stop", c
        validate(schema, c["text"])
    cs = chat(srv, n=3, temperature=1.0, seed=4, guided_regex=r"[0-9]{2}:[0-9]{2}")
    assert len(cs) == 3 and all(re.fullmatch(r"[0-9]{2}:[0-9]{2}", c["message"]["content"]) for c in cs), cs


def test_length_prefix(srv):
    """max_tokens cuts a constrained answer: finish "length", its text a prefix of a valid one."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "minLength": 30, "maxLength": 40}}, "required": ["s"]}
    head = '{"s":"'
    for samp in SAMPLINGS:
        c = complete(srv, guided_json=schema, max_tokens=6, **samp)[0]
        t = c["text"]
        assert c["finish_reason"] == "length" and len(c["token_ids"]) == 6, c
        assert t.startswith(head) or head.startswith(t), t
        body = t[len(head):]
        assert '"' not in body.replace('\\"', ""), t  # the string is still open
        c = complete(srv, guided_regex=r"[a-z]{30}", max_tokens=5, **samp)[0]
        assert c["finish_reason"] == "length" and re.fullmatch(r"[a-z]{1,29}", c["text"]), c


def test_stop_string_after_constraint(srv):
    """Stop strings still apply to the constrained text (vLLM's behaviour)."""
    for samp in SAMPLINGS:
        c = complete(srv, guided_choice=["yes please", "no thanks"], stop=[" "], **samp)[0]
        assert c["text"] in ("yes", "no") and c["finish_reason"] == "stop", c


def finite_lse(x):
    x = x[np.isfinite(x)]
    m = x.max()
    return m + np.log(np.exp(x - m).sum())


def test_logprobs_masked(srv, model_dir, tmp, hf_tok):
    """Each generated id's logprob is finite and at least its unmasked one; where the top list shows
    fewer finite entries than asked (every allowed id listed), it is exactly the masked log-softmax;
    masked alternatives are -9999.0."""
    k = 8
    for samp in SAMPLINGS[:2]:
        c = complete(srv, guided_choice=["yes", "no", "maybe"], logprobs=k, **samp)[0]
        lp, ids = c["logprobs"], c["token_ids"]
        assert c["text"] in ("yes", "no", "maybe") and ids[-1] == 2
        masked = 0
        for j, t in enumerate(ids):
            x, top = lp["token_logprobs"][j], lp["top_logprobs"][j]
            assert np.isfinite(x) and x <= 1e-6, (j, x)
            assert all(np.isfinite(v) and (v == -9999.0 or v <= 1e-6) for v in top.values()), top
            masked += sum(v == -9999.0 for v in top.values())
            row = raw_logits(model_dir, tmp, PROMPT + ids[:j]).astype(np.float64)
            unmasked = row[t] - finite_lse(row)
            assert x >= unmasked - 1e-4, (j, x, unmasked)
            allowed = [s for s, v in top.items() if v != -9999.0]
            if len(allowed) < k and all(re.fullmatch(r"[a-z]+|<\|eos\|>", s) for s in allowed):
                aid = [hf_tok.token_to_id(s) for s in allowed]
                assert abs(x - (row[t] - finite_lse(row[aid]))) < 1e-3, (j, allowed, x)
        assert masked > 0
    cs = chat(srv, guided_choice=["yes", "no"], logprobs=True, top_logprobs=5)
    for e in cs[0]["logprobs"]["content"]:
        assert np.isfinite(e["logprob"]) and e["logprob"] > -9999.0
        assert all(a["logprob"] == -9999.0 or np.isfinite(a["logprob"]) for a in e["top_logprobs"])
    assert any(a["logprob"] == -9999.0 for e in cs[0]["logprobs"]["content"] for a in e["top_logprobs"])


def test_speculative_equals_plain(srv, plain):
    for samp in SAMPLINGS:
        for field in ({"guided_json": SCHEMAS["nested"]}, {"guided_regex": REGEXES[4]}, {"guided_choice": CHOICES[1]},
                      {"response_format": {"type": "json_object"}, "max_tokens": 40}):
            a, b = complete(srv, **samp, **field)[0], complete(plain, **samp, **field)[0]
            assert (a["token_ids"], a["finish_reason"]) == (b["token_ids"], b["finish_reason"]), (samp, field)


def test_null_fields_are_free_text(srv):
    free = complete(srv, max_tokens=12)[0]["token_ids"]
    for field in ({"guided_regex": None}, {"structured_outputs": None}, {"response_format": None},
                  {"response_format": {"type": "text"}}, {"guided_json": None, "guided_whitespace_pattern": None}):
        assert complete(srv, max_tokens=12, **field)[0]["token_ids"] == free, field


def test_backend_field_logged(srv):
    c = complete(srv, guided_choice=["a", "b"], guided_decoding_backend="xgrammar")[0]
    assert c["text"] in ("a", "b")
    lines = [l for l in srv.read_log().splitlines() if "ignored unknown field" in l and "guided_decoding_backend" in l]
    assert len(lines) == 1, lines


def metrics(s):
    out = {}
    for line in requests.get(s.url + "/metrics", timeout=TIMEOUT).text.splitlines():
        if line.startswith("sparkmono_structured_output_"):
            name, v = line.split()
            out[name[len("sparkmono_structured_output_"):]] = float(v)
    return out


def test_cache(srv):
    """A repeated spec is compiled once; concurrent first uses of one spec all answer validly; the
    cache keeps 64 constraints, least recently used evicted first."""
    m0 = metrics(srv)
    schema = {"type": "object", "properties": {"cached": {"enum": [1, 2, 3]}}, "required": ["cached"]}
    for seed in range(3):
        validate(schema, complete(srv, guided_json=schema, temperature=1.0, seed=seed)[0]["text"])
    m1 = metrics(srv)
    assert m1["compiles_total"] - m0["compiles_total"] == 1 and m1["cache_hits_total"] - m0["cache_hits_total"] == 2
    schema2 = {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 2}
    errs = []

    def one(seed):
        try:
            validate(schema2, complete(srv, guided_json=schema2, temperature=1.0, seed=seed)[0]["text"])
        except Exception as e:  # noqa: BLE001 (reported below)
            errs.append(repr(e))
    th = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    assert not errs, errs
    m2 = metrics(srv)
    assert 1 <= m2["compiles_total"] - m1["compiles_total"] <= 8
    assert m2["compiles_total"] + m2["cache_hits_total"] - m1["compiles_total"] - m1["cache_hits_total"] == 8
    for i in range(70):
        assert complete(srv, guided_regex="x%d" % i, max_tokens=10)[0]["text"] == "x%d" % i
    m3 = metrics(srv)
    assert m3["cached"] == 64 and m3["compiles_total"] - m2["compiles_total"] == 70
    complete(srv, guided_regex="x69", max_tokens=10)  # recent: still cached
    complete(srv, guided_regex="x0", max_tokens=10)   # evicted: compiled again
    m4 = metrics(srv)
    assert m4["compiles_total"] - m3["compiles_total"] == 1 and m4["cache_hits_total"] - m3["cache_hits_total"] == 1


# ---- refusals --------------------------------------------------------------------------------

BAD = [
    ({"guided_regex": "(ab"}, "guided_regex", ["'guided_regex'", "regex"]),
    ({"structured_outputs": {"regex": "a{2,1}"}}, "structured_outputs.regex", ["regex"]),
    ({"guided_json": {"type": "object", "not": {"type": "string"}}}, "guided_json", ["'not'"]),
    ({"guided_json": {"type": "strin"}}, "guided_json", ["strin"]),
    ({"guided_json": "{not json"}, "guided_json", ["'guided_json'"]),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "string", "contentEncoding": "base64"}}}}}},
     "response_format.json_schema.schema", ["contentEncoding"]),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", ["'guided_regex'", "'guided_choice'", "only one"]),
    ({"response_format": {"type": "json_object"}, "guided_json": {"type": "integer"}}, None, ["both"]),
    ({"response_format": {"type": "structural_tag"}}, "response_format", ["'structural_tag'", "not supported"]),
    ({"response_format": {"type": "xml"}}, "response_format", ["'xml'"]),
    ({"response_format": "json"}, "response_format", ["must be an object"]),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", ["schema' is required"]),
    ({"response_format": {"type": "json_schema"}}, "response_format", ["needs 'json_schema'"]),
    ({"structured_outputs": {}}, "structured_outputs", ["needs one of"]),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", ["both 'choice' and 'regex'"]),
    ({"structured_outputs": {"grammar": "root ::= \"a\""}}, "structured_outputs.grammar", ["grammar", "not supported"]),
    ({"guided_grammar": "root ::= \"a\""}, "guided_grammar", ["grammar", "not supported"]),
    ({"structured_outputs": {"json": {"type": "string"}, "whitespace_pattern": " "}}, "structured_outputs",
     ["whitespace_pattern", "not supported"]),
    ({"structured_outputs": {"regex": 5}}, "structured_outputs.regex", ["must be a string"]),
    ({"structured_outputs": {"regexp": "a"}}, "structured_outputs", ["unknown key 'regexp'"]),
    ({"guided_whitespace_pattern": "\\s*", "guided_json": {"type": "integer"}}, "guided_whitespace_pattern",
     ["not supported"]),
    ({"guided_choice": []}, "guided_choice", ["non-empty list"]),
    ({"guided_choice": ["a", 1]}, "guided_choice", ["entry 1 is not a string"]),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_fields(srv, case):
    fields, param, words = BAD[case]
    for path, body in (("/v1/completions", {"prompt": PROMPT, "max_tokens": 8}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 8})):
        err = post(srv, path, dict(body, **fields), status=400)["error"]
        assert err["type"] == "invalid_request_error", err
        if param:
            assert err["param"] == param, err
        for w in words:
            assert w in err["message"], (w, err)


def test_bad_field_openai_client(srv):
    import openai

    with pytest.raises(openai.BadRequestError) as ei:
        srv.client().chat.completions.create(model=srv.name, messages=[{"role": "user", "content": "x"}], max_tokens=8,
                                             response_format={"type": "json_schema", "json_schema": {
                                                 "name": "x", "schema": {"type": "object", "not": {}}}})
    assert "'not'" in str(ei.value)


def test_no_tokenizer(server):
    """A model directory without tokenizer.json cannot map ids to bytes: a 400 that says so."""
    err = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "guided_regex": "a"}, status=400)["error"]
    assert err["param"] == "guided_regex" and "tokenizer.json" in err["message"], err
