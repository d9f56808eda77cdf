"""test_vllm_fields.py: vLLM's sampling fields that `sparkmono serve` honours (min_p,
allowed_token_ids, bad_words, include_stop_str_in_output, skip_special_tokens,
truncate_prompt_tokens, prompt_logprobs, stream_options.continuous_usage_stats), logprobs'
text_offset in characters, and the HTTP edges of a malformed request line, a NUL in the path and
"\\u0000" in a JSON string.  Through the official `openai` client (vLLM's fields in extra_body)
and `requests`, raw sockets for what no client sends.  The references: numpy over the raw
logits `sparkmono logits` gives for each prefix (the processed argmax, the log-softmax), the
Hugging Face `tokenizers` package for the text and for bad words' ids (vLLM's rule: each word
without its leading whitespace, then after one space when that makes another first token of the
same count), and vLLM's shapes; a speculative server equals a plain one; every bad value is a
400 naming the field."""
import json
import os
import socket
import subprocess
import time

import numpy as np
import pytest
import requests

from conftest import TIMEOUT, Server, sse_events
from smtest import SM_BIN, log_softmax, raw_logits

PROMPT = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]


@pytest.fixture(scope="module")
def plain(tmp, ids_dir):
    """A server without speculation: one row a request a step."""
    s = Server(ids_dir, tmp, "--request-rows", "1", "--max-requests", "2")
    yield s
    assert s.stop() == 0, s.read_log()


def post(server, body, path="/v1/completions"):
    return requests.post(server.url + path, data=json.dumps(dict({"model": server.name}, **body)), timeout=TIMEOUT)


def choice(server, **kw):
    body = dict(prompt=PROMPT, max_tokens=12, temperature=0)
    body.update(kw)
    r = post(server, body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def ids_of(server, **kw):
    return choice(server, **kw)["token_ids"]


def bad_request(server, body, param, words, path="/v1/completions"):
    r = post(server, body, path)
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["param"] == param and words in e["message"], e


# ---- min_p ------------------------------------------------------------------------------------

def test_min_p_keeps_likely_ids(server, ids_dir, tmp):
    """Every sampled id has probability at least min_p times the likeliest one's (after
    temperature: p / p_max = exp((l - l_max) / T) of the raw logits); without min_p the same
    seeds draw ids below it; greedy ignores it."""
    T, mp = 0.05, 0.5
    below = 0
    for seed in range(4):
        got = ids_of(server, max_tokens=6, temperature=T, seed=seed, min_p=mp)
        free = ids_of(server, max_tokens=6, temperature=T, seed=seed)
        for ids, must in ((got, True), (free, False)):
            for j, t in enumerate(ids):
                row = raw_logits(ids_dir, tmp, PROMPT + ids[:j])
                ok = np.exp((row[t] - row.max()) / T) >= mp * (1 - 1e-6)
                assert ok or not must, (seed, j, t)
                below += not ok
    assert below > 0, "min_p changed nothing: choose a lower temperature"
    assert ids_of(server, min_p=0.9) == ids_of(server)


def test_min_p_openai_client_and_speculation(server, plain):
    c = server.client()
    r = c.completions.create(model=server.name, prompt=PROMPT, max_tokens=16, temperature=0.3, seed=5,
                             extra_body={"min_p": 0.6})
    ids = r.choices[0].model_extra["token_ids"]
    assert ids == ids_of(server, max_tokens=16, temperature=0.3, seed=5, min_p=0.6)
    for kw in [dict(temperature=0.3, seed=5, min_p=0.6), dict(temperature=1.0, seed=9, min_p=0.95, top_k=20),
               dict(temperature=0.5, seed=3, min_p=0.2, top_p=0.5)]:
        assert ids_of(server, max_tokens=24, **kw) == ids_of(plain, max_tokens=24, **kw), kw


# ---- allowed_token_ids ------------------------------------------------------------------------

def test_allowed_token_ids(server, plain, ids_dir, tmp):
    """Only the allowed ids come (eos too only when listed), each the argmax of the raw logits
    restricted to them; sampled ones too; a speculative server equals a plain one."""
    allow = [9, 40, 41, 300, 301, 2]
    ids = ids_of(server, allowed_token_ids=allow, max_tokens=6)
    for j, t in enumerate(ids):
        row = raw_logits(ids_dir, tmp, PROMPT + ids[:j])
        assert t == max(allow, key=lambda a: (row[a], -a)), (j, t)
    for seed in range(3):
        got = ids_of(server, allowed_token_ids=allow, temperature=1.0, seed=seed, max_tokens=16)
        assert set(got) <= set(allow), got
        assert got == ids_of(plain, allowed_token_ids=allow, temperature=1.0, seed=seed, max_tokens=16)
    r = server.client().completions.create(model=server.name, prompt=PROMPT, max_tokens=6, temperature=0,
                                           extra_body={"allowed_token_ids": allow})
    assert r.choices[0].model_extra["token_ids"] == ids


# ---- bad_words --------------------------------------------------------------------------------

def vllm_bad_word_ids(tok, words):
    """vLLM's id sequences of words (SamplingParams' rule, written from its behaviour)."""
    seqs = []
    for w in words:
        plain = tok.encode(w.lstrip(), add_special_tokens=False).ids
        seqs.append(plain)
        spaced = tok.encode(" " + w.lstrip(), add_special_tokens=False).ids
        if spaced[0] != plain[0] and len(spaced) == len(plain):
            seqs.append(spaced)
    return seqs


def test_bad_words_as_vllm(text_server, model_dir, tmp, hf_tok):
    """Each greedy id is the argmax of the raw logits with every bad sequence's last id masked
    where the generated ids end with the rest of it (sequences made by vLLM's rule with the
    `tokenizers` package); the output differs from the free one; chat takes them too."""
    prompt = hf_tok.encode("hello world", add_special_tokens=False).ids
    free = choice(text_server, prompt="hello world")
    texts = [hf_tok.decode([t]) for t in free["token_ids"]]
    # words from the free output (a one-token word, a two-token one) and some that never come
    words = [texts[1].strip(), texts[0] + texts[1], "  zebra crossing", "\tquick brown"]
    seqs = vllm_bad_word_ids(hf_tok, words)
    assert any(len(s) > 1 for s in seqs) and len(seqs) > len(words)
    got = choice(text_server, prompt="hello world", bad_words=words)
    ids = got["token_ids"]
    for j, t in enumerate(ids):
        row = raw_logits(model_dir, tmp, prompt + ids[:j])
        for s in seqs:
            if len(s) - 1 <= j and ids[j - len(s) + 1:j] == s[:-1]:
                row[s[-1]] = -np.inf
        assert int(np.argmax(row)) == t, (j, t, words)
    assert ids != free["token_ids"]
    c = text_server.client().chat.completions.create(model=text_server.name, messages=[{"role": "user", "content": "hi"}],
                                                     max_tokens=8, temperature=0, extra_body={"bad_words": words})
    assert c.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("words,msg", [
    ("hello", "'bad_words' must be a list of strings"),
    ([1], "'bad_words' entry 0 is not a string"),
    (["ok", ""], "bad word 1 is empty"),
    ([" \t\u3000"], "bad word 0 is empty"),
    (["x"] * 65, "at most 64 are allowed"),
    (["a b c d e f g h i j k l m n o p q r s t u v w x y z " * 5] * 10, "more than 64 id sequences or 512 ids"),
])
def test_bad_words_refused(text_server, words, msg):
    bad_request(text_server, {"prompt": "hello", "max_tokens": 2, "bad_words": words}, "bad_words", msg)


# ---- the other processors' fields: refusals ---------------------------------------------------

@pytest.mark.parametrize("fields,param,msg", [
    ({"min_p": 1.5}, "min_p", "'min_p' is 1.5; it must be in [0, 1]"),
    ({"min_p": -0.1}, "min_p", "'min_p' is -0.1; it must be in [0, 1]"),
    ({"min_p": "0.1"}, "min_p", "'min_p' must be a number in [0, 1]"),
    ({"allowed_token_ids": []}, "allowed_token_ids", "'allowed_token_ids' is an empty list"),
    ({"allowed_token_ids": [1, 512]}, "allowed_token_ids", "'allowed_token_ids' entry 1 is not a token id in [0, 512)"),
    ({"allowed_token_ids": 5}, "allowed_token_ids", "'allowed_token_ids' must be a list of token ids"),
    ({"allowed_token_ids": [1] * 1025}, "allowed_token_ids", "'allowed_token_ids' has 1025 ids; at most 1024"),
    ({"bad_words": ["x"]}, "bad_words", "'bad_words' needs text, and this model directory has no tokenizer.json"),
    ({"include_stop_str_in_output": 1}, "include_stop_str_in_output", "must be true or false"),
    ({"skip_special_tokens": "no"}, "skip_special_tokens", "must be true or false"),
    ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens", "must be -1 (the model's maximum context length) or an "
                                                              "integer in [1, 4096]"),
    ({"truncate_prompt_tokens": 4097}, "truncate_prompt_tokens", "[1, 4096]"),
    ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens", "[1, 4096]"),
    ({"truncate_prompt_tokens": 1.5}, "truncate_prompt_tokens", "[1, 4096]"),
    ({"prompt_logprobs": 21}, "prompt_logprobs", "'prompt_logprobs' is 21; it must be in [0, 20]"),
    ({"prompt_logprobs": -1}, "prompt_logprobs", "it must be in [0, 20]"),
    ({"prompt_logprobs": 2, "stream": True}, "prompt_logprobs", "'prompt_logprobs' are not available with 'stream': true"),
    ({"stream_options": {"continuous_usage_stats": True}}, "stream_options", "only allowed with 'stream': true"),
    ({"stream": True, "stream_options": {"continuous_usage_stats": 1}}, "stream_options", "continuous_usage_stats"),
    ({"stream": True, "stream_options": {"other": True}}, "stream_options", "include_usage"),
])
def test_refusals(server, fields, param, msg):
    bad_request(server, dict({"prompt": PROMPT, "max_tokens": 4}, **fields), param, msg)


def test_fields_no_longer_ignored(server):
    """vLLM's fields are known now: none is logged as an unknown field."""
    choice(server, min_p=0.1, allowed_token_ids=[5, 6], include_stop_str_in_output=False, skip_special_tokens=True,
           truncate_prompt_tokens=8, prompt_logprobs=None, max_tokens=2)
    assert not [l for l in server.read_log().splitlines() if "ignored unknown field" in l and
                any(f in l for f in ("min_p", "allowed_token_ids", "skip_special", "include_stop", "truncate_prompt"))]


# ---- text: stop strings, special tokens -------------------------------------------------------

def test_include_stop_str_in_output(text_server):
    """The stop string stays at the end of the text (nothing after it); the text of an eos or
    stop id that ended the choice is left out unless asked (vLLM's rule)."""
    free = choice(text_server, prompt="hello world")
    text = free["text"]
    stop = text[3:5]
    cut = choice(text_server, prompt="hello world", stop=[stop])
    kept = choice(text_server, prompt="hello world", stop=[stop], include_stop_str_in_output=True)
    assert cut["finish_reason"] == kept["finish_reason"] == "stop"
    assert kept["text"] == text[:text.index(stop) + len(stop)] and cut["text"] == text[:text.index(stop)]
    # a stop id that is an ordinary token: its text is left out, unless include_stop_str_in_output
    sid = free["token_ids"][2]
    by_id = choice(text_server, prompt="hello world", stop_token_ids=[sid])
    by_id_kept = choice(text_server, prompt="hello world", stop_token_ids=[sid], include_stop_str_in_output=True)
    assert by_id["token_ids"] == by_id_kept["token_ids"] == free["token_ids"][:3]
    assert by_id_kept["text"].startswith(by_id["text"]) and len(by_id_kept["text"]) > len(by_id["text"])
    # streamed: the same text
    body = dict(model=text_server.name, prompt="hello world", max_tokens=12, temperature=0, stream=True, stop=[stop],
                include_stop_str_in_output=True)
    with requests.post(text_server.url + "/v1/completions", json=body, stream=True, timeout=TIMEOUT) as r:
        streamed = "".join(e["choices"][0]["text"] for e in sse_events(r) if isinstance(e, dict) and e["choices"])
    assert streamed == kept["text"]


def test_skip_special_tokens(text_server):
    """skip_special_tokens false keeps a special token's text (an eos in the middle, with
    ignore_eos); the eos that ends a choice is text only with include_stop_str_in_output."""
    eos = {"2": 100}
    assert choice(text_server, prompt="hi", logit_bias=eos, ignore_eos=True, max_tokens=3)["text"] == ""
    kept = choice(text_server, prompt="hi", logit_bias=eos, ignore_eos=True, max_tokens=3, skip_special_tokens=False)
    assert kept["text"] == "<|eos|>" * 3 and kept["token_ids"] == [2, 2, 2]
    end = choice(text_server, prompt="hi", logit_bias=eos, skip_special_tokens=False)
    assert end["token_ids"] == [2] and end["text"] == "" and end["finish_reason"] == "stop"
    end = choice(text_server, prompt="hi", logit_bias=eos, skip_special_tokens=False, include_stop_str_in_output=True)
    assert end["text"] == "<|eos|>"


# ---- truncate_prompt_tokens -------------------------------------------------------------------

def test_truncate_prompt_tokens(server, text_server, hf_tok):
    """The prompt's last k ids, as if sent alone: the same ids, k prompt tokens; a prompt longer
    than the context is taken when cut; -1 cuts to the context; a text prompt is cut after
    encoding; echo shows the cut prompt."""
    long = [5, 6, 7, 8] * 30
    r = post(server, dict(prompt=long, max_tokens=8, temperature=0, truncate_prompt_tokens=10)).json()
    assert r["choices"][0]["token_ids"] == ids_of(server, prompt=long[-10:], max_tokens=8)
    assert r["usage"]["prompt_tokens"] == 10
    big = [9, 10, 11, 12] * 1200  # 4800 ids: more than the context
    r = post(server, dict(prompt=big, max_tokens=4, temperature=0, truncate_prompt_tokens=100)).json()
    assert r["choices"][0]["token_ids"] == ids_of(server, prompt=big[-100:], max_tokens=4)
    bad_request(server, dict(prompt=big, max_tokens=4, truncate_prompt_tokens=-1), "prompt",
                "this model's maximum context length is 4096")
    ids = hf_tok.encode("the quick brown fox jumps", add_special_tokens=False).ids
    t = choice(text_server, prompt="the quick brown fox jumps", truncate_prompt_tokens=3, echo=True, max_tokens=4)
    alone = choice(text_server, prompt=ids[-3:], max_tokens=4)
    assert t["token_ids"] == alone["token_ids"]
    assert t["text"] == hf_tok.decode(ids[-3:]) + alone["text"]
    lists = post(server, dict(prompt=[long, PROMPT], max_tokens=3, temperature=0, truncate_prompt_tokens=4)).json()
    assert [c["token_ids"] for c in lists["choices"]] == [ids_of(server, prompt=long[-4:], max_tokens=3),
                                                          ids_of(server, prompt=PROMPT[-4:], max_tokens=3)]


# ---- prompt_logprobs --------------------------------------------------------------------------

def prompt_rows(ids_dir, tmp, prompt):
    out = os.path.join(tmp, "plp.npy")
    subprocess.run([SM_BIN, "logits", "--model", ids_dir, "--prompt-ids", ",".join(map(str, prompt)), "--out", out,
                    "--threads", "2"], check=True, capture_output=True)
    return np.load(out).astype(np.float64)


def row_rank(row, t):
    """The rank of id t in the raw logits row: 1 + the ids before it in the top list's order
    (a larger logit, or an equal one at a lower id; vLLM would count every equal one)."""
    return 1 + int((row > row[t]).sum()) + int((row[:t] == row[t]).sum())


def check_prompt_logprobs(plp, prompt, rows, k):
    """vLLM's shape: [null, {"id": {"logprob", "rank", "decoded_token"}}, ...], the prompt id first,
    then the k most likely ids, ranks 1..k; values a log-softmax of the row before; the prompt
    id's rank its place in the whole row.  Returns the positions whose prompt id is past the top k."""
    assert len(plp) == len(prompt) and plp[0] is None
    past = 0
    for j in range(1, len(prompt)):
        ref = log_softmax(rows[j - 1])
        best = [int(a) for a in np.argsort(-ref, kind="stable")[:k]]
        m = plp[j]
        assert list(m)[0] == str(prompt[j]) and set(m) == {str(prompt[j])} | {str(a) for a in best}, (j, m)
        for key, e in m.items():
            assert set(e) == {"logprob", "rank", "decoded_token"}, e
            assert abs(e["logprob"] - ref[int(key)]) < 1e-4, (j, key, e, ref[int(key)])
            assert e["decoded_token"] == "token_id:%s" % key
        for r, a in enumerate(best):
            if a != prompt[j]:
                assert m[str(a)]["rank"] == r + 1
        # the prompt id's rank: always known, its place in the top ids when it is one of them,
        # else from the whole row
        own = m[str(prompt[j])]["rank"]
        assert isinstance(own, int) and own >= 1 and own == row_rank(rows[j - 1], prompt[j]), (j, own)
        assert prompt[j] not in best or own == best.index(prompt[j]) + 1, (j, own, best)
        past += own > k
    return past


@pytest.mark.parametrize("k", [0, 3])
def test_prompt_logprobs(server, ids_dir, tmp, k):
    """Each choice's prompt_logprobs against the prefill logits; its own k beside logprobs' and
    echo's; the openai client sees the field; with n the same for every choice."""
    rows = prompt_rows(ids_dir, tmp, PROMPT)
    c = choice(server, max_tokens=3, prompt_logprobs=k)
    assert check_prompt_logprobs(c["prompt_logprobs"], PROMPT, rows, k) >= 3  # ranks past the top list checked
    assert c["logprobs"] is None
    both = choice(server, max_tokens=3, prompt_logprobs=k, logprobs=1, echo=True)
    check_prompt_logprobs(both["prompt_logprobs"], PROMPT, rows, k)
    assert all(t is None or len(t) <= 2 for t in both["logprobs"]["top_logprobs"])  # logprobs' own k (1)
    assert both["token_ids"] == c["token_ids"] == ids_of(server, max_tokens=3)
    r = server.client().completions.create(model=server.name, prompt=PROMPT, max_tokens=2, temperature=0, n=2,
                                           extra_body={"prompt_logprobs": k})
    for ch in r.choices:
        assert ch.model_extra["prompt_logprobs"] == c["prompt_logprobs"]
    assert "prompt_logprobs" not in choice(server, max_tokens=2)


def test_prompt_logprobs_greedy_ids_rank_first(server, ids_dir, tmp):
    """A prompt that goes on with its own greedy ids: each of those ranks 1, the first of its
    position's top ids; the others against the whole row."""
    more = ids_of(server, max_tokens=4)
    prompt = PROMPT + more
    plp = choice(server, prompt=prompt, max_tokens=1, prompt_logprobs=2)["prompt_logprobs"]
    check_prompt_logprobs(plp, prompt, prompt_rows(ids_dir, tmp, prompt), 2)
    for j in range(len(PROMPT), len(prompt)):
        assert plp[j][str(prompt[j])]["rank"] == 1 and list(plp[j])[0] == str(prompt[j]), (j, plp[j])


def test_prompt_logprobs_chat(text_server, hf_tok):
    """Chat: vLLM's prompt_logprobs beside the choices, of the rendered prompt's ids."""
    r = post(text_server, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "prompt_logprobs": 1},
             "/v1/chat/completions")
    assert r.status_code == 200, r.text
    body = r.json()
    plp = body["prompt_logprobs"]
    assert len(plp) == body["usage"]["prompt_tokens"] and plp[0] is None
    assert all(len(m) in (1, 2) for m in plp[1:])
    assert all(isinstance(e["rank"], int) and e["rank"] >= 1 for m in plp[1:] for e in m.values())
    for m in plp[1:]:
        for key, e in m.items():
            want = hf_tok.decode([int(key)], skip_special_tokens=False)
            assert e["decoded_token"] == want or "\ufffd" in want, (key, e)  # a piece of a character: U+FFFD


# ---- continuous usage -------------------------------------------------------------------------

@pytest.mark.parametrize("chat", [False, True])
def test_continuous_usage_stats(text_server, chat):
    """With include_usage and continuous_usage_stats every chunk carries its choice's usage so
    far (its prompt's tokens, its ids), the last one the totals; without include_usage none
    (vLLM's rule); the openai client reads them."""
    c = text_server.client()
    kw = dict(model=text_server.name, max_tokens=6, temperature=0, n=2, stream=True, extra_body={"ignore_eos": True},
              stream_options={"include_usage": True, "continuous_usage_stats": True})
    if chat:
        chunks = list(c.chat.completions.create(messages=[{"role": "user", "content": "hi"}], **kw))
    else:
        chunks = list(c.completions.create(prompt="hello world", **kw))
    assert all(ch.usage is not None for ch in chunks)
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 12
    seen = {0: 0, 1: 0}
    for ch in chunks[:-1]:
        i = ch.choices[0].index
        u = ch.usage
        if not chat:
            seen[i] += len(ch.choices[0].model_extra["token_ids"])
            assert u.completion_tokens == seen[i], (i, u)
        assert u.prompt_tokens == last.usage.prompt_tokens and u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert max(ch.usage.completion_tokens for ch in chunks[:-1]) == 6
    plain = list(c.completions.create(model=text_server.name, prompt="hello", max_tokens=3, stream=True,
                                      stream_options={"include_usage": False, "continuous_usage_stats": True}))
    assert all(ch.usage is None for ch in plain)


# ---- text_offset ------------------------------------------------------------------------------

def test_text_offset_counts_characters(text_server):
    """text_offset counts characters (code points, as OpenAI and vLLM), not bytes: each offset is
    the previous one plus the previous token's length as a Python str."""
    c = choice(text_server, prompt="Der Bär läuft — €5 ok", max_tokens=6, logprobs=1, echo=True)
    lp = c["logprobs"]
    assert lp["text_offset"][0] == 0
    for i in range(1, len(lp["tokens"])):
        assert lp["text_offset"][i] == lp["text_offset"][i - 1] + len(lp["tokens"][i - 1]), (i, lp)
    assert any(len(t.encode()) != len(t) for t in lp["tokens"])  # multi-byte tokens were counted


# ---- HTTP edges --------------------------------------------------------------------------------

def raw(server, data):
    """Everything the server writes back to data until it closes the connection."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as sk:
        sk.sendall(data)
        out = b""
        while True:
            d = sk.recv(65536)
            if not d:
                return out
            out += d


def test_nul_in_path(server):
    """A NUL in the request target, raw or escaped, is a 400 (libmicrohttpd would end the path
    at it and serve /health); the query may hold one."""
    for target in [b"/health\x00/x", b"/health%00/x", b"/v1/models\x00", b"/he%00alth"]:
        out = raw(server, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 400"), (target, out[:200])
        body = json.loads(out.split(b"\r\n\r\n", 1)[1])
        assert "NUL" in body["error"]["message"] and body["error"]["code"] == "bad_request"
    out = raw(server, b"GET /health?x=%00 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200"), out[:200]


PEEK = 4096  # SM_HTTP_PEEK: a first line's first space must come within this many bytes


def bad_line_400(out, words):
    """out is the front's whole 400 for a malformed request line (naming words), then the end."""
    head, body = out.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n"), out[:200]
    assert b"\r\nConnection: close" in head and b"\r\nContent-Length: %d" % len(body) in head, head
    e = json.loads(body)["error"]
    assert e == {"message": "malformed request line: " + words, "type": "invalid_request_error", "param": None,
                 "code": "bad_request"}, e


def test_malformed_request_line(server):
    """A request line libmicrohttpd can parse into method, target and version but not accept is
    its 400; one it cannot split (no space: HELLO, GET; a leading space: no method; no space in
    its first 4096 bytes, empty lines before it counted), which it would close without a word,
    the server's accept front answers 400 with an error body and closes, whole or sent in pieces
    (README: Serving); a request right after is served."""
    for line in [b"GET /health\r\n\r\n", b"GET /health HTTP/1.x\r\n\r\n", b"GET  HTTP/1.1\r\n\r\n"]:
        out = raw(server, line)
        assert out.startswith(b"HTTP/1.1 400"), (line, out[:100])
    cases = [(b"HELLO\r\n\r\n", "no request target"), (b"GET\r\n\r\n", "no request target"),
             (b"HELLO\n", "no request target"), (b"\r\n\r\nGET\r\n\r\n", "no request target"),
             (b" /health HTTP/1.1\r\n\r\n", "no method"),
             (b"A" * (PEEK - 2) + b"\r\n", "no request target"),
             (b"A" * PEEK, "no space in its first %d bytes" % PEEK),
             (b"A" * 100000 + b" / HTTP/1.1\r\n\r\n", "no space in its first %d bytes" % PEEK),
             (b"\r\n" * (PEEK // 2) + b"GET /health HTTP/1.1\r\n\r\n", "no space in its first %d bytes" % PEEK)]
    for line, words in cases:
        bad_line_400(raw(server, line), words)
        assert server.health()["status"] == "ok"
    # in pieces: nothing until the line is whole, then the 400 and the end
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as sk:
        sk.sendall(b"HEL")
        time.sleep(0.3)
        sk.setblocking(False)
        with pytest.raises(BlockingIOError):
            sk.recv(1)
        sk.setblocking(True)
        sk.sendall(b"LO\r\n\r\n")
        out = b""
        while (d := sk.recv(65536)):
            out += d
    bad_line_400(out, "no request target")
    # well formed, in pieces or after empty lines: served as ever
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as sk:
        sk.sendall(b"GE")
        time.sleep(0.3)
        sk.sendall(b"T /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        out = b""
        while (d := sk.recv(65536)):
            out += d
    assert out.startswith(b"HTTP/1.1 200"), out[:200]
    out = raw(server, b"\r\n\nGET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200"), out[:200]


def test_nul_in_json_strings(text_server, hf_tok):
    """"\\u0000" in a JSON string is a character: a prompt holding one is tokenized whole (by its
    length), as `tokenizers` does; /tokenize agrees; a stop string may hold one; a model name with
    one is another model."""
    text = "a\u0000b c\u0000"
    want = hf_tok.encode(text, add_special_tokens=False).ids
    r = post(text_server, {"prompt": text}, "/tokenize")
    assert r.status_code == 200 and r.json()["tokens"] == want, r.text
    r = post(text_server, {"prompt": text, "max_tokens": 3, "temperature": 0, "echo": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(want) and r.json()["choices"][0]["text"].startswith(text)
    assert post(text_server, {"prompt": "hi", "max_tokens": 2, "stop": ["x\u0000"]}).status_code == 200
    r = requests.post(text_server.url + "/v1/completions", timeout=TIMEOUT,
                      data=json.dumps({"model": text_server.name + "\u0000x", "prompt": "hi"}))
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
