"""test_choices.py: many choices in one request, through the official `openai` client: `n`
choices of a prompt and lists of prompts (strings or token-id lists), indexed prompt-major
(index = prompt * n + i).  A seeded request with n is reproducible and its choice i is the same
request with n = 1 and seed + i; greedy choices are equal; a prompt list equals each prompt sent
alone; a stream equals the plain answer choice by choice; the limits are 400s naming the field;
a request whose choices do not all fit in the queue is a 503 that leaves none of them queued;
a client that hangs up frees every one of its choices."""
import json
import threading

import pytest
import requests

from conftest import TIMEOUT, Server, sse_events
from smtest import generate_cli
from test_cancel import LONG, raw_completion, wait_health

PROMPT = [5, 6, 7, 8, 5, 6]
TEXTS = ["Once upon a time", "The harbour was quiet"]


def post(server, body, path="/v1/completions"):
    body = dict(body, model=server.name)
    return requests.post(server.url + path, data=json.dumps(body), timeout=TIMEOUT)


def plain(server, **body):
    r = post(server, body)
    assert r.status_code == 200, r.text
    return r.json()


def by_index(choices):
    """(text, token_ids, finish_reason) of each choice, in index order (checked 0..n-1)."""
    assert [c["index"] for c in choices] == list(range(len(choices))), choices
    return [(c["text"], c["token_ids"], c["finish_reason"]) for c in choices]


def streamed(server, path="/v1/completions", **body):
    """Each index's (text, token_ids, finish_reason) rebuilt from a stream, and its usage: one
    finish chunk an index, [DONE] once, last."""
    body = dict(body, model=server.name, stream=True, stream_options={"include_usage": True})
    with requests.post(server.url + path, json=body, stream=True, timeout=TIMEOUT) as r:
        assert r.status_code == 200, r.text
        events = list(sse_events(r))
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    out, usage = {}, events[-2]["usage"]
    for ev in events[:-2]:
        assert len(ev["choices"]) == 1, ev
        c = ev["choices"][0]
        text, ids, fin = out.get(c["index"], ("", [], None))
        assert fin is None, "a chunk after the choice's finish chunk"
        if path.endswith("chat/completions"):
            text += c["delta"].get("content") or ""
        else:
            text, ids = text + c["text"], ids + c["token_ids"]
        out[c["index"]] = (text, ids, c["finish_reason"])
    assert sorted(out) == list(range(len(out)))
    return [out[i] for i in range(len(out))], usage


def test_seeded_n_reproducible(server):
    """Two identical seeded requests give identical choices; choice i is n = 1 with seed + i; the
    choices differ from each other; the usage counts the prompt once and every choice."""
    body = dict(prompt=PROMPT, max_tokens=12, temperature=0.9, n=3, seed=11)
    a, b = plain(server, **body), plain(server, **body)
    assert by_index(a["choices"]) == by_index(b["choices"])
    for i, ch in enumerate(by_index(a["choices"])):
        alone = plain(server, **dict(body, n=1, seed=11 + i))
        assert by_index(alone["choices"]) == [ch], i
    ids = [c["token_ids"] for c in a["choices"]]
    assert len({tuple(x) for x in ids}) > 1, ids
    assert a["usage"]["prompt_tokens"] == len(PROMPT)
    assert a["usage"]["completion_tokens"] == sum(len(x) for x in ids)


def test_unseeded_n_differ(server):
    r = plain(server, prompt=PROMPT, max_tokens=12, temperature=1.0, n=3)
    assert len({tuple(c["token_ids"]) for c in r["choices"]}) > 1, r["choices"]


def test_greedy_n_equal(server, ids_dir):
    r = server.client().completions.create(model=server.name, prompt=PROMPT, max_tokens=10, temperature=0, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    ref = generate_cli(ids_dir, PROMPT, 10)
    assert all(c.token_ids == ref for c in r.choices), [c.token_ids for c in r.choices]
    assert r.usage.completion_tokens == 3 * len(ref)


def test_prompt_list_of_ids(server, ids_dir):
    prompts = [[5, 6, 7], [8, 9], [100, 200, 300, 400]]
    r = server.client().completions.create(model=server.name, prompt=prompts, max_tokens=7, temperature=0, n=2)
    assert [c.index for c in r.choices] == list(range(6))
    for p, prompt in enumerate(prompts):
        ref = generate_cli(ids_dir, prompt, 7)
        assert [r.choices[p * 2 + i].token_ids for i in range(2)] == [ref, ref], p
    assert r.usage.prompt_tokens == sum(map(len, prompts))
    assert r.usage.completion_tokens == sum(len(c.token_ids) for c in r.choices)


@pytest.mark.parametrize("extra", [dict(temperature=0.8, seed=5), dict(temperature=0, echo=True),
                                   dict(temperature=0, logprobs=2)])
def test_prompt_list_equals_alone(text_server, extra):
    """A list of text prompts with n = 2 == each prompt alone with n = 2 (echo and logprobs a choice)."""
    r = plain(text_server, prompt=TEXTS, max_tokens=8, n=2, **extra)
    assert len(r["choices"]) == 4
    for p, text in enumerate(TEXTS):
        alone = plain(text_server, prompt=text, max_tokens=8, n=2, **extra)
        assert by_index(r["choices"])[2 * p:2 * p + 2] == by_index(alone["choices"]), p
        for i in range(2):
            assert r["choices"][2 * p + i]["logprobs"] == alone["choices"][i]["logprobs"]
            if extra.get("echo"):
                assert r["choices"][2 * p + i]["text"].startswith(text)
    assert r["usage"]["prompt_tokens"] == sum(plain(text_server, prompt=t, max_tokens=1)["usage"]["prompt_tokens"]
                                              for t in TEXTS)


@pytest.mark.parametrize("body", [dict(prompt=PROMPT, n=2, temperature=0.9, seed=3),
                                  dict(prompt=[[5, 6, 7], [8, 9]], n=2, temperature=0.7, seed=8),
                                  dict(prompt=[[5, 6, 7], [8, 9]], temperature=0)])
def test_stream_equals_plain(server, body):
    want = plain(server, max_tokens=9, **body)
    got, usage = streamed(server, max_tokens=9, **body)
    assert got == by_index(want["choices"])
    assert usage == want["usage"]


def test_stream_text_prompts(text_server):
    body = dict(prompt=TEXTS, n=2, temperature=0.9, seed=21, max_tokens=10)
    want = plain(text_server, **body)
    got, usage = streamed(text_server, **body)
    assert [g[0] for g in got] == [c["text"] for c in want["choices"]]
    assert got == by_index(want["choices"]) and usage == want["usage"]


@pytest.mark.parametrize("body,param,words", [
    (dict(n=9), "n", "'n' is 9; this server takes at most 8 choices a request"),
    (dict(n=0), "n", "'n' is 0; it must be in [1, 128]"),
    (dict(n="2"), "n", "'n' must be an integer"),
    (dict(n=3, prompt=[[1], [2], [3]]), "n", "3 prompts x 'n' 3 is 9 choices; this server takes at most 8"),
    (dict(prompt=[[1]] * 9), "prompt", "9 prompts x 'n' 1 is 9 choices"),
    (dict(prompt=[[1]] * 200), "prompt", "'prompt' holds 200 prompts"),
    (dict(prompt=[]), "prompt", "'prompt' is an empty list"),
    (dict(prompt=[[1, 2], []]), "prompt", "'prompt' entry 1 is an empty list"),
    (dict(prompt=[[1, 2], [3, 600]]), "prompt", "'prompt' entry 1 token index 1 is 600, outside the vocabulary"),
    (dict(prompt=[[1, 2], "a"]), "prompt", "'prompt' entry 1 is not a list of token ids like entry 0"),
    (dict(prompt=[[1, 2], [3, 2.5]]), "prompt", "'prompt' entry 1 token index 1 is not an integer"),
    (dict(prompt=[[1, 2], [1] * 4090], max_tokens=8), "max_tokens", "with prompt 1 of 4090 tokens it must be in [1, 6]"),
    (dict(n=2, best_of=3), "best_of", "'best_of' is 3; this server takes only best_of equal to n (2)"),
])
def test_limits(server, body, param, words):
    r = post(server, dict(dict(prompt=PROMPT, max_tokens=4), **body))
    e = r.json()["error"]
    assert r.status_code == 400 and e["param"] == param and words in e["message"], (r.status_code, e)
    assert "\n" not in e["message"]


def test_best_of_equal_to_n(server):
    r = plain(server, prompt=PROMPT, max_tokens=4, temperature=0, n=2, best_of=2)
    assert len(r["choices"]) == 2


def test_queue_all_or_nothing(tmp, ids_dir):
    """One slot and a queue of 2: with one request running, n = 3 cannot all wait: a 503 with
    Retry-After and nothing left queued; n = 2 fits and is served once the slot frees."""
    s = Server(ids_dir, tmp, "--max-requests", "1", "--queue", "2")
    try:
        long = {"model": s.name, "prompt": LONG, "max_tokens": 4000, "temperature": 0, "stream": True}
        a = requests.post(s.url + "/v1/completions", json=long, stream=True, timeout=TIMEOUT)
        events = sse_events(a)
        assert isinstance(next(events), dict)
        r = post(s, dict(prompt=[11, 12], max_tokens=4, n=3))
        assert r.status_code == 503 and r.headers.get("Retry-After") == "1", (r.status_code, r.text)
        assert r.json()["error"]["code"] == "overloaded" and "3 choices" in r.json()["error"]["message"]
        h = s.health()
        assert h["running"] == 1 and h["queued"] == 0, h
        got = {}
        prompt, n = [100, 200, 300], 6

        def two():
            got["r"] = post(s, dict(prompt=prompt, max_tokens=n, temperature=0, n=2))

        t = threading.Thread(target=two)
        t.start()
        h = wait_health(s, lambda h: h["queued"] == 2 or "r" in got)
        assert "r" not in got and h["queued"] == 2, h
        a.close()
        t.join(TIMEOUT)
        assert got["r"].status_code == 200, got["r"].text
        ref = generate_cli(ids_dir, prompt, n)
        assert [c["token_ids"] for c in got["r"].json()["choices"]] == [ref, ref]
    finally:
        assert s.stop() == 0, s.read_log()


@pytest.mark.parametrize("stream", [False, True])
def test_disconnect_frees_every_choice(tmp, ids_dir, stream):
    """Two slots, n = 4: two choices run and two wait; the client hangs up and all four are gone
    at once (the queue empty, the slots free, no more tokens)."""
    s = Server(ids_dir, tmp, "--max-requests", "2", "--queue", "4")
    try:
        sk = raw_completion(s, {"model": s.name, "prompt": LONG, "max_tokens": 4000, "temperature": 0, "n": 4,
                                "stream": stream})
        h = wait_health(s, lambda h: h["running"] == 2 and h["queued"] == 2 and h["tokens"] > 0)
        assert h["running"] == 2 and h["queued"] == 2, h
        sk.close()
        h = wait_health(s, lambda h: h["running"] == 0 and h["queued"] == 0, 1)
        assert h["running"] == 0 and h["queued"] == 0, h
        assert s.health()["tokens"] == h["tokens"]
        assert "client disconnected" in s.read_log()
    finally:
        assert s.stop() == 0, s.read_log()
