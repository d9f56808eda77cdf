"""test_prefix.py: the prefix cache as `sparkmono serve` shows it (README "Prefix caching"):
/metrics' counters (`sparkmono_prefix_cache_queries_total` / `_hits_total`, in tokens,
`sparkmono_prompt_tokens_computed_total`) and page gauges (`sparkmono_kv_pages{state}`,
`sparkmono_kv_pool_pages`), /health's `prefix_cache` and `kv_pages`, and `--no-prefix-cache`.
A long prompt sent twice is served from cached pages the second time (every full 16-token page
but the one holding the last token at least), with the same ids as without the cache and as
`sparkmono generate` alone.  Two servers of this module's own (the counters start at 0): the
cache on (the default) and off; the metrics are read with prometheus_client's parser."""
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from conftest import TIMEOUT, Server
from smtest import generate_cli
from test_misc import scrape

PAGE = 16  # tokens of a KV page (include/sparkmono.h: sparkmono_cache_stats.pages)
LONG = [(7 * i + 5) % 497 + 3 for i in range(120)]  # 120 ids, no special ones (0..2)
MAX_TOKENS = 8


def full_pages(n):
    """Tokens of the pages a prompt of n tokens can take from the cache: whole pages, at least
    its last token computed."""
    return (n - 1) // PAGE * PAGE


@pytest.fixture(scope="module")
def cached(tmp, ids_dir):
    s = Server(ids_dir, tmp, "--quiet", "--max-requests", "2")
    yield s
    assert s.stop() == 0, s.read_log()


@pytest.fixture(scope="module")
def uncached(tmp, ids_dir):
    s = Server(ids_dir, tmp, "--quiet", "--max-requests", "2", "--no-prefix-cache")
    yield s
    assert s.stop() == 0, s.read_log()


@pytest.fixture(scope="module")
def reference(ids_dir):
    """LONG's greedy ids from `sparkmono generate` alone (no request before it to reuse)."""
    return generate_cli(ids_dir, LONG, MAX_TOKENS)


def counters(m):
    return (m[("sparkmono_prefix_cache_queries_total", ())], m[("sparkmono_prefix_cache_hits_total", ())],
            m[("sparkmono_prompt_tokens_computed_total", ())])


def complete(s, prompt, **kw):
    kw = dict(dict(max_tokens=MAX_TOKENS, temperature=0), **kw)
    r = s.client().completions.create(model=s.name, prompt=prompt, **kw)
    return r.choices[0].token_ids


def pool_ok(m, h):
    """The gauges add up to the pool, and /health says the same numbers."""
    used, cached_, free = (m[("sparkmono_kv_pages", (("state", st),))] for st in ("used", "cached", "free"))
    total = m[("sparkmono_kv_pool_pages", ())]
    assert total > 0 and min(used, cached_, free) >= 0 and used + cached_ + free == total, (used, cached_, free, total)
    assert h["kv_pages"] == {"total": total, "used": used, "cached": cached_, "free": free}, h
    return used, cached_, free


def test_metrics_and_health_fields(cached, uncached):
    """Every name is there with its type, the pool adds up, /health shows it and whether the
    cache is on, as the enabled gauge does."""
    for s in (cached, uncached):
        assert s.wait_idle()
        text = requests.get(s.url + "/metrics", timeout=TIMEOUT).text
        types = {f.name: f.type for f in text_string_to_metric_families(text)}
        for name in ("prefix_cache_queries", "prefix_cache_hits", "prompt_tokens_computed"):
            assert types.get("sparkmono_" + name) == "counter", (name, types)
        for name in ("kv_pages", "kv_pool_pages", "prefix_cache_enabled"):
            assert types.get("sparkmono_" + name) == "gauge", (name, types)
        m, h = scrape(s), s.health()
        assert isinstance(h["prefix_cache"], bool) and h["prefix_cache"] == bool(m[("sparkmono_prefix_cache_enabled", ())])
        used, _, _ = pool_ok(m, h)
        assert used == 0  # idle: no live request holds a page
        assert min(counters(m)) >= 0
    assert uncached.health()["prefix_cache"] is False


def test_cached_answers_equal(cached, reference, ids_dir):
    """The same greedy request twice (the second from cached pages), a seeded sampled one
    (from cached pages) and a prompt sharing only LONG's first pages: each equal to
    `sparkmono generate` alone (no cache to reuse)."""
    assert complete(cached, LONG) == reference
    assert complete(cached, LONG) == reference
    sampled = generate_cli(ids_dir, LONG, MAX_TOKENS, "--temperature", "0.9", "--seed", "7")
    assert complete(cached, LONG, temperature=0.9, seed=7) == sampled
    other = LONG[:3 * PAGE] + [11, 12, 13, 14, 15]
    assert complete(cached, other) == generate_cli(ids_dir, other, MAX_TOKENS)


def test_no_prefix_cache(uncached, reference):
    """--no-prefix-cache: the same prompt twice hits nothing, the answers are the same, the
    pool holds no cached pages."""
    m0 = scrape(uncached)
    assert complete(uncached, LONG) == reference
    assert complete(uncached, LONG) == reference
    assert uncached.wait_idle()
    m1, h = scrape(uncached), uncached.health()
    assert m1[("sparkmono_prefix_cache_hits_total", ())] == m0[("sparkmono_prefix_cache_hits_total", ())] == 0
    assert m1[("sparkmono_prefix_cache_enabled", ())] == 0 and h["prefix_cache"] is False
    _, cached_pages, _ = pool_ok(m1, h)
    assert cached_pages == 0


# ---- these count what the engine's prefix cache does (src/engine/engine.c)

def test_repeated_prompt_hits(cached, ids_dir):
    """A LONG of another first id (none of its pages cached yet) twice: the second time every
    full page but the last token's comes from the cache (hits grow by at least that many tokens, and computed by only the rest); queries grow;
    idle, the pages stay cached (none used); /health says the cache is on."""
    assert cached.health()["prefix_cache"] is True
    prompt = [3] + LONG[1:]  # a first page of its own: nothing of it is cached before
    ref = generate_cli(ids_dir, prompt, MAX_TOKENS)
    m0 = scrape(cached)
    q0, h0, c0 = counters(m0)
    assert complete(cached, prompt) == ref
    assert cached.wait_idle()
    m1 = scrape(cached)
    q1, h1, c1 = counters(m1)
    assert h1 - h0 == 0 and c1 - c0 == len(prompt), (counters(m0), counters(m1))
    assert q1 - q0 >= full_pages(len(prompt)), (counters(m0), counters(m1))
    assert complete(cached, prompt) == ref
    assert cached.wait_idle()
    m2, h = scrape(cached), cached.health()
    q2, h2, c2 = counters(m2)
    assert h2 - h1 >= full_pages(len(prompt)), (counters(m1), counters(m2))
    assert (h2 - h1) % PAGE == 0 and c2 - c1 == len(prompt) - (h2 - h1), (counters(m1), counters(m2))
    assert q2 - q1 >= h2 - h1
    used, cached_pages, _ = pool_ok(m2, h)
    assert used == 0 and cached_pages >= full_pages(len(prompt)) // PAGE
    assert m2[("sparkmono_prefix_cache_enabled", ())] == 1


def test_no_prefix_cache_computes_every_token(uncached):
    """--no-prefix-cache: every prompt token is computed, every time; nothing is looked up."""
    m0 = scrape(uncached)
    complete(uncached, LONG)
    complete(uncached, LONG)
    assert uncached.wait_idle()
    m1 = scrape(uncached)
    (q0, h0, c0), (q1, h1, c1) = counters(m0), counters(m1)
    assert c1 - c0 == 2 * len(LONG) and h1 == h0 == 0 and q1 == q0, (counters(m0), counters(m1))


def test_small_pool_preempts_and_answers(tmp, ids_dir):
    """A pool of 16 pages for 4 requests of up to 100 tokens: six concurrent requests all get
    200 and the ids `sparkmono generate` gives each alone (the batch makes new requests wait
    for pages and preempts the newest when a step runs short: never an error to the client)."""
    from concurrent.futures import ThreadPoolExecutor

    s = Server(ids_dir, tmp, "--quiet", "--max-requests", "4", "--max-len", "128", "--kv-blocks", "16")
    try:
        prompts = [[(11 * i + 3 * q) % 497 + 3 for i in range(40)] for q in range(6)]
        with ThreadPoolExecutor(6) as ex:
            got = list(ex.map(lambda p: complete(s, p, max_tokens=60, extra_body={"ignore_eos": True}), prompts))
        for p, ids in zip(prompts, got):
            assert ids == generate_cli(ids_dir, p, 60, "--ignore-eos")
        m = scrape(s)
        assert m[("sparkmono_prompt_tokens_computed_total", ())] > 6 * 40  # preempted ones recomputed
    finally:
        assert s.stop() == 0, s.read_log()
