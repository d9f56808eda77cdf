"""test_args.py: the binding's argument checks and surface.  A value of the wrong type is a
TypeError (float ids are not truncated, a bool is not an int), a value out of range a
ValueError naming the argument (0 never means "the default"), the engine's own bounds a
SparkmonoValueError (a ValueError and a SparkmonoError); the engine options the CLI has
(world, moe, devices, comm, mono, prefix_cache) reach the engine; __version__ is the library's (the CLI's);
the module exports exactly __all__; every public function has type hints; the CUDA backend
asked of a library built without it is refused with the engine's line."""
import inspect
import subprocess

import numpy as np
import pytest

import sparkmono
from smtest import SM_BIN, generate_cli


@pytest.fixture(scope="module")
def engine(model):
    with sparkmono.Engine(model, max_requests=2, threads=2) as e:
        yield e


@pytest.mark.parametrize("prompt, says", [
    ([5.5, 6], r"prompt\[0\] must be an int, not float"),
    ([5, 6.0], r"prompt\[1\] must be an int, not float"),
    ([True, 6], r"prompt\[0\] must be an int, not bool"),
    (np.array([5.5, 6.0]), "1-D array of integers"),
    (np.array([[5, 6]]), "1-D array of integers"),
    (b"\x05\x06", "list of ints, not bytes"),
    (5, "list of ints, not int"),
    ({5, 6}, "list of ints, not set"),
    (None, "list of ints, not NoneType"),
])
def test_prompt_type_errors(engine, prompt, says):
    with pytest.raises(TypeError, match=says):
        engine.generate(prompt, max_tokens=2)


@pytest.mark.parametrize("kw, says", [
    (dict(max_tokens=2.0), "max_tokens must be an int, not float"),
    (dict(max_tokens=True), "max_tokens must be an int, not bool"),
    (dict(max_tokens="2"), "max_tokens must be an int, not str"),
    (dict(temperature="0.5"), "temperature must be a number, not str"),
    (dict(temperature=True), "temperature must be a number, not bool"),
    (dict(top_p=None), "top_p must be a number, not NoneType"),
    (dict(top_k=1.0), "top_k must be an int, not float"),
    (dict(seed=1.5), "seed must be an int, not float"),
    (dict(seed=False), "seed must be an int, not bool"),
])
def test_generate_type_errors(engine, kw, says):
    with pytest.raises(TypeError, match=says):
        engine.generate([5, 6], **dict(dict(max_tokens=2), **kw))


@pytest.mark.parametrize("prompt, kw, says", [
    ([5, 6], dict(max_tokens=0), r"max_tokens = 0 is not in \[1,"),
    ([5, 6], dict(max_tokens=-3), r"max_tokens = -3 is not in \[1,"),
    ([5, 6], dict(temperature=-0.1), "temperature = -0.1 is not a number in"),
    ([5, 6], dict(temperature=float("nan")), "temperature = nan"),
    ([5, 6], dict(temperature=float("inf")), "temperature = inf"),
    ([5, 6], dict(top_p=1.5), r"top_p = 1.5 is not a number in \[0, 1\]"),
    ([5, 6], dict(top_k=-2), r"top_k = -2 is not in \[-1,"),
    ([5, 6], dict(top_p=0.0), "top_p = 0.0 must be greater than 0"),
    ([5, 6], dict(temperature=2.5), r"temperature = 2.5 is not a number in \[0, 2\]"),
    ([5, 6], dict(min_tokens=3), "min_tokens = 3 is more than max_tokens = 2"),
    ([5, 6], dict(seed=-1), r"seed = -1 is not in \[0,"),
    ([5, 6], dict(seed=2 ** 64), "seed = 18446744073709551616"),
    ([1, 512], {}, r"prompt\[1\] = 512 is not in \[0, 511\]"),
    ([-1], {}, r"prompt\[0\] = -1 is not in \[0, 511\]"),
    (np.array([3, 600]), {}, r"prompt\[1\] = 600"),
    ([], {}, "the prompt is empty"),
])
def test_generate_value_errors(engine, prompt, kw, says):
    with pytest.raises(ValueError, match=says):
        engine.generate(prompt, **dict(dict(max_tokens=2), **kw))


def test_top_k_minus_one_is_no_limit(engine):
    """As the server (vLLM's extension): top_k -1 means no limit, the same draws as 0."""
    a = engine.generate([5, 6, 7], max_tokens=6, temperature=0.9, seed=4, top_k=-1).ids
    b = engine.generate([5, 6, 7], max_tokens=6, temperature=0.9, seed=4, top_k=0).ids
    assert a == b


def test_accepted_forms(engine, model_dir):
    """Integer numpy arrays and numpy integer scalars are ints; the engine still works after
    every refusal above."""
    ref = generate_cli(model_dir, [5, 6, 7], 4)
    assert engine.generate(np.array([5, 6, 7], dtype=np.int32), max_tokens=np.int64(4)).ids == ref
    assert engine.generate((5, 6, 7), max_tokens=4, temperature=0, top_p=1, seed=np.uint64(3)).ids == ref
    with pytest.raises(TypeError, match="prompts must be a list of prompts, not str"):
        engine.generate_many("5 6 7", max_tokens=2)
    with pytest.raises(TypeError, match="prompts must be a list of prompts, not int"):
        engine.generate_many(5, max_tokens=2)


@pytest.mark.parametrize("kw, exc, says", [
    (dict(request_rows=0), ValueError, r"request_rows = 0 is not in \[1,"),
    (dict(max_requests=0), ValueError, r"max_requests = 0 is not in \[1,"),
    (dict(max_len=0), ValueError, r"max_len = 0 is not in \[1,"),
    (dict(threads=0), ValueError, r"threads = 0 is not in \[1,"),
    (dict(prefill_chunk=0), ValueError, r"prefill_chunk = 0 is not in \[1,"),
    (dict(world=0), ValueError, r"world = 0 is not in \[1,"),
    (dict(request_rows=8.0), TypeError, "request_rows must be an int, not float"),
    (dict(request_rows=True), TypeError, "request_rows must be an int, not bool"),
    (dict(max_requests=2.5), TypeError, "max_requests must be an int, not float"),
    (dict(threads="2"), TypeError, "threads must be an int, not str"),
    (dict(backend=1), TypeError, "backend must be a str, not int"),
    (dict(backend="tpu"), ValueError, "backend 'tpu' is not one of cpu, cuda"),
    (dict(mono="maybe"), ValueError, "mono 'maybe' is not one of off, auto, on"),
    (dict(mono="on"), ValueError, "mono 'on' needs backend 'cuda'"),
    (dict(moe="dp", world=2), ValueError, "moe 'dp' is not one of ep, tp"),
    (dict(comm="mpi", world=2), ValueError, "comm 'mpi' is not one of peer, nccl"),
    (dict(devices="0,1", world=2), TypeError, "devices must be a list of ints, not str"),
    (dict(devices=[0, 1.0], world=2), TypeError, r"devices\[1\] must be an int, not float"),
    (dict(devices=[0, -1], world=2), ValueError, r"devices\[1\] = -1"),
    (dict(devices=[0], world=2), ValueError, "devices lists 1 devices: give one a rank"),
    (dict(devices=[0]), ValueError, "moe, devices and comm go with world > 1"),
    (dict(moe="tp"), ValueError, "moe, devices and comm go with world > 1"),
    (dict(comm="peer"), ValueError, "moe, devices and comm go with world > 1"),
    (dict(prefix_cache=1), TypeError, "prefix_cache must be a bool, not int"),
    (dict(prefix_cache="off"), TypeError, "prefix_cache must be a bool, not str"),
    (dict(prefix_cache=None), TypeError, "prefix_cache must be a bool, not NoneType"),
    (dict(gpu_memory_utilization="0.9"), TypeError, "gpu_memory_utilization must be a number, not str"),
    (dict(gpu_memory_utilization=1.5), ValueError, r"gpu_memory_utilization 1.5 is not in \(0, 1\]"),
    (dict(gpu_memory_utilization=0.9), ValueError, "gpu_memory_utilization sizes the KV pool of backend 'cuda'"),
    (dict(request_rows=1000), sparkmono.SparkmonoValueError, "request_rows"),  # the engine's bound
    (dict(max_len=1 << 25), sparkmono.SparkmonoValueError, "max_len"),
])
def test_engine_option_errors(model, kw, exc, says):
    before = model._engines
    with pytest.raises(exc, match=says):
        sparkmono.Engine(model, **kw)
    assert model._engines == before  # nothing half made


def test_model_argument_errors(model_dir, model):
    with pytest.raises(TypeError, match="path must be a str or os.PathLike, not int"):
        sparkmono.Model(123)
    with pytest.raises(TypeError, match="online_mxfp4 must be a bool, not int"):
        sparkmono.Model(model_dir, online_mxfp4=1)
    with pytest.raises(TypeError, match="model must be a sparkmono.Model, not str"):
        sparkmono.Engine(model_dir)
    with sparkmono.Model(model_dir) as m:
        with pytest.raises(TypeError, match="text must be a str, not bytes"):
            m.encode(b"abc")
        with pytest.raises(TypeError, match=r"ids\[0\] must be an int, not float"):
            m.decode([3.0, 4])
        with pytest.raises(ValueError, match=r"ids\[1\] = 512"):
            m.decode([3, 512])
        with pytest.raises(TypeError, match="skip_special_tokens must be a bool"):
            m.decode([3], skip_special_tokens=0)


def test_sampling_error_leaves_engine_usable(engine, model_dir):
    with pytest.raises(sparkmono.SparkmonoValueError, match="max model length"):
        engine.generate_many([[5, 6], [7] * 5000], max_tokens=2)
    assert engine.generate([5, 6, 7], max_tokens=4).ids == generate_cli(model_dir, [5, 6, 7], 4)


def test_world_options_reach_the_engine(model, model_dir):
    """CPU world = 2 (experts split across ranks, then each split along its width): the same
    ids as `sparkmono generate --world 2` with the same --moe."""
    for moe in ("ep", "tp"):
        with sparkmono.Engine(model, world=2, moe=moe, threads=2, max_requests=2) as e:
            assert e.world == 2
            outs = e.generate_many([[5, 6, 7], [11, 12, 13]], max_tokens=6)
        assert [o.ids for o in outs] == [generate_cli(model_dir, p, 6, "--world", "2", "--moe", moe)
                                         for p in ([5, 6, 7], [11, 12, 13])]


def test_prefix_cache_option_reaches_the_engine(model, model_dir):
    """prefix_cache=False is --no-prefix-cache: the engine says the cache is off, and the ids are
    `sparkmono generate --no-prefix-cache`'s; cache_stats() of a closed engine is a line."""
    with sparkmono.Engine(model, threads=2, prefix_cache=False) as e:
        assert e.prefix_cache is False
        st = e.cache_stats()
        assert isinstance(st, sparkmono.CacheStats) and st.enabled is False and st.pages > 0
        assert e.generate([5, 6, 7], max_tokens=4).ids == generate_cli(model_dir, [5, 6, 7], 4, "--no-prefix-cache")
    with pytest.raises(sparkmono.SparkmonoError, match="the engine is closed"):
        e.cache_stats()


def test_cuda_backend_unavailable_is_a_line(model):
    """backend "cuda" where it cannot run is the engine's one line, a SparkmonoError: a library
    built without it says so; one built with it, on a machine without a GPU, says that."""
    before = model._engines
    has_cuda = subprocess.run(["nm", "-D", "--defined-only", sparkmono.library_path], capture_output=True,
                              text=True).stdout.find(" sm_cuda_backend_create") >= 0
    try:
        e = sparkmono.Engine(model, backend="cuda")
    except sparkmono.SparkmonoError as ex:
        assert ex.status_name == "backend error" and "\n" not in str(ex), str(ex)
        assert ("cuda" in str(ex)) and (has_cuda or "not built in" in str(ex)), str(ex)
        assert model._engines == before
        return
    e.close()
    assert has_cuda
    pytest.skip("this library has the CUDA backend and a GPU (tests/python/test_cuda.py covers it)")


def test_version_is_the_projects():
    out = subprocess.run([SM_BIN, "--version"], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "sparkmono" and out[1] == sparkmono.__version__
    assert sparkmono.__version__.count(".") == 2


def test_namespace_is_clean():
    public = {n for n in dir(sparkmono) if not n.startswith("_")}
    assert public == set(sparkmono.__all__) - {"__version__"}, public ^ set(sparkmono.__all__)
    for name in ("List", "Optional", "np", "os", "ctypes", "dataclass", "Sequence", "Union"):
        assert not hasattr(sparkmono, name), name
    ns = {}
    exec("from sparkmono import *", ns)
    assert set(ns) - {"__builtins__"} == set(sparkmono.__all__)


def test_type_hints():
    """Every public function and method annotates every parameter and its result."""
    funcs = [sparkmono.Model.__init__, sparkmono.Model.encode, sparkmono.Model.decode, sparkmono.Model.close,
             sparkmono.Engine.__init__, sparkmono.Engine.generate, sparkmono.Engine.generate_many,
             sparkmono.Engine.prefill_logits, sparkmono.Engine.cache_stats, sparkmono.Engine.close]
    for f in funcs:
        sig = inspect.signature(f)
        missing = [p for p in list(sig.parameters)[1:] if sig.parameters[p].annotation is inspect.Parameter.empty]
        assert not missing and sig.return_annotation is not inspect.Signature.empty, (f.__qualname__, missing)


def test_model_activations(model_dir, tmp):
    """activations= (sparkmono_model_opts.activations): its type and words; forcing mxfp4 on a
    model without MXFP4 experts is the engine's refusal, naming the way out."""
    import os
    import subprocess

    from smtest import SM_BIN

    with pytest.raises(TypeError, match="activations must be a str, not int"):
        sparkmono.Model(model_dir, activations=1)
    with pytest.raises(TypeError, match="activations must be a str, not NoneType"):
        sparkmono.Model(model_dir, activations=None)
    with pytest.raises(ValueError, match="activations 'w4a4' is not one of auto, mxfp4, bf16"):
        sparkmono.Model(model_dir, activations="w4a4")
    for a in ("auto", "mxfp4", "bf16"):
        with sparkmono.Model(model_dir, activations=a) as m:
            assert m.activations == a
    bf = os.path.join(tmp, "tiny-bf16-acts")
    if not os.path.isdir(bf):
        subprocess.run([SM_BIN, "make-model", "--quiet", "--preset", "tiny", "--experts", "bf16", "--out", bf],
                       check=True)
    with pytest.raises(sparkmono.SparkmonoError, match="online-mxfp4"):
        sparkmono.Model(bf, activations="mxfp4")
    with sparkmono.Model(bf, online_mxfp4=True, activations="mxfp4") as m:
        assert m.num_layers == 4


def test_model_activations_numerics(tmp):
    """On a W4A4 checkpoint the default is W4A4 (== activations "mxfp4") and "bf16" differs
    (the CPU reference reads sm_experts.act_mx)."""
    import os
    import subprocess

    from smtest import SM_BIN

    d = os.path.join(tmp, "tiny-w4a4")
    if not os.path.isdir(d):
        subprocess.run([SM_BIN, "make-model", "--quiet", "--preset", "tiny", "--experts", "mxfp4", "--activations",
                        "mxfp4", "--seed", "3", "--out", d], check=True)
    out = {}
    for a in ("auto", "mxfp4", "bf16"):
        with sparkmono.Model(d, activations=a) as m:
            with sparkmono.Engine(m, threads=2) as g:
                out[a] = g.prefill_logits([5, 6, 7, 8])
    assert (out["auto"] == out["mxfp4"]).all()
    assert not (out["auto"] == out["bf16"]).all()
