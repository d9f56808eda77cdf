"""test_processors.py: min_p, allowed_token_ids and bad_words through the binding
(Engine.generate / generate_many): each acts as the engine's rule says (the argmax of the
processed prefill logits of every prefix, bad words made ids by vLLM's rule with the
`tokenizers` package), speculation (request_rows 8) equals none (1), and the server's refusals
(src/serve/serve_fields.c) are the binding's ValueError (a wrong type a TypeError)."""
import numpy as np
import pytest
import tokenizers

import sparkmono

P = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]


@pytest.fixture(scope="module")
def engine(model):
    with sparkmono.Engine(model, max_requests=2, threads=2) as e:
        yield e


@pytest.fixture(scope="module")
def text_model(model_dir):
    with sparkmono.Model(model_dir) as m:
        yield m


def test_min_p(model, engine):
    """Each sampled id has p / p_max = exp((l - l_max) / T) >= min_p over the raw logits of its
    prefix; the same seeds without min_p draw below it; greedy ignores it; R 8 equals R 1."""
    T, mp, below = 0.05, 0.5, 0
    for seed in range(3):
        for use in (True, False):
            ids = engine.generate(P, max_tokens=6, temperature=T, seed=seed, min_p=mp if use else 0.0).ids
            rows = engine.prefill_logits(P + ids[:-1]).astype(np.float64)
            for j, t in enumerate(ids):
                row = rows[len(P) - 1 + j]
                ok = np.exp((row[t] - row.max()) / T) >= mp * (1 - 1e-6)
                assert ok or not use, (seed, j)
                below += not ok
    assert below > 0
    assert engine.generate(P, max_tokens=8, min_p=0.9).ids == engine.generate(P, max_tokens=8).ids
    with sparkmono.Engine(model, request_rows=1, threads=2) as one:
        for kw in [dict(temperature=0.3, seed=5, min_p=0.6), dict(temperature=1.0, seed=2, min_p=0.9, top_k=20)]:
            assert engine.generate(P, max_tokens=20, **kw).ids == one.generate(P, max_tokens=20, **kw).ids, kw


def test_allowed_token_ids(engine):
    allow = [9, 40, 41, 300, 301, 2]
    ids = engine.generate(P, max_tokens=6, allowed_token_ids=allow).ids
    rows = engine.prefill_logits(P + ids[:-1])
    for j, t in enumerate(ids):
        row = rows[len(P) - 1 + j]
        assert t == max(allow, key=lambda a: (row[a], -a)), (j, t)
    many = engine.generate_many([P, [11, 12]], max_tokens=10, temperature=1.0, seed=4, allowed_token_ids=np.array(allow))
    assert all(set(c.ids) <= set(allow) for c in many)


def vllm_bad_word_ids(tok, words):
    """vLLM's id sequences of words (its rule, written from its behaviour)."""
    seqs = []
    for w in words:
        plain = tok.encode(w.lstrip(), add_special_tokens=False).ids
        seqs.append(plain)
        spaced = tok.encode(" " + w.lstrip(), add_special_tokens=False).ids
        if spaced[0] != plain[0] and len(spaced) == len(plain):
            seqs.append(spaced)
    return seqs


def test_bad_words(text_model, model_dir):
    """Each greedy id is the argmax of the prefill logits with every bad sequence's last id masked
    where the generated ids end with the rest of it; the output differs from the free one."""
    tok = tokenizers.Tokenizer.from_file(model_dir + "/tokenizer.json")
    with sparkmono.Engine(text_model, threads=2) as e:
        free = e.generate("hello world", max_tokens=12)
        texts = [tok.decode([t]) for t in free.ids]
        words = [texts[1].strip(), texts[0] + texts[1], "  zebra crossing"]
        seqs = vllm_bad_word_ids(tok, words)
        got = e.generate("hello world", max_tokens=12, bad_words=words)
        prompt = tok.encode("hello world", add_special_tokens=False).ids
        rows = e.prefill_logits(prompt + got.ids[:-1]).astype(np.float64)
        for j, t in enumerate(got.ids):
            row = rows[len(prompt) - 1 + j].copy()
            for s in seqs:
                if len(s) - 1 <= j and got.ids[j - len(s) + 1:j] == s[:-1]:
                    row[s[-1]] = -np.inf
            assert int(np.argmax(row)) == t, (j, t)
        assert got.ids != free.ids
        with sparkmono.Engine(text_model, request_rows=1, threads=2) as one:
            assert one.generate("hello world", max_tokens=12, bad_words=words).ids == got.ids


@pytest.mark.parametrize("kw, exc, says", [
    (dict(min_p=1.5), ValueError, r"min_p = 1.5 is not a number in \[0, 1\]"),
    (dict(min_p=-0.1), ValueError, "min_p = -0.1"),
    (dict(min_p="0.1"), TypeError, "min_p must be a number, not str"),
    (dict(allowed_token_ids=[]), ValueError, "allowed_token_ids has 0 ids"),
    (dict(allowed_token_ids=[1, 512]), ValueError, r"allowed_token_ids\[1\] = 512 is not in \[0, 511\]"),
    (dict(allowed_token_ids=[1] * 1025), ValueError, "allowed_token_ids has 1025 ids: give 1 to 1024"),
    (dict(allowed_token_ids=5), TypeError, "allowed_token_ids must be a list of ints, not int"),
    (dict(allowed_token_ids=[1.0]), TypeError, r"allowed_token_ids\[0\] must be an int"),
    (dict(bad_words=["x"]), sparkmono.SparkmonoValueError, "bad_words needs text"),
    (dict(bad_words="hello"), TypeError, "bad_words must be a list of str, not str"),
    (dict(bad_words=[1]), TypeError, r"bad_words\[0\] must be a str, not int"),
    (dict(bad_words=["x"] * 65), ValueError, "bad_words has 65 words; at most 64"),
])
def test_refusals(engine, kw, exc, says):
    with pytest.raises(exc, match=says):
        engine.generate(P, max_tokens=2, **kw)


@pytest.mark.parametrize("words, says", [
    (["ok", ""], "bad word 1 is empty"),
    ([" \t\u3000"], "bad word 0 is empty"),
    (["a b c d e f g h i j k l m n o p q r s t u v w x y z " * 5] * 10, "more than 64 id sequences or 512 ids"),
])
def test_bad_words_refused_as_the_server(text_model, words, says):
    """The server's 400s (the same C rule, src/engine/logitproc.c) are SparkmonoValueErrors."""
    with sparkmono.Engine(text_model, threads=2) as e:
        with pytest.raises(sparkmono.SparkmonoValueError, match=says):
            e.generate("hi", max_tokens=2, bad_words=words)
        assert e.generate("hi", max_tokens=2, bad_words=[]).ids == e.generate("hi", max_tokens=2).ids
