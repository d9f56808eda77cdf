"""test_cancel.py: clients that go away, through HTTP.  A queued client that hangs up leaves
the queue at once (two dead queued clients must not make a live one a 503); a running
non-streaming client that hangs up frees its slot at once (the next request runs, the
tokens stop); a full queue's 503 says Retry-After.  Every wait is a bounded poll of /health,
never a blind sleep."""
import json
import socket
import threading
import time

import requests

from conftest import TIMEOUT, Server, sse_events
from smtest import generate_cli

LONG = [450, 12]  # greedy on the tiny model: about 1,300 tokens before its eos (seconds here)


def raw_completion(server, body):
    """A socket that sent a whole POST /v1/completions and reads nothing yet."""
    sk = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
    data = json.dumps(body).encode()
    sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(data) + data)
    return sk


def wait_health(server, pred, seconds=10):
    """/health once pred holds of it (polled), else the last one seen."""
    t_end = time.monotonic() + seconds
    h = server.health()
    while not pred(h) and time.monotonic() < t_end:
        time.sleep(0.02)
        h = server.health()
    return h


def test_dead_queued_clients_leave_the_queue(tmp, ids_dir):
    """One slot, a queue of 2: one request runs, two queued clients hang up; their places are
    free at once, so a live client is queued (not a 503) and served once the slot frees."""
    s = Server(ids_dir, tmp, "--max-requests", "1", "--queue", "2")
    try:
        long = {"model": s.name, "prompt": LONG, "max_tokens": 4000, "temperature": 0, "stream": True}
        a = requests.post(s.url + "/v1/completions", json=long, stream=True, timeout=TIMEOUT)
        events = sse_events(a)  # kept: a dropped generator may close the response
        assert isinstance(next(events), dict)
        dead = [raw_completion(s, {"model": s.name, "prompt": [11, 12], "max_tokens": 8}) for _ in range(2)]
        h = wait_health(s, lambda h: h["queued"] == 2)
        assert h["running"] == 1 and h["queued"] == 2, h
        # the queue is full now: one more is a 503 that says when to retry
        r = requests.post(s.url + "/v1/completions", json={"prompt": [1], "max_tokens": 1}, timeout=TIMEOUT)
        assert r.status_code == 503 and r.headers.get("Retry-After") == "1", (r.status_code, r.headers)
        assert "busy" in r.json()["error"]["message"]
        for sk in dead:
            sk.close()
        h = wait_health(s, lambda h: h["queued"] == 0, 5)
        assert h["queued"] == 0 and h["running"] == 1, h  # freed while the first one still runs
        got = {}
        prompt, n = [100, 200, 300, 100], 9

        def live():
            got["r"] = requests.post(s.url + "/v1/completions", timeout=TIMEOUT,
                                     json={"model": s.name, "prompt": prompt, "max_tokens": n, "temperature": 0})

        t = threading.Thread(target=live)
        t.start()
        h = wait_health(s, lambda h: h["queued"] == 1 or "r" in got)
        assert "r" not in got, (got["r"].status_code, got["r"].text)  # queued, not refused
        assert h["queued"] == 1, h
        a.close()  # the running one leaves: the live client gets the slot
        t.join(TIMEOUT)
        r = got["r"]
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["token_ids"] == generate_cli(ids_dir, prompt, n)
        assert wait_health(s, lambda h: h["running"] == 0 and h["queued"] == 0, 5)["running"] == 0
    finally:
        assert s.stop() == 0, s.read_log()


def test_plain_disconnect_frees_the_slot(tmp, ids_dir):
    """A non-streaming client of a long request hangs up: its slot is free at once (within a
    second, while its own end is seconds away), no token is made for it after, and the next
    request runs."""
    s = Server(ids_dir, tmp, "--max-requests", "1", "--queue", "1")
    try:
        sk = raw_completion(s, {"model": s.name, "prompt": LONG, "max_tokens": 4000, "temperature": 0})
        h = wait_health(s, lambda h: h["running"] == 1 and h["tokens"] > 0)
        assert h["running"] == 1, h
        sk.close()
        h = wait_health(s, lambda h: h["running"] == 0, 1)  # its natural end is seconds away
        assert h["running"] == 0, h
        t0 = h["tokens"]
        # no more tokens for it: the next /health agrees, and a new request runs at once
        assert s.health()["tokens"] == t0
        prompt, n = [42, 43], 6
        r = requests.post(s.url + "/v1/completions", timeout=TIMEOUT,
                          json={"model": s.name, "prompt": prompt, "max_tokens": n, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == generate_cli(ids_dir, prompt, n)
        assert s.health()["tokens"] == t0 + n
        assert "client disconnected" in s.read_log()
    finally:
        assert s.stop() == 0, s.read_log()
