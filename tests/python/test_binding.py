"""test_binding.py: the Python binding (python/sparkmono) against the CLI: generate and
generate_many equal `sparkmono generate` alone, prefill logits equal `sparkmono logits`, text
in and out through the model's tokenizer.json equals the `tokenizers` package, every engine
error is a SparkmonoError with the engine's line, `pip install ./python` gives a package
that finds its library by itself, and cache_stats() counts the prefix cache's work."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import sparkmono
from smtest import SM_BIN, generate_cli

PROMPTS = [[5, 6, 7, 8, 5, 6], [11, 12, 13], [100, 200, 300, 400, 100, 200], [42], [7, 7, 7, 7, 7]]
MAX_TOKENS = [12, 9, 16, 5, 14]


@pytest.fixture(scope="module")
def reference(model_dir):
    return [generate_cli(model_dir, p, n) for p, n in zip(PROMPTS, MAX_TOKENS)]


def test_model_info(model):
    assert model.vocab_size == 512 and model.num_layers == 4 and model.hidden_size == 256
    assert model.bos == 1 and model.eos == (2,) and not model.has_tokenizer


def test_generate_equals_cli(model, reference):
    with sparkmono.Engine(model, threads=2) as e:
        for p, n, ref in zip(PROMPTS, MAX_TOKENS, reference):
            c = e.generate(p, max_tokens=n)
            assert c.ids == ref
            assert c.finish_reason == ("length" if len(ref) == n else "stop")
            assert c.prompt_tokens == len(p) and c.text is None


def test_no_spec_equals(model, reference):
    with sparkmono.Engine(model, request_rows=1, threads=2) as e:
        assert e.generate(np.array(PROMPTS[0]), max_tokens=MAX_TOKENS[0]).ids == reference[0]


def test_generate_many_equals_alone(model, reference):
    """5 prompts through 2 slots: continuous batching, results in order, each as alone."""
    with sparkmono.Engine(model, max_requests=2, threads=2) as e:
        outs = [e.generate_many([p], max_tokens=n)[0].ids for p, n in zip(PROMPTS, MAX_TOKENS)]
        assert outs == reference
        many = e.generate_many(PROMPTS, max_tokens=16)
        assert [c.ids[:n] for c, n in zip(many, MAX_TOKENS)] == [r[:n] for r, n in zip(reference, MAX_TOKENS)]


def test_prefill_logits_equal_cli(model, model_dir, tmp):
    p = [5, 6, 7, 8]
    with sparkmono.Engine(model, threads=2) as e:
        a = e.prefill_logits(p)
    assert a.shape == (4, 512) and a.dtype == np.float32 and np.isfinite(a).all()
    out = os.path.join(tmp, "l.npy")
    subprocess.run([SM_BIN, "logits", "--model", model_dir, "--prompt-ids", "5,6,7,8", "--out", out, "--threads", "2"],
                   check=True, capture_output=True)
    b = np.load(out)
    assert np.array_equal(a, b)
    # the last row's argmax is the first greedy token
    assert int(a[-1].argmax()) == generate_cli(model_dir, p, 1)[0]


def test_errors_carry_engine_message(model, tmp):
    with pytest.raises(sparkmono.SparkmonoError) as ex:
        sparkmono.Model(os.path.join(tmp, "no-such-dir"))
    assert "no-such-dir" in str(ex.value) and ex.value.status_name == "model error"
    with sparkmono.Engine(model, max_len=16, threads=2) as e:
        with pytest.raises(sparkmono.SparkmonoError) as ex:  # the engine's bound: a SparkmonoValueError
            e.generate([1, 2, 3], max_tokens=20)
        assert "max model length 16" in str(ex.value) and ex.value.status == 1 and isinstance(ex.value, ValueError)
        with pytest.raises(sparkmono.SparkmonoError, match="tokenizer"):
            e.generate("text without a tokenizer", max_tokens=2)
        assert e.generate([5, 6], max_tokens=3).ids  # the engine still works after errors
    with pytest.raises(sparkmono.SparkmonoValueError, match="request_rows"):
        sparkmono.Engine(model, request_rows=1000)
    e = sparkmono.Engine(model, threads=1)
    with pytest.raises(sparkmono.SparkmonoError, match="open engine"):
        model.close()
    e.close()
    with pytest.raises(sparkmono.SparkmonoError, match="closed"):
        e.generate([1], 1)


def test_text(model_dir):
    """Text in and out through the model's tokenizer.json, as the `tokenizers` package reads it."""
    tokenizers = pytest.importorskip("tokenizers")
    hf = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    with sparkmono.Model(model_dir) as m, sparkmono.Engine(m, threads=2) as e:
        assert m.has_tokenizer
        for t in ["the quick brown fox", "café 東京 🙂", "  spaces\tand\nlines  ", "<|eos|> special", ""]:
            assert m.encode(t) == hf.encode(t).ids, t
        for p in ([5, 6, 7], [300, 2, 301], list(range(3, 60))):
            assert m.decode(p) == hf.decode(p)
            assert m.decode(p, skip_special_tokens=False) == hf.decode(p, skip_special_tokens=False)
        ids = m.encode("Serving models means")
        c = e.generate("Serving models means", max_tokens=12)
        assert c.ids == e.generate(ids, max_tokens=12).ids
        assert c.text == hf.decode(c.ids) and c.prompt_tokens == len(ids)


def test_library_not_found_is_clear(tmp):
    env = dict(os.environ, SPARKMONO_LIB=os.path.join(tmp, "missing.so"))
    r = subprocess.run([sys.executable, "-c", "import sparkmono"], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "make shared" in r.stderr and "missing.so" in r.stderr


def test_pip_install_finds_its_library(tmp, model_dir):
    """`pip install ./python` (here into a target folder) copies the library into the package,
    which then needs no SPARKMONO_LIB."""
    here = os.path.dirname(os.path.abspath(__file__))
    pkg = os.path.join(tmp, "python")  # a copy: pip's build leaves folders in the tree it builds
    shutil.copytree(os.path.join(here, "..", "..", "python"), pkg,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "*.so"))
    target = os.path.join(tmp, "site")
    env = dict(os.environ, SPARKMONO_LIB=os.path.abspath(sparkmono.library_path))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                        "--target", target, pkg], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert os.path.isfile(os.path.join(target, "sparkmono", "libsparkmono.so"))
    env.pop("SPARKMONO_LIB", None)
    env["PYTHONPATH"] = target
    code = ("import sparkmono; m = sparkmono.Model(%r); e = sparkmono.Engine(m, threads=1); "
            "print(sparkmono.library_path); print(e.generate([5, 6, 7], max_tokens=3).ids)" % model_dir)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith(target) and lines[1] == str(generate_cli(model_dir, [5, 6, 7], 3))
    # the installed package's metadata has the library's version, the project's one string
    code = "import importlib.metadata as m; print(m.version('sparkmono'))"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp)
    assert r.returncode == 0 and r.stdout.strip() == sparkmono.__version__, (r.stdout, r.stderr[-500:])


def test_sampling_reproducible(model):
    with sparkmono.Engine(model, max_requests=3, threads=2) as e:
        kw = dict(max_tokens=10, temperature=0.8, top_p=0.9, top_k=40, seed=99)
        a = e.generate([5, 6, 7], **kw).ids
        assert e.generate([5, 6, 7], **kw).ids == a
        many = e.generate_many([[5, 6, 7], [11, 12], [42, 43, 44]], **kw)
        assert many[0].ids == a
        assert [e.generate(p, **kw).ids for p in ([11, 12], [42, 43, 44])] == [m.ids for m in many[1:]]
        assert e.generate([5, 6, 7], **dict(kw, seed=100)).ids != a or e.generate([5, 6, 7], **dict(kw, seed=101)).ids != a


def test_processors_equal_cli(model, model_dir):
    """The logit processors through the binding equal the CLI's flags (the same engine rule),
    change the output, and bad values are refused naming the argument."""
    p = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    with sparkmono.Engine(model, threads=2) as e:
        got = e.generate(p, max_tokens=12, repetition_penalty=0.5, presence_penalty=-1.0, min_tokens=3).ids
        plain = e.generate(p, max_tokens=12).ids
        with pytest.raises(ValueError, match=r"presence_penalty = 3(.0)? is not a number in \[-2, 2\]"):
            e.generate(p, max_tokens=2, presence_penalty=3)
        with pytest.raises(TypeError, match="ignore_eos must be a bool"):
            e.generate(p, max_tokens=2, ignore_eos=1)
    ref = generate_cli(model_dir, p, 12, "--repetition-penalty", "0.5", "--presence-penalty", "-1", "--min-tokens", "3")
    assert got == ref and got != plain


def test_cache_stats_move(model, model_dir):
    """cache_stats(): a fresh engine's pool is free; a 100-token prompt computes all 100 tokens;
    the same prompt again takes every full page but the last token's from the cache (hits grow by
    at least 96 tokens, computed only by the rest) with the same ids as the CLI alone; idle, no
    page is used and the prompt's pages stay cached.  With prefix_cache=False nothing is hit and
    every token is computed each time.  (The counts need the engine's prefix cache,
    src/engine/engine.c.)"""
    p = [(7 * i + 5) % 497 + 3 for i in range(100)]
    ref = generate_cli(model_dir, p, 6)
    with sparkmono.Engine(model, threads=2) as e:
        s0 = e.cache_stats()
        assert s0.enabled is True and s0.pages > 0 and s0.pages_free == s0.pages
        assert (s0.queries, s0.hits, s0.computed, s0.pages_used, s0.pages_cached) == (0, 0, 0, 0, 0)
        assert e.generate(p, max_tokens=6).ids == ref
        s1 = e.cache_stats()
        assert s1.hits == 0 and s1.computed == len(p) and s1.queries >= 96, s1
        assert e.generate(p, max_tokens=6).ids == ref
        s2 = e.cache_stats()
        assert s2.hits - s1.hits >= 96 and (s2.hits - s1.hits) % 16 == 0, s2
        assert s2.computed - s1.computed == len(p) - (s2.hits - s1.hits) and s2.queries - s1.queries >= 96, s2
        assert s2.pages_used == 0 and s2.pages_cached >= 6, s2
        assert s2.pages_used + s2.pages_cached + s2.pages_free == s2.pages
    with sparkmono.Engine(model, threads=2, prefix_cache=False) as e:
        for _ in range(2):
            assert e.generate(p, max_tokens=6).ids == ref
        s = e.cache_stats()
        assert s.enabled is False and s.hits == 0 and s.computed == 2 * len(p) and s.pages_cached == 0, s


def test_threads_share_one_engine(model):
    """Eight threads calling one Engine at once (generate, generate_many, prefill_logits,
    cache_stats) take turns: each result equals the same call alone, nothing crashes."""
    import threading

    prompts = [[5 + i, 6 + i, 7 + i, 8 + i, 5 + i, 6 + i] for i in range(8)]
    with sparkmono.Engine(model, threads=1, max_requests=2) as e:
        alone = [e.generate(p, max_tokens=10).ids for p in prompts]
        logits0 = e.prefill_logits(prompts[0])
        got, errors = {}, []

        def work(i):
            try:
                for _ in range(3):
                    if i % 4 == 3:
                        assert np.array_equal(e.prefill_logits(prompts[0]), logits0)
                        e.cache_stats()
                    elif i % 4 == 2:
                        got[i] = [c.ids for c in e.generate_many([prompts[i], prompts[(i + 1) % 8]], max_tokens=10)]
                    else:
                        got[i] = e.generate(prompts[i], max_tokens=10).ids
            except Exception as x:  # reported below, with the thread
                errors.append((i, repr(x)))

        ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        assert not errors, errors
        assert not any(t.is_alive() for t in ts), "a thread hung"
        for i, ids in got.items():
            want = [alone[i], alone[(i + 1) % 8]] if i % 4 == 2 else alone[i]
            assert ids == want, i
