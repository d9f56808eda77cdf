"""test_misc.py: the small endpoints of `sparkmono serve` (POST /tokenize, POST /detokenize,
GET /version, GET /metrics) and the refusals of text prompts (empty, too long, max_tokens past
the room the prompt leaves).  The references: the Hugging Face `tokenizers` package for the
tokens and the text, `sparkmono --version` for the version, prometheus_client's parser for the
metrics' text format.  Every refusal is checked for its status, param and message."""
import json
import subprocess
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from conftest import TIMEOUT, Server
from smtest import SM_BIN

TEXTS = ["hello world", "Der Bär läuft 42 km — ok?", "a\n\tb  c", "<|bos|>special<|eos|>"]


def post(server, path, body):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return requests.post(server.url + path, data=data, timeout=TIMEOUT, headers={"Content-Type": "application/json"})


def error_of(r, status, param, words):
    """r's OpenAI error: its status, param and a message holding words."""
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"}, e
    assert e["param"] == param, e
    assert words in e["message"] and "\n" not in e["message"], e
    return e


def test_tokenize_equals_hf(text_server, hf_tok):
    for t in TEXTS:
        r = post(text_server, "/tokenize", {"prompt": t, "model": text_server.name})
        assert r.status_code == 200, r.text
        want = hf_tok.encode(t, add_special_tokens=False).ids
        assert r.json() == {"tokens": want, "count": len(want), "max_model_len": 4096}, t


def test_tokenize_counts_what_completions_use(text_server):
    """/tokenize's count is the completion's prompt_tokens."""
    t = TEXTS[1]
    n = post(text_server, "/tokenize", {"prompt": t}).json()["count"]
    r = post(text_server, "/v1/completions", {"prompt": t, "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == n, r.text


def test_detokenize_equals_hf(text_server, hf_tok):
    for t in TEXTS:
        ids = hf_tok.encode(t, add_special_tokens=False).ids
        r = post(text_server, "/detokenize", {"tokens": ids})
        assert r.status_code == 200, r.text
        assert r.json() == {"prompt": hf_tok.decode(ids, skip_special_tokens=False)}, t
    assert post(text_server, "/detokenize", {"tokens": []}).json() == {"prompt": ""}


@pytest.mark.parametrize("path,body,status,param,words", [
    ("/tokenize", b"{", 400, None, "not valid JSON"),
    ("/tokenize", [1, 2], 400, None, "must be a JSON object"),
    ("/tokenize", {}, 400, "prompt", "'prompt' is required"),
    ("/tokenize", {"prompt": 5}, 400, "prompt", "'prompt' must be a string"),
    ("/tokenize", {"prompt": ""}, 400, "prompt", "'prompt' is an empty string"),
    ("/tokenize", {"prompt": "x", "messages": []}, 400, None, "unknown field 'messages'"),
    ("/tokenize", {"prompt": "x", "model": "other"}, 404, "model", "The model 'other' does not exist"),
    ("/tokenize", {"prompt": "x", "model": 3}, 400, "model", "'model' must be a string"),
    ("/detokenize", {}, 400, "tokens", "'tokens' is required"),
    ("/detokenize", {"tokens": "abc"}, 400, "tokens", "'tokens' must be a list of token ids"),
    ("/detokenize", {"tokens": [1, 512]}, 400, "tokens", "'tokens' index 1 is 512, outside the vocabulary [0, 512)"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens", "'tokens' index 0 is -1, outside the vocabulary"),
    ("/detokenize", {"tokens": [1, 2.5]}, 400, "tokens", "'tokens' index 1 is not an integer"),
    ("/detokenize", {"tokens": [1], "extra": 1}, 400, None, "unknown field 'extra'"),
])
def test_bad_bodies(text_server, path, body, status, param, words):
    error_of(post(text_server, path, body), status, param, words)


def test_no_tokenizer(server):
    error_of(post(server, "/tokenize", {"prompt": "hi"}), 400, "prompt", "no tokenizer.json")
    error_of(post(server, "/detokenize", {"tokens": [1, 2]}), 400, "tokens", "no tokenizer.json")


def test_methods(text_server):
    # a 405 names the methods its route takes in Allow (RFC 9110 section 15.5.6)
    r = requests.get(text_server.url + "/tokenize", timeout=TIMEOUT)
    assert r.status_code == 405 and "takes POST" in r.json()["error"]["message"], r.text
    assert r.headers.get("Allow") == "POST", r.headers
    r = requests.post(text_server.url + "/version", timeout=TIMEOUT)
    assert r.status_code == 405 and "takes GET" in r.json()["error"]["message"], r.text
    assert r.headers.get("Allow") == "GET, HEAD", r.headers


def test_version(text_server):
    out = subprocess.run([SM_BIN, "--version"], capture_output=True, text=True, check=True).stdout.split()
    r = requests.get(text_server.url + "/version", timeout=TIMEOUT)
    assert r.status_code == 200 and r.json() == {"version": out[1]}, r.text


def test_empty_text_prompt(text_server):
    r = post(text_server, "/v1/completions", {"prompt": "", "max_tokens": 2})
    error_of(r, 400, "prompt", "'prompt' is an empty string")
    r = post(text_server, "/v1/completions", {"prompt": [""], "max_tokens": 2})
    error_of(r, 400, "prompt", "'prompt' is an empty string")


def test_long_prompt_and_max_tokens(tmp, model_dir, hf_tok):
    """A prompt that leaves no room names the prompt; max_tokens names its real range."""
    s = Server(model_dir, tmp, "--max-len", "16", "--quiet")
    try:
        long_text = "hello world " * 20
        n = len(hf_tok.encode(long_text, add_special_tokens=False).ids)
        assert n > 16
        r = post(s, "/v1/completions", {"prompt": long_text, "max_tokens": 1})
        error_of(r, 400, "prompt", "the prompt has %d tokens; this model's maximum context length is 16 tokens" % n)
        r = post(s, "/v1/completions", {"prompt": [5] * 16, "max_tokens": 1})
        error_of(r, 400, "prompt", "the prompt has 16 tokens")
        k = len(hf_tok.encode("hello world", add_special_tokens=False).ids)
        r = post(s, "/v1/completions", {"prompt": "hello world", "max_tokens": 16})
        error_of(r, 400, "max_tokens", "'max_tokens' is 16; with this prompt of %d tokens it must be in [1, %d]" % (k, 16 - k))
        r = post(s, "/v1/completions", {"prompt": "hello world", "max_tokens": 16 - k, "temperature": 0})
        assert r.status_code == 200, r.text  # the top of that range is served
        error_of(post(s, "/v1/completions", {"prompt": "hi", "max_tokens": 0}), 400, "max_tokens", "'max_tokens' is 0; with this prompt of")
    finally:
        assert s.stop() == 0


def scrape(server):
    r = requests.get(server.url + "/metrics", timeout=TIMEOUT)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain; version=0.0.4"), r.headers
    out = {}
    for fam in text_string_to_metric_families(r.text):
        for smp in fam.samples:
            out[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
    return out


def test_metrics(tmp, model_dir):
    """The counters move by what was done, never back; the histograms count every step and request."""
    s = Server(model_dir, tmp, "--quiet")
    try:
        m0 = scrape(s)
        assert m0[("sparkmono_num_requests_running", ())] == 0 and m0[("sparkmono_num_requests_waiting", ())] == 0
        assert m0[("sparkmono_time_to_first_token_seconds_count", ())] == 0
        n_ok, gen, prompt = 3, 0, 0
        for i in range(n_ok):
            r = post(s, "/v1/completions", {"prompt": [5, 6, 7, 5, 6, 7][: i + 2], "max_tokens": 6, "temperature": 0})
            assert r.status_code == 200, r.text
            gen += r.json()["usage"]["completion_tokens"]
            prompt += i + 2
        assert post(s, "/v1/completions", {"prompt": []}).status_code == 400
        assert requests.get(s.url + "/nowhere", timeout=TIMEOUT).status_code == 404
        m1 = scrape(s)
        code = lambda m, c: m.get(("sparkmono_http_requests_total", (("code", c),)), 0)
        assert code(m1, "200") - code(m0, "200") == n_ok + 1  # the completions and the first scrape
        assert code(m1, "400") - code(m0, "400") == 1 and code(m1, "404") - code(m0, "404") == 1
        assert m1[("sparkmono_prompt_tokens_total", ())] == prompt
        assert m1[("sparkmono_generation_tokens_total", ())] == gen
        assert m1[("sparkmono_time_to_first_token_seconds_count", ())] == n_ok
        assert m1[("sparkmono_time_to_first_token_seconds_bucket", (("le", "+Inf"),))] == n_ok
        steps = m1[("sparkmono_verify_steps_total", ())]
        assert steps > 0 and m1[("sparkmono_verify_step_seconds_count", ())] == steps
        assert m1[("sparkmono_verify_step_seconds_sum", ())] > 0
        drafts = m1[("sparkmono_spec_decode_num_draft_tokens_total", ())]
        acc = m1[("sparkmono_spec_decode_num_accepted_tokens_total", ())]
        assert drafts > 0 and drafts % 7 == 0 and 0 <= acc <= drafts  # R = 8: 7 drafts a request a step
        # one token per request comes from the prefill, the rest from verify steps (accepted drafts + 1)
        assert gen >= acc
        # cumulative buckets never decrease
        b = [v for (k, lab), v in m1.items() if k == "sparkmono_verify_step_seconds_bucket"]
        assert b == sorted(b)
        time.sleep(0.01)
        m2 = scrape(s)
        for k, v in m1.items():
            if k[0].endswith(("_total", "_count", "_bucket", "_sum")):
                assert m2.get(k, 0) >= v, k
    finally:
        assert s.stop() == 0
