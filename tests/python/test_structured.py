"""test_structured.py: structured outputs through the binding: Engine.generate and generate_many
with regex=, choice=, json_schema= (a dict or its JSON text), json_object=True and a reusable
sparkmono.Constraint; the tiny model is random, so every text is shaped by the constraint alone
and must validate (jsonschema with formats, re.fullmatch, one of the choices), greedy and sampled;
a Constraint is shared across calls, prompts and engines and survives its creator's close only
in the requests that run; the ids equal the server's for the same request; every bad spec is a
SparkmonoValueError with the compiler's line, every bad argument a TypeError or ValueError."""
import json
import re

import pytest

import sparkmono

jsonschema = pytest.importorskip("jsonschema")

PROMPT = [5, 6, 7, 8, 5, 6]
SAMPLINGS = [dict(temperature=0.0), dict(temperature=1.0, seed=1), dict(temperature=1.0, seed=2),
             dict(temperature=0.8, top_p=0.9, seed=3)]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 20},
                                           "color": {"enum": ["red", "green", "blue"]},
                                           "id": {"type": "string", "format": "uuid"},
                                           "tags": {"type": "array", "items": {"type": "string", "maxLength": 3},
                                                    "maxItems": 2}},
          "required": ["ok", "n", "color", "id"]}


@pytest.fixture(scope="module")
def tmodel(model_dir):
    """The model with its tokenizer.json (a constraint needs each id's bytes)."""
    with sparkmono.Model(model_dir) as m:
        yield m


@pytest.fixture(scope="module")
def eng(tmodel):
    with sparkmono.Engine(tmodel, max_requests=3, threads=2) as e:
        yield e


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


def test_json_schema(eng):
    for samp in SAMPLINGS:
        for spec in (SCHEMA, json.dumps(SCHEMA)):
            c = eng.generate(PROMPT, max_tokens=300, json_schema=spec, **samp)
            assert c.finish_reason == "stop" and c.ids[-1] == 2, (samp, c)
            validate(SCHEMA, c.text)
            assert compact(c.text), c.text


def test_regex(eng):
    for rx in (r"[a-z]{1,8}", r"\d{3}-\d{4}", r"(cat|dog|bird)s?", r"[A-Z][a-z]{2,5} [0-9]{1,2}"):
        for samp in SAMPLINGS:
            c = eng.generate("Say:", max_tokens=60, regex=rx, **samp)
            assert c.finish_reason == "stop" and re.fullmatch(rx, c.text), (rx, samp, c)


def test_choice(eng):
    ch = ["yes", "no", "maybe so"]
    seen = set()
    for seed in range(8):
        c = eng.generate(PROMPT, max_tokens=20, choice=ch, temperature=1.0, seed=seed)
        assert c.text in ch and c.finish_reason == "stop", c
        seen.add(c.text)
    assert len(seen) > 1, seen
    assert eng.generate(PROMPT, max_tokens=20, choice=("a", "b")).text in ("a", "b")


def test_json_object(eng):
    for samp in SAMPLINGS:
        c = eng.generate(PROMPT, max_tokens=40, json_object=True, **samp)
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.text), dict), c
        else:
            assert c.text.startswith("{") and len(c.ids) == 40, c


def test_any_whitespace(eng):
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}
    texts = [eng.generate(PROMPT, max_tokens=200, json_schema=schema, any_whitespace=True, temperature=1.0, seed=s)
             for s in range(4)]
    for c in texts:
        if c.finish_reason == "stop":
            validate(schema, c.text)
    assert any(re.search(r"\s", c.text) for c in texts)
    assert all(not re.search(r"\s", eng.generate(PROMPT, max_tokens=50, json_schema=schema, temperature=1.0, seed=s).text)
               for s in range(4))


def test_shared_constraint(tmodel, eng):
    """One Constraint: every prompt of generate_many, calls after calls, two engines; equal to the keyword form."""
    c = sparkmono.Constraint(tmodel, "json_schema", SCHEMA)
    assert c.kind == "json_schema" and "json_schema" in repr(c)
    prompts = [PROMPT, [9, 10, 11], "Hello", [42]]
    outs = eng.generate_many(prompts, max_tokens=300, constraint=c, temperature=1.0, seed=7)
    for o in outs:
        assert o.finish_reason == "stop"
        validate(SCHEMA, o.text)
    again = eng.generate_many(prompts, max_tokens=300, constraint=c, temperature=1.0, seed=7)
    assert [o.ids for o in again] == [o.ids for o in outs]
    kw = eng.generate(PROMPT, max_tokens=300, json_schema=SCHEMA, temperature=1.0, seed=7)
    assert kw.ids == outs[0].ids
    with sparkmono.Engine(tmodel, request_rows=1, threads=2) as e2:  # no speculation: the same ids
        assert e2.generate(PROMPT, max_tokens=300, constraint=c, temperature=1.0, seed=7).ids == outs[0].ids
    with sparkmono.Constraint(tmodel, "choice", ["x", "y"]) as yc:
        assert eng.generate(PROMPT, max_tokens=5, constraint=yc).text in ("x", "y")
    with pytest.raises(sparkmono.SparkmonoError, match="the constraint is closed"):
        eng.generate(PROMPT, max_tokens=5, constraint=yc)
    c.close()
    c.close()  # twice: nothing


def test_length_prefix(eng):
    c = eng.generate(PROMPT, max_tokens=4, regex=r"[a-z]{30}")
    assert c.finish_reason == "length" and re.fullmatch(r"[a-z]{1,29}", c.text), c


@pytest.mark.parametrize("kw, says", [
    (dict(regex="(ab"), "regex"),
    (dict(regex="a(?=b)"), "regex"),
    (dict(json_schema={"type": "object", "not": {}}), "'not'"),
    (dict(json_schema={"type": "strin"}), "strin"),
    (dict(json_schema="{nope"), "invalid JSON"),
    (dict(choice=[]), "choice"),
])
def test_bad_spec_raises(eng, kw, says):
    with pytest.raises(sparkmono.SparkmonoValueError, match=re.escape(says)) as ei:
        eng.generate(PROMPT, max_tokens=5, **kw)
    assert ei.value.status_name == "invalid argument" and ei.value.message


def test_bad_constraint_objects(tmodel, model, eng):
    with pytest.raises(sparkmono.SparkmonoValueError, match="grammar"):
        sparkmono.Constraint(tmodel, "grammar", 'root ::= "a"')
    with pytest.raises(sparkmono.SparkmonoValueError, match="unknown kind 'xml'"):
        sparkmono.Constraint(tmodel, "xml", "<a/>")
    with pytest.raises(sparkmono.SparkmonoError, match="tokenizer.json"):
        sparkmono.Constraint(model, "regex", "a")  # the model without its tokenizer
    with pytest.raises(TypeError, match="kind must be a str"):
        sparkmono.Constraint(tmodel, 5, "a")
    with pytest.raises(TypeError, match="must be a str"):
        sparkmono.Constraint(tmodel, "regex", 5)
    with pytest.raises(TypeError, match=r"choice\[1\] must be a str"):
        sparkmono.Constraint(tmodel, "choice", ["a", 1])
    with pytest.raises(ValueError, match="takes no spec"):
        sparkmono.Constraint(tmodel, "json_object", {})
    with pytest.raises(TypeError, match="any_whitespace must be a bool"):
        sparkmono.Constraint(tmodel, "json_object", any_whitespace=1)
    with pytest.raises(ValueError, match="regex and choice: give at most one constraint"):
        eng.generate(PROMPT, regex="a", choice=["a"])
    with pytest.raises(ValueError, match="give at most one"):
        eng.generate(PROMPT, json_object=True, json_schema={"type": "object"})
    with pytest.raises(ValueError, match="any_whitespace goes with"):
        eng.generate(PROMPT, regex="a", any_whitespace=True)
    with pytest.raises(TypeError, match="constraint must be a sparkmono.Constraint"):
        eng.generate(PROMPT, constraint="a")
    with pytest.raises(TypeError, match="json_object must be a bool"):
        eng.generate(PROMPT, json_object=1)
    with sparkmono.Model(tmodel.path) as other:
        oc = sparkmono.Constraint(other, "regex", "a")
        with pytest.raises(ValueError, match="another model"):
            eng.generate(PROMPT, constraint=oc)
    assert oc._h is None  # released with its model


def test_equals_server(tmodel, eng, tmp, model_dir):
    """The binding's constrained ids are the server's for the same request."""
    import importlib.util
    import os

    import requests

    # the serve tests' Server (tests/serve/conftest.py), loaded under its own name
    spec = importlib.util.spec_from_file_location(
        "serve_conftest", os.path.join(os.path.dirname(__file__), "..", "serve", "conftest.py"))
    sc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sc)
    s = sc.Server(model_dir, tmp, "--max-requests", "2")
    try:
        for samp in SAMPLINGS[:2]:
            body = dict(model=s.name, prompt=PROMPT, max_tokens=300, guided_json=SCHEMA, **samp)
            r = requests.post(s.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
            assert r["token_ids"] == eng.generate(PROMPT, max_tokens=300, json_schema=SCHEMA, **samp).ids
    finally:
        assert s.stop() == 0
