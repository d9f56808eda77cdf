"""serve_cuda.py BUILD_DIR: `sparkmono serve --backend cuda` on the GPU machine, driven with the
standard library only (the machine has no virtual environment): on a cycle model (drafts are
accepted, greedy ids are far from ties), greedy completions with logprobs (made on the GPU)
equal the CPU server's ids, and their logprobs agree within 1e-2 (GPU vs CPU logits,
docs/model.md section 10); each id's logprob is its position's most likely one; echo with
logprobs (scoring a prompt) agrees with the CPU server's; a seeded n = 2
request is reproducible and its choice 0 equals the same request with n = 1; a chat request
with logprobs gives the completion's numbers.  Prints one PASS / FAIL line a check and
"N passed, N failed".  Run by tools/gpu_run.sh."""
import json
import os
import subprocess
import sys
import tempfile
import urllib.request

B = sys.argv[1] if len(sys.argv) > 1 else "build"
SM = os.path.join(B, "sparkmono")
npass = nfail = 0


def check(name, ok, why=""):
    global npass, nfail
    print(("PASS " if ok else "FAIL ") + "serve_cuda " + name + ("" if ok else ": " + why))
    npass, nfail = npass + ok, nfail + (not ok)


def start(model, backend):
    p = subprocess.Popen([SM, "serve", model, "--backend", backend, "--port", "0", "--threads", "4"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in p.stdout:
        if "listening on" in line:
            url = line.split("listening on ")[1].split()[0]
            return p, url
    raise RuntimeError("serve (%s) did not start" % backend)


def post(url, path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


with tempfile.TemporaryDirectory() as tmp:
    model = os.path.join(tmp, "cycle")
    subprocess.run([SM, "make-model", "--quiet", "--preset", "tiny", "--cycle", "16", "--seed", "3", "--out", model],
                   check=True)
    gpu, gurl = start(model, "cuda")
    cpu, curl = start(model, "cpu")
    try:
        prompt = [5, 6, 7, 8, 9] * 4
        body = {"model": "cycle", "prompt": prompt, "max_tokens": 40, "temperature": 0, "logprobs": 5}
        g, c = post(gurl, "/completions", body), post(curl, "/completions", body)
        gl, cl = g["choices"][0]["logprobs"], c["choices"][0]["logprobs"]
        check("greedy ids == cpu", g["choices"][0]["token_ids"] == c["choices"][0]["token_ids"],
              "%s vs %s" % (g["choices"][0]["token_ids"], c["choices"][0]["token_ids"]))
        worst = max(abs(a - b) for a, b in zip(gl["token_logprobs"], cl["token_logprobs"]))
        check("greedy logprobs ~ cpu (worst %.2g)" % worst, worst <= 1e-2, "worst %.3g" % worst)
        top_ok = all(abs(max(t.values()) - lp) == 0 for t, lp in zip(gl["top_logprobs"], gl["token_logprobs"]))
        check("each greedy id is its position's most likely", top_ok)
        sb = {"model": "cycle", "prompt": prompt, "max_tokens": 24, "temperature": 0.9, "seed": 11, "n": 2,
              "logprobs": 2}
        a, b = post(gurl, "/completions", sb), post(gurl, "/completions", sb)
        one = post(gurl, "/completions", dict(sb, n=1))
        ids = lambda r: [ch["token_ids"] for ch in r["choices"]]
        check("seeded n = 2 reproducible", ids(a) == ids(b))
        check("choice 0 == n = 1", ids(a)[0] == ids(one)[0])
        eb = {"model": "cycle", "prompt": prompt, "max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": True}
        ge, ce = post(gurl, "/completions", eb)["choices"][0]["logprobs"], post(curl, "/completions", eb)["choices"][0]["logprobs"]
        ew = max(abs(a - b) for a, b in zip(ge["token_logprobs"][1:], ce["token_logprobs"][1:]))
        check("echo logprobs (prompt scoring) ~ cpu (worst %.2g)" % ew,
              ge["token_logprobs"][0] is None and len(ge["token_logprobs"]) == len(prompt) + 1 and ew <= 1e-2,
              "worst %.3g, %s" % (ew, ge["token_logprobs"][:3]))
        chat = post(gurl, "/chat/completions", {"model": "cycle", "messages": [{"role": "user", "content": "hi"}],
                                                "max_tokens": 8, "temperature": 0, "logprobs": True, "top_logprobs": 2})
        content = chat["choices"][0]["logprobs"]["content"]
        check("chat logprobs", len(content) >= 1 and all(x["logprob"] <= 0 for x in content), json.dumps(chat)[:300])
    except Exception as ex:  # a server that failed: one line, counted
        check("requests", False, repr(ex))
    finally:
        for p in (gpu, cpu):
            p.terminate()
            p.wait(timeout=60)
print("%d passed, %d failed" % (npass, nfail))
sys.exit(1 if nfail else 0)
