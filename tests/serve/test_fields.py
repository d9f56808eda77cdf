"""test_fields.py: the sampling and logit-processor fields of /v1/completions (src/serve/serve_fields.c,
src/engine/logitproc.c) through the official `openai` client: each field is sent and acts; the
tokens equal a numpy reference of the processed distribution built from the logits of
`sparkmono logits` for the same prefix; a speculative server (--request-rows 8) answers token for
token what a plain one (--request-rows 1) does, greedy and seeded, with each processor; unknown
fields are accepted with one log line; every bad value is a 400 naming the field and its range."""
import json
import os
import subprocess

import numpy as np
import pytest
import requests

from conftest import TIMEOUT, Server
from smtest import SM_BIN, log_softmax, raw_logits

PROMPT = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]


@pytest.fixture(scope="module")
def plain(tmp, ids_dir):
    """A server without speculation: one row a request a step."""
    s = Server(ids_dir, tmp, "--request-rows", "1", "--max-requests", "2")
    yield s
    assert s.stop() == 0, s.read_log()


def complete(server, **kw):
    body = {"model": server.name, "prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    body.update(kw)
    r = requests.post(server.url + "/v1/completions", data=json.dumps(body), timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    return c["token_ids"], c["finish_reason"]


def processed(row, prompt, gen, rep=1.0, pres=0.0, freq=0.0, bias=None):
    """vLLM's order: logit_bias, repetition (prompt + generated), frequency and presence (generated)."""
    x = row.copy()
    for t, b in (bias or {}).items():
        x[int(t)] += b
    hist = set(prompt) | set(gen)
    for t in hist:
        if rep != 1.0:
            x[t] = x[t] / rep if x[t] > 0 else x[t] * rep
    for t in set(gen):
        x[t] -= freq * gen.count(t) + pres
    return x.astype(np.float32)


# The tiny model's logits are about 0.5 with margins of 0.01..0.2: penalties that favour repeats
# (negative, or repetition < 1 on positive logits) change its greedy output; the others are
# checked against the reference and speculation but may leave it as it was.
CASES = [dict(repetition_penalty=0.5), dict(presence_penalty=-1.5), dict(frequency_penalty=-1.2),
         dict(logit_bias={"9": 4.0, "7": -3.0}), dict(repetition_penalty=0.7, presence_penalty=-0.5, frequency_penalty=0.4),
         dict(ignore_eos=True, logit_bias={"2": 5.0}), dict(min_tokens=6, stop_token_ids=[9, 7]),
         dict(repetition_penalty=1.7, presence_penalty=1.5, frequency_penalty=1.2)]
CHANGES = 6  # CASES[:CHANGES] change the greedy output of PROMPT


@pytest.mark.parametrize("case", range(len(CASES)))
def test_openai_client_fields(server, case):
    """The openai client sends each field (standard ones as arguments, vLLM's in extra_body)."""
    kw = dict(CASES[case])
    std = {k: kw.pop(k) for k in ("presence_penalty", "frequency_penalty", "logit_bias") if k in kw}
    r = server.client().completions.create(model=server.name, prompt=PROMPT, max_tokens=12, temperature=0,
                                           extra_body=kw, **std)
    ids = r.choices[0].token_ids if hasattr(r.choices[0], "token_ids") else r.model_extra["choices"][0]["token_ids"]
    assert (ids, r.choices[0].finish_reason) == complete(server, **CASES[case])
    assert ids != complete(server)[0] or case >= CHANGES, "the field changed nothing"


def test_processed_distribution(server, ids_dir, tmp):
    """Each generated token is the argmax of the numpy-processed raw logits of its prefix."""
    for kw, args in [(dict(repetition_penalty=0.5), dict(rep=0.5)),
                     (dict(presence_penalty=-1.5, frequency_penalty=0.9), dict(pres=-1.5, freq=0.9)),
                     (dict(presence_penalty=0.4, frequency_penalty=-0.7), dict(pres=0.4, freq=-0.7)),
                     (dict(logit_bias={"9": 4.0, "7": -3.0}, repetition_penalty=1.3),
                      dict(bias={"9": 4.0, "7": -3.0}, rep=1.3))]:
        ids, _ = complete(server, max_tokens=5, **kw)
        plain_ids, _ = complete(server, max_tokens=5)
        for j in range(len(ids)):
            row = processed(raw_logits(ids_dir, tmp, PROMPT + ids[:j]), PROMPT, ids[:j], **args)
            assert int(np.argmax(row)) == ids[j], (kw, j, ids)
        assert ids != plain_ids, kw


def test_stop_rules(server):
    ids, fin = complete(server, logit_bias={"2": 100})
    assert ids == [2] and fin == "stop"
    ids, fin = complete(server, logit_bias={"2": 100}, min_tokens=4)
    assert len(ids) == 5 and 2 not in ids[:4] and ids[4] == 2 and fin == "stop"
    ids, fin = complete(server, logit_bias={"2": 100}, ignore_eos=True)
    assert ids == [2] * 12 and fin == "length"
    base, _ = complete(server)
    ids, fin = complete(server, stop_token_ids=[base[3]])
    assert ids == base[:base.index(base[3]) + 1] and fin == "stop"


@pytest.mark.parametrize("case", range(len(CASES)))
def test_speculative_equals_plain(server, plain, case):
    for extra in [dict(temperature=0), dict(temperature=1.0, seed=7), dict(temperature=0.8, top_k=30, seed=99)]:
        kw = dict(CASES[case], **extra, max_tokens=24)
        assert complete(server, **kw) == complete(plain, **kw), kw


def test_unknown_fields_logged(server):
    ids, _ = complete(server, best_of_vllm_thing=3, use_beam_search=False)
    assert ids == complete(server)[0] == complete(server, response_format={"type": "text"})[0]  # free text: the default
    log = server.read_log()
    lines = [l for l in log.splitlines() if "ignored unknown field" in l and "best_of_vllm_thing" in l]
    assert len(lines) == 1 and "'use_beam_search'" in lines[0], lines


@pytest.mark.parametrize("fields,param,msg", [
    ({"presence_penalty": 2.5}, "presence_penalty", "'presence_penalty' is 2.5; it must be in [-2, 2]"),
    ({"frequency_penalty": "x"}, "frequency_penalty", "'frequency_penalty' must be a number in [-2, 2]"),
    ({"repetition_penalty": 0}, "repetition_penalty", "'repetition_penalty' must be a number in (0, 1e6]"),
    ({"logit_bias": {"abc": 1}}, "logit_bias", "'logit_bias' key 'abc' is not a token id in [0, 512)"),
    ({"logit_bias": {"512": 1}}, "logit_bias", "'logit_bias' key '512' is not a token id in [0, 512)"),
    ({"logit_bias": {"5": 101}}, "logit_bias", "'logit_bias' of token 5 must be a number in [-100, 100]"),
    ({"logit_bias": [1]}, "logit_bias", "'logit_bias' must be an object mapping token ids to biases"),
    ({"min_tokens": -1}, "min_tokens", "'min_tokens' must be an integer in [0, 4096]"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens", "'min_tokens' is 5; it must be in [0, max_tokens = 4]"),
    ({"ignore_eos": 1}, "ignore_eos", "'ignore_eos' must be true or false"),
    ({"stop_token_ids": [1, 600]}, "stop_token_ids", "'stop_token_ids' entry 1 is not a token id in [0, 512)"),
    ({"stop_token_ids": 3}, "stop_token_ids", "'stop_token_ids' must be a list of token ids"),
    ({"logprobs": 21}, "logprobs", "'logprobs' is 21; it must be in [0, 20]"),
    ({"logprobs": "3"}, "logprobs", "'logprobs' must be an integer in [0, 20]"),
    ({"temperature": "hot"}, "temperature", "'temperature' must be a number in [0, 2]"),
    ({"max_tokens": "8"}, "max_tokens", "'max_tokens' must be an integer"),
    ({"max_tokens": 0}, "max_tokens", "'max_tokens' is 0; with this prompt of 10 tokens it must be in [1, 4086]"),
    ({"max_tokens": 4090}, "max_tokens", "'max_tokens' is 4090; with this prompt of 10 tokens it must be in [1, 4086]"),
    ({"response_format": {"type": "json_object"}}, "response_format", "has no tokenizer.json"),
    ({"response_format": "json"}, "response_format", "'response_format' must be an object"),
])
def test_bad_values(server, fields, param, msg):
    body = {"model": server.name, "prompt": PROMPT, "max_tokens": 4}
    body.update(fields)
    r = requests.post(server.url + "/v1/completions", data=json.dumps(body), timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["param"] == param and msg in e["message"], e


@pytest.mark.parametrize("extra", [dict(temperature=0), dict(temperature=0.9, seed=5),
                                   dict(temperature=0, extra_body={"repetition_penalty": 0.5})])
def test_logprobs(server, plain, ids_dir, tmp, extra):
    """logprobs = a numpy log-softmax of the raw logits `sparkmono logits` gives for each prefix (the
    raw model distribution: before processors and temperature); the top alternatives in order;
    streaming chunks carry the same; a speculative server equals a plain one."""
    K = 3
    r = server.client().completions.create(model=server.name, prompt=PROMPT, max_tokens=6, logprobs=K, **extra)
    c = r.choices[0]
    ids = c.model_extra["token_ids"] if "token_ids" in (c.model_extra or {}) else c.token_ids
    lp = c.logprobs
    assert lp.tokens == ["token_id:%d" % t for t in ids]
    for j, t in enumerate(ids):
        ref = log_softmax(raw_logits(ids_dir, tmp, PROMPT + ids[:j]).astype(np.float32).astype(np.float64))
        assert abs(lp.token_logprobs[j] - ref[t]) < 1e-4, (j, lp.token_logprobs[j], ref[t])
        top = lp.top_logprobs[j]
        best = np.argsort(-ref, kind="stable")[:K]
        for a in best:
            assert abs(top["token_id:%d" % a] - ref[a]) < 1e-4, (j, a, top)
        assert set(top) == {"token_id:%d" % a for a in best} | {"token_id:%d" % t}
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    # the same through a stream, and from a server without speculation
    body = {"model": server.name, "prompt": PROMPT, "max_tokens": 6, "logprobs": K, "stream": True}
    body.update({k: v for k, v in extra.items() if k != "extra_body"}, **extra.get("extra_body", {}))
    got = []
    with requests.post(server.url + "/v1/completions", data=json.dumps(body), stream=True, timeout=TIMEOUT) as resp:
        for line in resp.iter_lines():
            if line.startswith(b"data: {"):
                ch = json.loads(line[6:])["choices"][0]
                if ch["logprobs"]:
                    got += ch["logprobs"]["token_logprobs"]
    assert got == lp.token_logprobs
    r1 = plain.client().completions.create(model=plain.name, prompt=PROMPT, max_tokens=6, logprobs=K, **extra)
    assert r1.choices[0].logprobs.tokens == lp.tokens
    assert np.allclose(r1.choices[0].logprobs.token_logprobs, lp.token_logprobs, atol=1e-5)


def test_echo(text_server):
    """echo: the prompt's text, then the completion's (the same completion as without echo), plain and
    streamed; with max_tokens 0 the prompt's text alone."""
    c = text_server.client()
    plain = c.completions.create(model=text_server.name, prompt="hello world", max_tokens=5, temperature=0)
    echo = c.completions.create(model=text_server.name, prompt="hello world", max_tokens=5, temperature=0, echo=True)
    assert echo.choices[0].text == "hello world" + plain.choices[0].text
    chunks = c.completions.create(model=text_server.name, prompt="hello world", max_tokens=5, temperature=0, echo=True,
                                  stream=True)
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == echo.choices[0].text
    alone = c.completions.create(model=text_server.name, prompt="hello world", max_tokens=0, echo=True)
    assert alone.choices[0].text == "hello world" and alone.choices[0].finish_reason == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_echo_logprobs(server, ids_dir, tmp, stream):
    """echo with logprobs (how evaluation harnesses score a text: max_tokens 1, logprobs 1): the
    prompt's ids come first, the first with a null logprob and null alternatives, each other one's
    logprob a numpy log-softmax of the prefill logits of the row before it; then the generated
    ids' logprobs, the same as without echo; streamed, the first chunk carries the prompt's."""
    K = 2
    body = {"model": server.name, "prompt": PROMPT, "max_tokens": 3, "temperature": 0, "logprobs": K, "echo": True}
    if stream:
        tokens, tlp, tops = [], [], []
        with requests.post(server.url + "/v1/completions", data=json.dumps(dict(body, stream=True)), stream=True,
                           timeout=TIMEOUT) as resp:
            for line in resp.iter_lines():
                if line.startswith(b"data: {"):
                    ch = json.loads(line[6:])["choices"][0]
                    if ch["logprobs"]:
                        tokens += ch["logprobs"]["tokens"]
                        tlp += ch["logprobs"]["token_logprobs"]
                        tops += ch["logprobs"]["top_logprobs"]
    else:
        r = requests.post(server.url + "/v1/completions", data=json.dumps(body), timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        lp = r.json()["choices"][0]["logprobs"]
        tokens, tlp, tops = lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]
        assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    P = len(PROMPT)
    assert tokens[:P] == ["token_id:%d" % t for t in PROMPT] and len(tokens) == P + 3
    assert tlp[0] is None and tops[0] is None
    out = os.path.join(tmp, "echo_lg.npy")  # every prefix row of the prompt in one prefill
    subprocess.run([SM_BIN, "logits", "--model", ids_dir, "--prompt-ids", ",".join(map(str, PROMPT)), "--out", out,
                    "--threads", "2"], check=True, capture_output=True)
    rows = np.load(out).astype(np.float64)
    for j in range(1, P):
        ref = log_softmax(rows[j - 1])
        assert abs(tlp[j] - ref[PROMPT[j]]) < 1e-4, (j, tlp[j], ref[PROMPT[j]])
        best = np.argsort(-ref, kind="stable")[:K]
        assert set(tops[j]) == {"token_id:%d" % a for a in best} | {"token_id:%d" % PROMPT[j]}
    plain = requests.post(server.url + "/v1/completions", timeout=TIMEOUT, data=json.dumps(dict(body, echo=False))).json()
    assert tlp[P:] == plain["choices"][0]["logprobs"]["token_logprobs"]


@pytest.mark.parametrize("stream", [False, True])
def test_echo_alone(server, stream):
    """max_tokens 0 with echo (how lm-evaluation-harness scores a whole text): the prompt alone,
    its ids' logprobs and alternatives exactly those of the same request with ids generated
    after it, finish_reason length and no completion tokens, plain and streamed (one chunk);
    without logprobs the prompt alone too; without echo max_tokens 0 stays a 400."""
    K = 2
    body = {"model": server.name, "prompt": PROMPT, "max_tokens": 0, "temperature": 0, "logprobs": K, "echo": True}
    P = len(PROMPT)
    ref = requests.post(server.url + "/v1/completions", data=json.dumps(dict(body, max_tokens=3)), timeout=TIMEOUT)
    assert ref.status_code == 200, ref.text
    ref = ref.json()["choices"][0]["logprobs"]
    if stream:
        chunks = []
        with requests.post(server.url + "/v1/completions", data=json.dumps(dict(body, stream=True)), stream=True,
                           timeout=TIMEOUT) as resp:
            assert resp.status_code == 200, resp.text
            for line in resp.iter_lines():
                if line.startswith(b"data: {"):
                    chunks.append(json.loads(line[6:])["choices"][0])
        assert len(chunks) == 1, chunks
        ch = chunks[0]
    else:
        r = requests.post(server.url + "/v1/completions", data=json.dumps(body), timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        assert r.json()["usage"] == {"prompt_tokens": P, "completion_tokens": 0, "total_tokens": P}
        ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "length" and ch["token_ids"] == []
    lp = ch["logprobs"]
    for f in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert lp[f] == ref[f][:P], (f, lp[f], ref[f][:P])
    assert lp["token_logprobs"][0] is None and all(x is not None for x in lp["token_logprobs"][1:])
    no_lp = requests.post(server.url + "/v1/completions", data=json.dumps(dict(body, logprobs=None)), timeout=TIMEOUT)
    assert no_lp.status_code == 200 and no_lp.json()["choices"][0]["logprobs"] is None, no_lp.text
    no_echo = requests.post(server.url + "/v1/completions", data=json.dumps(dict(body, echo=False)), timeout=TIMEOUT)
    assert no_echo.status_code == 400 and "or 0 with 'echo': true" in no_echo.json()["error"]["message"], no_echo.text
