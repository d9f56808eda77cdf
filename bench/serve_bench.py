#!/usr/bin/env python3
"""serve_bench.py: the tokens/s `sparkmono serve` delivers to N concurrent streaming clients,
beside the engine running the same requests without HTTP, in one run.

    python3 bench/serve_bench.py [--sm build/sparkmono] [--model DIR] [--clients 64]
                                 [--max-tokens 32] [--request-rows 8] [--threads 0] [--repeat 3]

References, on the same requests (greedy, so every mode must emit the same ids; checked):
  batch       `sparkmono generate --batch FILE.jsonl --max-requests N` (continuous batching in
              the CLI), when this build has --batch; its own tokens/s line
  sequential  otherwise `sparkmono generate` once per request (no batching at all), the sum of
              the times it reports
  binding     the Python binding's generate_many (the engine's continuous batching without HTTP),
              when build/libsparkmono.so and python/ are there
The server: `sparkmono serve --max-requests N --queue N --quiet`, one warm-up request, then N
client threads each stream one completion (raw HTTP/1.1 over a socket: the clients must cost
the machine as little as possible, since they share its cores with the server); tokens/s =
all completion tokens / (first request sent .. last [DONE] read).  The modes alternate in each
of --repeat rounds and the median tokens/s of each is reported.  Without --model a tiny
model is made (`make-model --preset tiny --seed 1`) in a temporary folder.  Prints a markdown
table and the ratio server / reference.  We rejected the `openai` client for the load: its
per-chunk parsing would use a core the server needs on a small machine."""
import argparse
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def make_requests(n, max_tokens, vocab, seed=5):
    rng = random.Random(seed)
    return [([rng.randrange(3, vocab) for _ in range(rng.randint(4, 16))], max_tokens) for _ in range(n)]


def stream_one(port, body, out, i, t_done):
    """POST one streaming completion; out[i] = its ids, t_done[i] = when [DONE] arrived."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
              b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
    buf = bytearray()
    while True:
        b = s.recv(1 << 16)
        if not b:
            break
        buf += b
    t_done[i] = time.monotonic()
    s.close()
    ids = []
    for m in re.finditer(rb'"token_ids":\[([0-9,]*)\]', bytes(buf)):
        if m.group(1):
            ids += [int(x) for x in m.group(1).split(b",")]
    if b"data: [DONE]" not in buf:
        raise RuntimeError("stream %d did not end with [DONE]: %r" % (i, bytes(buf[-300:])))
    out[i] = ids


def run_server(sm, model, reqs, rows, threads):
    n = len(reqs)
    cmd = [sm, "serve", model, "--port", "0", "--max-requests", str(n), "--queue", str(n), "--quiet",
           "--request-rows", str(rows), "--max-len", str(max(len(p) + m for p, m in reqs))]
    if threads:
        cmd += ["--threads", str(threads)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        port = int(re.search(r":(\d+)/v1", p.stdout.readline()).group(1))
        warm = [None]
        stream_one(port, {"prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0, "stream": True}, warm, 0, [0])
        out, t_done = [None] * n, [0.0] * n
        th = [threading.Thread(target=stream_one, args=(port, {"prompt": pr, "max_tokens": mt, "temperature": 0,
                                                                "stream": True}, out, i, t_done))
              for i, (pr, mt) in enumerate(reqs)]
        t0 = time.monotonic()
        for t in th:
            t.start()
        for t in th:
            t.join()
        if any(o is None for o in out):
            raise RuntimeError("a client failed")
        return out, max(t_done) - t0
    finally:
        p.terminate()
        p.wait(30)


def has_batch(sm):
    return "--batch" in subprocess.run([sm, "generate", "--help"], capture_output=True, text=True).stdout


def run_batch(sm, model, reqs, rows, threads, tmp):
    path = os.path.join(tmp, "reqs.jsonl")
    with open(path, "w") as f:
        for pr, mt in reqs:
            f.write(json.dumps({"ids": pr, "max_tokens": mt}) + "\n")
    cmd = [sm, "generate", "--model", model, "--batch", path, "--max-requests", str(len(reqs)), "--request-rows",
           str(rows)]
    if threads:
        cmd += ["--threads", str(threads)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    m = re.search(r"(\d+) tokens in ([0-9.]+) s", r.stderr)
    outs = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
    ids = [o.get("ids") or o.get("token_ids") or o.get("output") for o in outs]
    return ids, float(m.group(2))


def run_sequential(sm, model, reqs, rows, threads):
    ids, total = [], 0.0
    for pr, mt in reqs:
        cmd = [sm, "generate", "--model", model, "--prompt-ids", ",".join(map(str, pr)), "--max-tokens", str(mt),
               "--request-rows", str(rows)]
        if threads:
            cmd += ["--threads", str(threads)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        ids.append([int(x) for x in re.search(r"^ids: (.*)$", out, re.M).group(1).split(",")])
        total += float(re.search(r"tokens in ([0-9.]+) s", out).group(1))
    return ids, total


def run_binding(model, reqs, rows, threads):
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import sparkmono

    with sparkmono.Model(model) as m, sparkmono.Engine(m, request_rows=rows, max_requests=len(reqs),
                                                       max_len=max(len(p) + n for p, n in reqs), threads=threads or None) as e:
        e.generate([5, 6, 7], max_tokens=4)
        t0 = time.monotonic()
        outs = [None] * len(reqs)
        # one max_tokens for all in this bench; generate_many takes one
        res = e.generate_many([p for p, _ in reqs], max_tokens=reqs[0][1])
        dt = time.monotonic() - t0
        for i, c in enumerate(res):
            outs[i] = c.ids
    return outs, dt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sm", default=os.path.join(ROOT, "build", "sparkmono"))
    ap.add_argument("--model", help="model directory (default: a tiny model made here)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--request-rows", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3, help="rounds; the modes alternate within a round")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="serve_bench")
    model = a.model
    if not model:
        model = os.path.join(tmp, "tiny")
        subprocess.run([a.sm, "make-model", "--quiet", "--preset", "tiny", "--experts", "mxfp4", "--seed", "1",
                        "--out", model], check=True)
    vocab = json.load(open(os.path.join(model, "config.json")))["text_config"]["vocab_size"]
    reqs = make_requests(a.clients, a.max_tokens, vocab)
    modes = [("serve, %d streaming clients" % a.clients,
              lambda: run_server(a.sm, model, reqs, a.request_rows, a.threads))]
    if has_batch(a.sm):
        modes.append(("generate --batch --max-requests %d" % a.clients,
                      lambda: run_batch(a.sm, model, reqs, a.request_rows, a.threads, tmp)))
    else:
        modes.append(("generate, one request at a time (this build has no --batch)",
                      lambda: run_sequential(a.sm, model, reqs, a.request_rows, a.threads)))
    lib = os.environ.get("SPARKMONO_LIB") or os.path.join(os.path.dirname(a.sm), "libsparkmono.so")
    if os.path.isfile(lib):
        os.environ["SPARKMONO_LIB"] = os.path.abspath(lib)
        modes.append(("engine via the Python binding, generate_many (no HTTP)",
                      lambda: run_binding(model, reqs, a.request_rows, a.threads)))
    tps = [[] for _ in modes]
    ids = [None] * len(modes)
    for _ in range(a.repeat):  # alternate, so a noisy neighbour hits every mode alike
        for k, (_, run) in enumerate(modes):
            out, dt = run()
            ids[k] = out
            tps[k].append(sum(len(x) for x in out) / dt)
    ntok = sum(len(x) for x in ids[0])
    print("%d requests of %d tokens at most (%d generated), R = %d, threads %s, %d rounds\n" % (
        a.clients, a.max_tokens, ntok, a.request_rows, a.threads or "all", a.repeat))
    print("| mode | median tokens/s | min | max | same ids as serve |")
    print("|---|---|---|---|---|")
    med = []
    for k, (name, _) in enumerate(modes):
        v = sorted(tps[k])
        med.append(v[len(v) // 2])
        print("| %s | %.1f | %.1f | %.1f | %s |" % (name, med[-1], v[0], v[-1], "yes" if ids[k] == ids[0] else "NO"))
    print("\nserve / %s: %.1f%%" % (modes[1][0].split(" --")[0].split(",")[0], 100.0 * med[0] / med[1]) +
          ("; serve / binding: %.1f%%" % (100.0 * med[0] / med[2]) if len(modes) > 2 else ""))
    return 0 if all(x == ids[0] for x in ids) else 1


if __name__ == "__main__":
    sys.exit(main())
