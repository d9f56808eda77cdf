"""test_cuda.py: the binding on the CUDA backend.  It needs a library built with the CUDA
backend and a GPU: SPARKMONO_CUDA_LIB names the library (`make B=build-cuda CUDA=1 shared`
builds build-cuda/libsparkmono.so); without it, or without a GPU, every test here is a SKIP
(tests/cli_python.sh counts them).  Each test runs the binding in a child process loaded with
that library (this process has the CPU one).  Checked: greedy generation on the GPU is the same
alone, twice and batched (batch invariance); prefill logits agree with the CPU engine's; the
monokernel ("auto") gives the stock path's ids; W4A4 (test_cuda_w4a4); two virtual ranks on one GPU (world = 2,
devices [0, 0]) run, greedy and batch-invariant; a bad device is the engine's line."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import sparkmono

CUDA_LIB = os.environ.get("SPARKMONO_CUDA_LIB", "")


def _gpu_present():
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


pytestmark = [
    pytest.mark.skipif(not CUDA_LIB, reason="no CUDA build: make B=build-cuda CUDA=1 shared, then "
                                            "SPARKMONO_CUDA_LIB=build-cuda/libsparkmono.so"),
    pytest.mark.skipif(bool(CUDA_LIB) and not _gpu_present(), reason="no GPU (nvidia-smi -L)"),
]

PROMPTS = [[5, 6, 7, 8, 5, 6], [11, 12, 13], [100, 200, 300, 400, 100, 200], [42]]


def on_cuda(model_dir, code, activations="auto"):
    """Run code (with `sparkmono` imported and `model` open on model_dir with those
    activations) in a child process on the CUDA library; returns what it printed as JSON."""
    prog = "import json, sparkmono\nmodel = sparkmono.Model(%r, activations=%r)\n%s\n" % (model_dir, activations, code)
    env = dict(os.environ, SPARKMONO_LIB=os.path.abspath(CUDA_LIB))
    r = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_cuda_greedy_batch_invariant(ids_dir):
    out = on_cuda(ids_dir, """
e = sparkmono.Engine(model, backend="cuda", max_requests=4)
alone = [e.generate(p, max_tokens=12).ids for p in %r]
again = [e.generate(p, max_tokens=12).ids for p in %r]
many = [c.ids for c in e.generate_many(%r, max_tokens=12)]
print(json.dumps(dict(alone=alone, again=again, many=many, lib=sparkmono.library_path)))
""" % (PROMPTS, PROMPTS, PROMPTS))
    assert out["lib"] == os.path.abspath(CUDA_LIB)
    assert all(1 <= len(ids) <= 12 for ids in out["alone"])
    assert out["again"] == out["alone"] and out["many"] == out["alone"]


def test_cuda_logits_agree_with_cpu(ids_dir, model):
    p = [5, 6, 7, 8, 9, 10]
    out = on_cuda(ids_dir, """
e = sparkmono.Engine(model, backend="cuda")
print(json.dumps(e.prefill_logits(%r).tolist()))
""" % p)
    gpu = np.array(out, dtype=np.float32)
    with sparkmono.Engine(model, threads=2) as e:
        cpu = e.prefill_logits(p)
    used = model.vocab_used
    assert gpu.shape == cpu.shape and np.isfinite(gpu[:, :used]).all()
    err = np.abs(gpu[:, :used] - cpu[:, :used]).max() / np.abs(cpu[:, :used]).max()
    assert err < 0.05, err  # bf16 kernels against the CPU reference's rounding points


def test_cuda_mono_auto_equals_stock(ids_dir):
    out = on_cuda(ids_dir, """
r = {}
for mono in ("off", "auto"):
    with sparkmono.Engine(model, backend="cuda", mono=mono, max_requests=2) as e:
        r[mono] = [c.ids for c in e.generate_many(%r, max_tokens=10)]
print(json.dumps(r))
""" % PROMPTS)
    assert out["auto"] == out["off"]


def test_cuda_w4a4(ids_dir):
    """MXFP4 activations (W4A4) forced on the MXFP4 layers: batch invariant, the monokernel
    gives the stock ids, and the prefill logits are not the W4A16 ones (the switch reaches the
    GPU) while they agree with the CPU engine's W4A4 logits."""
    p = [5, 6, 7, 8, 9, 10]
    code = """
r = {}
for mono in ("off", "auto"):
    with sparkmono.Engine(model, backend="cuda", mono=mono, max_requests=4) as e:
        r[mono] = [[e.generate(q, max_tokens=10).ids for q in %r], [c.ids for c in e.generate_many(%r, max_tokens=10)]]
with sparkmono.Engine(model, backend="cuda") as e:
    r["logits"] = e.prefill_logits(%r).tolist()
print(json.dumps(r))
""" % (PROMPTS, PROMPTS, p)
    w4 = on_cuda(ids_dir, code, activations="mxfp4")
    w16 = on_cuda(ids_dir, code, activations="bf16")
    alone, many = w4["off"]
    assert alone == many and w4["auto"] == w4["off"]
    g4, g16 = np.array(w4["logits"], dtype=np.float32), np.array(w16["logits"], dtype=np.float32)
    with sparkmono.Engine(sparkmono.Model(ids_dir, activations="mxfp4"), threads=2) as e:
        cpu = e.prefill_logits(p)
    with sparkmono.Model(ids_dir) as m:
        used = m.vocab_used
    err4 = np.abs(g4[:, :used] - cpu[:, :used]).max() / np.abs(cpu[:, :used]).max()
    err16 = np.abs(g16[:, :used] - cpu[:, :used]).max() / np.abs(cpu[:, :used]).max()
    # a raw random model: W4A4 amplifies the bf16 differences (docs/model.md section 10)
    assert err4 < 0.3 and 3 * err4 < err16, (err4, err16)


def test_cuda_world_two_virtual_ranks(ids_dir):
    out = on_cuda(ids_dir, """
r = {}
for moe in ("ep", "tp"):
    with sparkmono.Engine(model, backend="cuda", world=2, devices=[0, 0], moe=moe, comm="peer", max_requests=2) as e:
        r[moe] = [[e.generate(p, max_tokens=8).ids for p in %r], [c.ids for c in e.generate_many(%r, max_tokens=8)]]
print(json.dumps(r))
""" % (PROMPTS, PROMPTS))
    for moe in ("ep", "tp"):
        alone, many = out[moe]
        assert alone == many and all(1 <= len(ids) <= 8 for ids in alone), moe


def test_cuda_bad_device_is_a_line(ids_dir):
    out = on_cuda(ids_dir, """
try:
    sparkmono.Engine(model, backend="cuda", world=2, devices=[0, 999])
    print(json.dumps("created"))
except sparkmono.SparkmonoError as ex:
    print(json.dumps([ex.status_name, str(ex)]))
""")
    assert out != "created" and "999" in out[1] and "\n" not in out[1], out
