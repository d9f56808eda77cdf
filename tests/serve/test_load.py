"""test_load.py: `sparkmono serve` under slow, idle and many clients (tests/cli_serve_load.sh
runs it; loopback only, every count and wait bounded).

- 1,000 slow connections (a request line and headers announcing a 100 kB body, 1 byte of it,
  then nothing) held open: /health, a completion and a stream are each answered within a
  second, equal to the same request alone; the slow ones get nothing before the request
  timeout and a 408 right after it; then the connections are gone, the server has as many
  threads as before and its memory does not grow from one round of 1,000 to the next.
- past --max-connections a completion is a 503 with Retry-After and /health is answered; 64
  more are taken in, the next waits in the kernel's queue until one closes;
  an idle connection (new or kept alive) is closed after --idle-timeout; a body trickled a
  byte at a time still ends at the request timeout; a stream parked in the queue longer than
  every timeout is not cut.
- a soak: 16 clients for SM_SOAK_S seconds (default 60; tests/cli_serve_load.sh sets it), a
  quarter of them hanging up mid-stream, the others plain or streaming, greedy or seeded:
  every finished answer equals the same request alone, nothing is refused, the thread count
  stays put and the memory stays flat.
The measured numbers are printed (pytest -s) as indented lines."""
import json
import os
import resource
import select
import socket
import subprocess
import threading
import time

import pytest
import requests

from conftest import TIMEOUT, Server, sse_events
from smtest import SM_BIN

SLOW = 1000             # slow connections held at once
REQUEST_TIMEOUT = 4     # --request-timeout of the servers here (s): short, so the waits are
IDLE_TIMEOUT = 2        # --idle-timeout (s)
SLOW_HEAD = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             b"Content-Length: 100000\r\n\r\n{")
GREEDY = {"prompt": [5, 6, 7, 8, 5, 6], "max_tokens": 16, "temperature": 0}


def note(line):
    print("  " + line, flush=True)


def proc_status(pid):
    """(threads, RSS in KiB) of a process, from /proc/PID/status."""
    f = dict(l.split(":", 1) for l in open("/proc/%d/status" % pid).read().splitlines() if ":" in l)
    return int(f["Threads"]), int(f["VmRSS"].split()[0])


def sanitized(pid):
    """The server runs under AddressSanitizer or ThreadSanitizer (`make test-asan`): it is
    slower, and its quarantine keeps freed memory, so RSS says nothing about leaks (its leak
    check at exit does, failing the server's exit status)."""
    return any(("libasan" in l or "libtsan" in l) for l in open("/proc/%d/maps" % pid))


def raise_open_files(n):
    """Let this process hold n more sockets (the hard limit allowing)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n + 256
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.fail("the open-file hard limit is %d; this test holds %d sockets (ulimit -Hn)" % (hard, want))
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def timed(fn):
    t = time.monotonic()
    r = fn()
    return r, time.monotonic() - t


def complete(s, body):
    return requests.post(s.url + "/v1/completions", json=body, timeout=TIMEOUT)


def stream(s, body):
    """(ids, events) of a streamed completion."""
    with requests.post(s.url + "/v1/completions", json=dict(body, stream=True), stream=True, timeout=TIMEOUT) as r:
        assert r.status_code == 200, r.text
        ev = list(sse_events(r))
    assert ev[-1] == "[DONE]", ev[-3:]
    return sum((e["choices"][0]["token_ids"] for e in ev[:-1]), []), ev


def open_slow(port, n):
    socks = []
    for _ in range(n):
        k = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        k.sendall(SLOW_HEAD)
        socks.append(k)
    return socks


def readable(socks):
    """The sockets with something to read (data or an end) now."""
    out = []
    for i in range(0, len(socks), 500):  # select's own limit is 1024 descriptors: poll instead
        p = select.poll()
        for k in socks[i:i + 500]:
            p.register(k, select.POLLIN | select.POLLHUP | select.POLLERR)
        out += [fd for fd, _ in p.poll(0)]
    return out


def read_all(k, seconds):
    """Everything k receives until the server closes it (at most seconds)."""
    k.settimeout(seconds)
    data = b""
    try:
        while True:
            b = k.recv(65536)
            if not b:
                return data, True
            data += b
    except (socket.timeout, ConnectionResetError):
        return data, False


@pytest.fixture(scope="module")
def load_server(tmp, model_dir):
    raise_open_files(SLOW + 64)
    s = Server(model_dir, tmp, "--max-requests", "4", "--queue", "4", "--request-timeout", str(REQUEST_TIMEOUT),
               "--idle-timeout", str(IDLE_TIMEOUT), "--quiet")
    yield s
    assert s.stop() == 0, s.read_log()[-2000:]


def wait_connections(s, n, seconds=5):
    """True once the server has at most n open connections (the health check's own included)."""
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        if s.health()["connections"] <= n:
            return True
        time.sleep(0.05)
    return False


def slow_round(s, ref_ids):
    """One round of SLOW slow connections; returns the numbers of note."""
    t0 = time.monotonic()
    socks = open_slow(s.port, SLOW)
    t_open = time.monotonic() - t0
    try:
        t_end = time.monotonic() + 5  # connected is not yet accepted: wait until the server has them all
        while s.health()["connections"] <= SLOW and time.monotonic() < t_end:
            time.sleep(0.02)
        h, t_health = timed(lambda: requests.get(s.url + "/health", timeout=TIMEOUT))
        assert h.status_code == 200 and h.json()["connections"] >= SLOW, h.text
        r, t_compl = timed(lambda: complete(s, GREEDY))
        assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == ref_ids, r.text
        (ids, _), t_stream = timed(lambda: stream(s, GREEDY))
        assert ids == ref_ids
        threads_held, rss_held = proc_status(s.proc.pid)
        assert max(t_health, t_compl, t_stream) < (3.0 if sanitized(s.proc.pid) else 1.0), (t_health, t_compl, t_stream)
        # nothing for the slow ones before the request timeout
        time.sleep(max(0.0, t0 + REQUEST_TIMEOUT - 1.0 - time.monotonic()))
        early = readable(socks)
        assert not early, "%d slow connections answered or closed before the request timeout" % len(early)
        # a 408, then the end, for each one right after it
        time.sleep(max(0.0, t0 + REQUEST_TIMEOUT + 0.5 - time.monotonic()))
        got408 = 0
        for k in socks:
            data, closed = read_all(k, 3)
            got408 += data.startswith(b"HTTP/1.1 408 ") and closed
        t_cut = time.monotonic() - t0
        assert got408 == SLOW, "%d of %d slow connections got a 408 and were closed" % (got408, SLOW)
    finally:
        for k in socks:
            k.close()
    assert wait_connections(s, 1), s.health()
    return dict(open=t_open, health=t_health, compl=t_compl, stream=t_stream, cut=t_cut, threads_held=threads_held,
                rss_held=rss_held)


def test_slow_connections_held_then_cut(load_server):
    s = load_server
    ref = complete(s, GREEDY).json()["choices"][0]["token_ids"]  # alone; also warms the server up
    stream(s, GREEDY)
    threads0, rss0 = proc_status(s.proc.pid)
    rounds = []
    for i in range(2):
        m = slow_round(s, ref)
        m["threads"], m["rss"] = proc_status(s.proc.pid)
        rounds.append(m)
        note("round %d: %d slow connections opened in %.2f s; held: /health %.0f ms, completion %.0f ms, stream "
             "%.0f ms; all %d answered 408 and closed by %.1f s (request timeout %d s); threads %d before, %d held, "
             "%d after; RSS %.1f MiB before, %.1f held, %.1f after"
             % (i + 1, SLOW, m["open"], 1e3 * m["health"], 1e3 * m["compl"], 1e3 * m["stream"], SLOW, m["cut"],
                REQUEST_TIMEOUT, threads0, m["threads_held"], m["threads"], rss0 / 1024, m["rss_held"] / 1024,
                m["rss"] / 1024))
    # no thread per connection, none left behind; memory back where the first round left it
    assert all(m["threads_held"] == threads0 and m["threads"] == threads0 for m in rounds), (threads0, rounds)
    if sanitized(s.proc.pid):
        note("a sanitizer build: RSS not compared (its leak check runs at exit)")
        return
    assert rounds[1]["rss"] <= rounds[0]["rss"] + 1024, (rounds[0]["rss"], rounds[1]["rss"])
    assert rounds[0]["rss_held"] - rss0 < 64 * 1024  # 1,000 slow clients cost under 64 MiB


def hold_all(s, n, seconds=20):
    """n slow connections, every one held by a server of --max-connections n.  The server's
    polling threads may take a health check's connection before a slow one that connected
    earlier: that slow one is then past the limit, answered 503 and closed, and is opened
    again.  Held: none answered and the server counting n + the health check's own, twice."""
    held, stable = open_slow(s.port, n), 0
    t_end = time.monotonic() + seconds
    while stable < 2:
        assert time.monotonic() < t_end, ("the server never held %d slow connections" % n, s.health())
        time.sleep(0.05)
        count = s.health()["connections"]
        answered = [k for k in held if k.fileno() in readable(held)]
        for k in answered:
            k.close()
            held.remove(k)
        held += open_slow(s.port, n - len(held))
        stable = stable + 1 if not answered and count >= n + 1 else 0
    return held


def test_over_connection_limit(tmp, model_dir):
    """--max-connections 8: the 9th connection's completion is a 503 with Retry-After (and
    the connection closes); /health is still answered; with the 8 gone, completions run."""
    s = Server(model_dir, tmp, "--max-connections", "8", "--idle-timeout", "1", "--request-timeout", "60", "--quiet")
    held = []
    try:
        held = hold_all(s, 8)
        r = complete(s, GREEDY)
        assert r.status_code == 503 and r.headers.get("Retry-After") == "1", (r.status_code, r.headers)
        assert r.headers.get("Connection", "").lower() == "close"
        assert r.json()["error"]["code"] == "too_many_connections"
        h = requests.get(s.url + "/health", timeout=TIMEOUT)
        assert h.status_code == 200 and h.json()["status"] == "ok"
        for k in held:
            k.close()
        held = []
        assert wait_connections(s, 1), s.health()
        assert complete(s, GREEDY).status_code == 200
    finally:
        for k in held:
            k.close()
        assert s.stop() == 0, s.read_log()[-2000:]


def test_past_spare_connections_wait(tmp, model_dir):
    """--max-connections 8: 64 connections past it are still taken in (SM_HTTP_SPARE_CONNECTIONS);
    the next one waits in the kernel's accept queue, unanswered, until one of them closes, then
    is served like any past the limit (/health answered, Connection: close)."""
    s = Server(model_dir, tmp, "--max-connections", "8", "--idle-timeout", "60", "--request-timeout", "60", "--quiet")
    taken = 8 + 64
    held = []
    try:
        held = [socket.create_connection(("127.0.0.1", s.port), timeout=TIMEOUT) for _ in range(taken - 1)]
        t_end = time.monotonic() + 10
        while s.health()["connections"] < taken:  # every silent one, and the health check's own
            assert time.monotonic() < t_end, s.health()
            time.sleep(0.05)
        # the last one taken in, once the health check's connection is gone (the queue is in order)
        held.append(socket.create_connection(("127.0.0.1", s.port), timeout=TIMEOUT))
        k = socket.create_connection(("127.0.0.1", s.port), timeout=TIMEOUT)
        held.append(k)
        k.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert not readable([k]) and not select.select([k], [], [], 0.5)[0], "answered past the spare connections"
        held.pop(0).close()
        data, closed = read_all(k, 5)
        assert data.startswith(b"HTTP/1.1 200 ") and b"\r\nConnection: close\r\n" in data and closed, data[:300]
    finally:
        for k in held:
            k.close()
        assert s.stop() == 0, s.read_log()[-2000:]


def test_queue_full_retry_after(tmp, model_dir):
    """A full queue is a 503 that says when to retry; /health answers meanwhile."""
    s = Server(model_dir, tmp, "--max-requests", "1", "--queue", "0", "--quiet")
    try:
        with requests.post(s.url + "/v1/completions", json=dict(GREEDY, max_tokens=4000, stream=True), stream=True,
                           timeout=TIMEOUT) as a:
            ev = sse_events(a)  # held: dropping the generator would close the stream
            next(ev)
            r = complete(s, GREEDY)
            assert r.status_code == 503 and r.headers.get("Retry-After") == "1", (r.status_code, r.headers)
            assert r.json()["error"]["code"] == "overloaded"
            h = requests.get(s.url + "/health", timeout=TIMEOUT)
            assert h.status_code == 200 and h.json()["running"] == 1
    finally:
        assert s.stop() == 0, s.read_log()[-2000:]


def test_idle_connections_closed(load_server):
    """A connection that sends nothing, one that sends part of a first line (no request line
    yet), and one kept alive after an answer, are closed after --idle-timeout without a byte
    written; a keep-alive connection in use is not."""
    s = load_server
    silent = socket.create_connection(("127.0.0.1", s.port), timeout=TIMEOUT)
    partial = socket.create_connection(("127.0.0.1", s.port), timeout=TIMEOUT)
    partial.sendall(b"HEL")
    kept = socket.create_connection(("127.0.0.1", s.port), timeout=TIMEOUT)
    kept.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    head = b""
    while b"}" not in head:  # the whole answer: headers and a JSON body
        head += kept.recv(4096)
    assert head.startswith(b"HTTP/1.1 200 ")
    t0 = time.monotonic()
    time.sleep(IDLE_TIMEOUT - 1.0)
    assert not readable([silent, partial, kept])  # not before the idle timeout
    for k in (silent, partial, kept):
        data, closed = read_all(k, IDLE_TIMEOUT + 2)
        assert data == b"" and closed and time.monotonic() - t0 < IDLE_TIMEOUT + 1.5, (data, closed)
        k.close()
    # in use: a request every half idle timeout for 2 idle timeouts, on one connection
    busy = requests.Session()
    for _ in range(4):
        assert busy.get(s.url + "/health", timeout=TIMEOUT).status_code == 200
        time.sleep(IDLE_TIMEOUT / 2)
    busy.close()


def test_trickled_body_cut_at_deadline(load_server):
    """A body sent a byte every 0.25 s never goes idle, yet ends with a 408 at the request
    timeout: the deadline counts from the request line, not from the last byte."""
    s = load_server
    k = socket.create_connection(("127.0.0.1", s.port), timeout=TIMEOUT)
    t0 = time.monotonic()
    k.sendall(SLOW_HEAD)
    data = b""
    while time.monotonic() - t0 < REQUEST_TIMEOUT + 3:
        try:
            k.sendall(b" ")
        except OSError:
            break
        r, _, _ = select.select([k], [], [], 0.25)
        if r:
            data, _ = read_all(k, 1)
            break
    t = time.monotonic() - t0
    k.close()
    assert data.startswith(b"HTTP/1.1 408 ") and b"request_timeout" in data, data[:200]
    assert REQUEST_TIMEOUT - 0.2 < t < REQUEST_TIMEOUT + 1.0, t


@pytest.fixture(scope="module")
def cycle_dir(tmp):
    """The demo's cycle model: greedy output walks 16 ids round and round, never an eos, so a
    request of 4000 tokens holds its engine slot for as long as the test needs."""
    d = os.path.join(tmp, "cycle")
    subprocess.run([SM_BIN, "make-model", "--quiet", "--preset", "tiny", "--cycle", "16", "--seed", "1", "--out", d],
                   check=True, capture_output=True)
    return d


def test_parked_stream_outlives_timeouts(tmp, cycle_dir):
    """--request-timeout 1 --idle-timeout 1, one request at a time: a stream and a plain
    completion wait in the queue for 3 s without a byte, then run to the end, equal to alone."""
    s = Server(cycle_dir, tmp, "--no-spec", "--max-requests", "1", "--queue", "2", "--request-timeout", "1",
               "--idle-timeout", "1", "--quiet")
    try:
        ref = complete(s, GREEDY).json()["choices"][0]["token_ids"]
        got = {}

        def waiting_stream():
            got["stream"] = stream(s, GREEDY)[0]

        def waiting_plain():
            got["plain"] = complete(s, GREEDY).json()["choices"][0]["token_ids"]

        th = [threading.Thread(target=f) for f in (waiting_stream, waiting_plain)]
        with requests.post(s.url + "/v1/completions", json=dict(GREEDY, max_tokens=4000, stream=True), stream=True,
                           timeout=TIMEOUT) as a:
            ev = sse_events(a)  # held: dropping the generator would close the stream
            next(ev)
            for t in th:
                t.start()
            t_end = time.monotonic() + 5
            while s.health()["queued"] < 2 and time.monotonic() < t_end:
                time.sleep(0.02)
            assert s.health()["queued"] == 2
            time.sleep(3)
            assert s.health()["running"] == 1  # the blocker still runs: the two waited all along
        for t in th:
            t.join(TIMEOUT)
        assert got == {"stream": ref, "plain": ref}
    finally:
        assert s.stop() == 0, s.read_log()[-2000:]


# ---- soak

SOAK_REQUESTS = [
    {"prompt": [5, 6, 7, 8, 5, 6], "max_tokens": 24, "temperature": 0},
    {"prompt": [11, 12, 13], "max_tokens": 12, "temperature": 0},
    {"prompt": [100, 200, 300, 400, 100, 200], "max_tokens": 32, "temperature": 0},
    {"prompt": [42], "max_tokens": 8, "temperature": 0},
    {"prompt": [7, 7, 7, 7, 7, 7, 7], "max_tokens": 20, "temperature": 0.9, "top_p": 0.95, "seed": 11},
    {"prompt": [300, 301, 302, 303, 304], "max_tokens": 16, "temperature": 0.7, "top_k": 40, "seed": 12},
    {"prompt": "the quick brown fox", "max_tokens": 24, "temperature": 0},
    {"prompt": "café 東京 🙂", "max_tokens": 16, "temperature": 1.0, "seed": 13},
]


def test_soak(tmp, model_dir):
    seconds = float(os.environ.get("SM_SOAK_S", "60"))
    s = Server(model_dir, tmp, "--max-requests", "4", "--queue", "16", "--quiet")
    try:
        refs = [complete(s, b).json()["choices"][0] for b in SOAK_REQUESTS]  # each alone
        refs = [(c["token_ids"], c["text"]) for c in refs]
        threads0, rss0 = proc_status(s.proc.pid)
        stop = time.monotonic() + seconds
        counts = {"plain": 0, "stream": 0, "hung_up": 0}
        errors = []
        lock = threading.Lock()

        def client(c):
            sess = requests.Session()  # keep-alive, as clients do
            n = c
            while time.monotonic() < stop and not errors:
                i = n % len(SOAK_REQUESTS)
                body = SOAK_REQUESTS[i]
                n += 1
                try:
                    if c % 4 == 3:  # a quarter of the clients hang up mid-stream (closing the stream unread)
                        with sess.post(s.url + "/v1/completions", json=dict(body, stream=True), stream=True,
                                       timeout=TIMEOUT) as r:
                            assert r.status_code == 200, r.text
                            ev = sse_events(r)
                            for _ in range(1 + n % 3):  # a loaded server may send the ids in fewer chunks
                                if next(ev, None) is None:
                                    break
                        kind = "hung_up"
                    elif c % 2:
                        got = stream(s, body)
                        ids = got[0]
                        text = "".join(e["choices"][0]["text"] for e in got[1][:-1])
                        assert (ids, text) == refs[i], (i, ids, refs[i][0])
                        kind = "stream"
                    else:
                        r = sess.post(s.url + "/v1/completions", json=body, timeout=TIMEOUT)
                        assert r.status_code == 200, r.text
                        ch = r.json()["choices"][0]
                        assert (ch["token_ids"], ch["text"]) == refs[i], (i, ch["token_ids"], refs[i][0])
                        kind = "plain"
                    with lock:
                        counts[kind] += 1
                except Exception as e:  # reported with the others
                    with lock:
                        errors.append("client %d request %d: %r" % (c, i, e))
            sess.close()

        th = [threading.Thread(target=client, args=(c,)) for c in range(16)]
        for t in th:
            t.start()
        samples = []  # (seconds, threads, RSS KiB)
        t0 = time.monotonic()
        while any(t.is_alive() for t in th):
            samples.append((time.monotonic() - t0,) + proc_status(s.proc.pid))
            time.sleep(0.5)
        for t in th:
            t.join()
        assert not errors, errors[:5]
        assert s.wait_idle(10), s.health()
        threads1, rss1 = proc_status(s.proc.pid)
        # flat: the last third's peak within 2 MiB of the peak after the first third (warm-up)
        third = max(1, len(samples) // 3)
        early = max(r for _, _, r in samples[third:2 * third])
        late = max(r for _, _, r in samples[2 * third:])
        note("soak %.0f s, 16 clients: %d plain and %d streamed answers equal to alone, %d hung up mid-stream; "
             "threads %d before, %d..%d during, %d after; RSS %.1f MiB before, middle third peak %.1f, last third "
             "peak %.1f, after %.1f"
             % (seconds, counts["plain"], counts["stream"], counts["hung_up"], threads0,
                min(x for _, x, _ in samples), max(x for _, x, _ in samples), threads1, rss0 / 1024, early / 1024,
                late / 1024, rss1 / 1024))
        assert counts["plain"] > 0 and counts["stream"] > 0 and counts["hung_up"] > 0, counts
        assert threads1 == threads0 and all(x == threads0 for _, x, _ in samples), (threads0, samples[:5])
        if sanitized(s.proc.pid):
            note("a sanitizer build: RSS not compared (its leak check runs at exit)")
        else:
            assert late <= early + 2048, (early, late)
        h = s.health()
        assert h["running"] == 0 and h["queued"] == 0, h
    finally:
        assert s.stop() == 0, s.read_log()[-2000:]
