"""test_auth.py: `sparkmono serve --api-key KEY` (and SPARKMONO_API_KEY; the flag wins): every
/v1/ request needs "Authorization: Bearer KEY" (401 with an OpenAI error body without it or
with another key), the paths outside /v1/ stay open (as vLLM's), the openai client with
api_key works, and listening off loopback without a key prints one warning line."""
import time

import openai
import pytest
import requests

from conftest import TIMEOUT, Server

KEY = "sk-test-0123456789"


def auth(key):
    return {"Authorization": "Bearer " + key}


def wait_log(s, words, seconds=5):
    """s's log once it holds words (or as it is after seconds)."""
    t_end = time.monotonic() + seconds
    while True:
        log = s.read_log()
        if words in log or time.monotonic() > t_end:
            return log
        time.sleep(0.05)


def check_401(r):
    assert r.status_code == 401, r.text
    e = r.json()["error"]
    assert e["code"] == "invalid_api_key" and e["type"] == "invalid_request_error", e
    assert "Incorrect API key provided" in e["message"] and "\n" not in e["message"], e


@pytest.fixture(scope="module")
def key_server(tmp, model_dir):
    s = Server(model_dir, tmp, "--api-key", KEY, "--quiet")
    yield s
    assert s.stop() == 0, s.read_log()


def test_401_without_or_wrong_key(key_server):
    u = key_server.url
    body = {"prompt": [5, 6, 7], "max_tokens": 2}
    check_401(requests.get(u + "/v1/models", timeout=TIMEOUT))
    check_401(requests.post(u + "/v1/completions", json=body, timeout=TIMEOUT))
    for bad in [KEY[:-1], KEY + "x", "", KEY.upper(), "x" * len(KEY)]:
        check_401(requests.post(u + "/v1/completions", json=body, headers=auth(bad), timeout=TIMEOUT))
    check_401(requests.get(u + "/v1/models", headers={"Authorization": KEY}, timeout=TIMEOUT))  # no "Bearer "
    check_401(requests.get(u + "/v1/models", headers={"Authorization": "Basic " + KEY}, timeout=TIMEOUT))
    check_401(requests.get(u + "/v1/nowhere", timeout=TIMEOUT))  # a /v1/ path is guarded before it is routed


def test_200_with_key(key_server):
    u = key_server.url
    r = requests.post(u + "/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0},
                      headers=auth(KEY), timeout=TIMEOUT)
    assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) >= 1, r.text
    r = requests.get(u + "/v1/models", headers=auth(KEY), timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["data"][0]["id"] == key_server.name, r.text


def test_open_paths(key_server):
    """Outside /v1/: open without a key (vLLM's rule)."""
    u = key_server.url
    assert requests.get(u + "/health", timeout=TIMEOUT).status_code == 200
    assert requests.get(u + "/metrics", timeout=TIMEOUT).status_code == 200
    assert requests.get(u + "/version", timeout=TIMEOUT).status_code == 200
    assert requests.post(u + "/tokenize", json={"prompt": "hi"}, timeout=TIMEOUT).status_code == 200
    assert requests.post(u + "/detokenize", json={"tokens": [5]}, timeout=TIMEOUT).status_code == 200


def test_openai_client(key_server):
    good = openai.OpenAI(base_url=key_server.url + "/v1", api_key=KEY, max_retries=0, timeout=TIMEOUT)
    r = good.completions.create(model=key_server.name, prompt="hello", max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens >= 1
    bad = openai.OpenAI(base_url=key_server.url + "/v1", api_key="wrong", max_retries=0, timeout=TIMEOUT)
    with pytest.raises(openai.AuthenticationError) as ei:
        bad.models.list()
    assert "Incorrect API key provided" in str(ei.value)


def test_env_key_and_flag_wins(tmp, model_dir, monkeypatch):
    monkeypatch.setenv("SPARKMONO_API_KEY", "from-env")
    s = Server(model_dir, tmp, "--quiet")
    try:
        check_401(requests.get(s.url + "/v1/models", timeout=TIMEOUT))
        assert requests.get(s.url + "/v1/models", headers=auth("from-env"), timeout=TIMEOUT).status_code == 200
    finally:
        assert s.stop() == 0
    s = Server(model_dir, tmp, "--quiet", "--api-key", "from-flag")
    try:
        check_401(requests.get(s.url + "/v1/models", headers=auth("from-env"), timeout=TIMEOUT))
        assert requests.get(s.url + "/v1/models", headers=auth("from-flag"), timeout=TIMEOUT).status_code == 200
    finally:
        assert s.stop() == 0


WARNING = "serve: warning: listening on 0.0.0.0 without an API key (--api-key or SPARKMONO_API_KEY)"


def test_warning_off_loopback(tmp, model_dir, monkeypatch):
    monkeypatch.delenv("SPARKMONO_API_KEY", raising=False)
    s = Server(model_dir, tmp, "--quiet", "--host", "0.0.0.0")
    try:
        log = wait_log(s, WARNING)
        assert log.count(WARNING) == 1 and len(log.splitlines()) == 1, log
        assert requests.get(s.url + "/v1/models", timeout=TIMEOUT).status_code == 200  # no key: open
    finally:
        assert s.stop() == 0
    for args in (["--host", "0.0.0.0", "--api-key", KEY], ["--host", "127.0.0.1"]):
        s = Server(model_dir, tmp, "--quiet", *args)
        try:
            time.sleep(0.3)  # a warning would be written right after the listening line
            assert "warning" not in s.read_log(), (args, s.read_log())
        finally:
            assert s.stop() == 0
