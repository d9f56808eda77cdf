"""sparkmono: the Python binding of the sparkmono decode engine (ctypes over libsparkmono.so).

    import sparkmono
    model = sparkmono.Model("build/models/tiny")          # + tokenizer.json when the dir has one
    engine = sparkmono.Engine(model, request_rows=8, max_requests=4)
    out = engine.generate([5, 6, 7], max_tokens=16)      # or a text prompt, with a tokenizer
    out.ids, out.text, out.finish_reason                  # text is None without a tokenizer
    outs = engine.generate_many([[5, 6], [7, 8, 9]], max_tokens=8)   # batched, continuous
    engine.generate("Answer:", max_tokens=32, json_schema={"type": "boolean"})  # structured output
    engine.generate("Pick:", choice=["yes", "no"]); engine.generate(p, regex=r"[0-9]{3}")
    yn = sparkmono.Constraint(model, "choice", ["yes", "no"])   # compiled once, reused
    engine.generate_many(prompts, constraint=yn)
    logits = engine.prefill_logits([5, 6, 7])             # numpy float32 [3, vocab_size]
    engine.cache_stats()                                  # prefix cache + KV pages: CacheStats
    sparkmono.Engine(model, backend="cuda", world=2, devices=[0, 1])  # a CUDA build of the library

Arguments are checked before any call into the engine: a value of the wrong type is a
TypeError (a float id such as 5.5 is not truncated, True is not 1), a value out of its range a
ValueError (0 never means "the default"), and every failure of the engine a SparkmonoError
carrying the engine's one-line message (sparkmono_errmsg) and its status; the engine's refusal
of an argument (a bound it owns, such as the most request_rows) is a SparkmonoValueError, a
ValueError too.  Generation is greedy unless temperature > 0;
sampled draws depend on (seed, position) only, so a request's output does not depend on what
it is batched with.  Structured outputs (a model with tokenizer.json): one of regex=, choice=,
json_schema= (a dict or its JSON text), json_object=True, or constraint= (a Constraint,
compiled once and reusable across calls and engines of its model) makes every generated text
one the constraint accepts: ids the constraint cannot read next are masked before the draw, eos
only where the text is complete; JSON is compact unless any_whitespace=True; a spec the
compiler refuses is a SparkmonoValueError with its line.  generate_many runs on the engine's own continuous batching
(sparkmono_batch_*, src/engine/batch.c), as `generate --batch` and `serve` do.  An Engine is
used by one thread at a time (as the C API).  __version__ is the library's
(sparkmono_version(): include/sparkmono.h holds the one version string).  We rejected a C
extension module: ctypes needs no compiler at install, and the C API is small and stable.
"""
import ctypes as _ctypes
import json as _json
import threading as _threading
import weakref as _weakref
import math as _math
import numbers as _numbers
import os as _os
import typing as _t
from collections import abc as _abc
from dataclasses import dataclass as _dataclass

import numpy as _np

from . import _lib

__all__ = ["Model", "Engine", "Constraint", "Completion", "CacheStats", "SparkmonoError", "SparkmonoValueError", "library_path",
           "__version__"]

library_path: str = _lib.path  # the libsparkmono.so in use
__version__: str = _lib.version().decode()

_SM_E_INVALID, _SM_E_MODEL, _SM_E_BACKEND, _SM_E_STATE = 1, 2, 4, 6
_BATCH_EOS, _BATCH_LENGTH = 1, 2  # sparkmono_batch_event.done (include/sparkmono.h)
_MAX_INT = 2 ** 31 - 1  # a C int

_Prompt = _t.Union[str, _t.Sequence[int], "_np.ndarray"]


class SparkmonoError(Exception):
    """An engine call failed: .status is the sm_status code, .status_name its name, and the
    message is the engine's one line."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.status_name = _lib.status_str(status).decode()
        self.message = message
        super().__init__(message or self.status_name)


class SparkmonoValueError(SparkmonoError, ValueError):
    """The engine refused an argument (status "invalid argument"): a value out of the range the
    engine allows (request_rows above what the backend takes, a prompt longer than max_len, ...).
    Also a ValueError, like the values the binding refuses itself."""


def _check(status: int) -> None:
    if status != 0:
        cls = SparkmonoValueError if status == _SM_E_INVALID else SparkmonoError
        raise cls(status, _lib.errmsg().decode("utf-8", "replace"))


# ---- argument checks: TypeError for a wrong type, ValueError for a value out of range ----------

def _int(name: str, v: object, lo: int, hi: _t.Optional[int] = None) -> int:
    """v as an int >= lo (and <= hi when given); a bool or a float is a TypeError (never
    truncated).  Upper bounds the engine owns (request_rows, max_len, ...) are its to check:
    its refusal is a SparkmonoValueError."""
    if isinstance(v, bool) or not isinstance(v, _numbers.Integral):
        raise TypeError("%s must be an int, not %s" % (name, type(v).__name__))
    x = int(v)
    if x < lo or (hi is not None and x > hi):
        raise ValueError("%s = %d is not in [%d, %s]" % (name, x, lo, "%d" % hi if hi is not None else "..."))
    return x


def _real(name: str, v: object, lo: float, hi: float) -> float:
    """v as a finite float in [lo, hi]; a bool is a TypeError."""
    if isinstance(v, bool) or not isinstance(v, _numbers.Real):
        raise TypeError("%s must be a number, not %s" % (name, type(v).__name__))
    x = float(v)
    if not (_math.isfinite(x) and lo <= x <= hi):
        raise ValueError("%s = %r is not a number in [%g, %g]" % (name, x, lo, hi))
    return x


def _choice(name: str, v: object, choices: _t.Tuple[str, ...]) -> str:
    if not isinstance(v, str):
        raise TypeError("%s must be a str, not %s" % (name, type(v).__name__))
    if v not in choices:
        raise ValueError("%s %r is not one of %s" % (name, v, ", ".join(choices)))
    return v


def _int_list(name: str, v: object, lo: int, hi: int) -> _t.List[int]:
    """A list, tuple or 1-D integer numpy array of ints in [lo, hi]."""
    if isinstance(v, _np.ndarray):
        if v.ndim != 1 or v.dtype.kind not in "iu":
            raise TypeError("%s must be a 1-D array of integers, not %d-D %s" % (name, v.ndim, v.dtype))
        v = v.tolist()
    if isinstance(v, (str, bytes, bytearray)) or not isinstance(v, _abc.Sequence):
        raise TypeError("%s must be a list of ints, not %s" % (name, type(v).__name__))
    return [_int("%s[%d]" % (name, i), x, lo, hi) for i, x in enumerate(v)]


@_dataclass
class Completion:
    """One generated continuation."""
    ids: _t.List[int]              # generated token ids (an eos id, when one ended it, included)
    text: _t.Optional[str]         # their text; None when the model has no tokenizer.json
    finish_reason: str             # "stop" (an eos id) or "length" (max_tokens)
    prompt_tokens: int             # tokens of the prompt
    steps: int                     # verify steps it took part in
    accepted: int                  # drafts accepted over those steps


@_dataclass
class CacheStats:
    """The prefix cache and the KV page pool of an engine (sparkmono_cache_stats)."""
    queries: int                   # prompt tokens looked up in the prefix cache (prefills with it on)
    hits: int                      # of them, tokens served by cached pages (not computed)
    computed: int                  # prompt tokens prefilled (computed), cache on or off
    pages: int                     # KV pages of the pool (16 tokens each)
    pages_used: int                # held by live requests (shared pages once)
    pages_cached: int              # holding a cached prompt prefix no live request holds (evictable)
    pages_free: int                # neither
    enabled: bool                  # the prefix cache is on


class Model:
    """A checkpoint directory opened read-only (config.json + safetensors, and tokenizer.json
    when present).  online_mxfp4 rounds BF16 experts of layers 1..L-2 to MXFP4 at load;
    activations ("auto", "mxfp4" or "bf16") are those of the MXFP4 experts' matmuls: auto as
    the checkpoint declares (W4A4 when its quantization_config declares MXFP4 input tensors,
    and with online_mxfp4; else W4A16), or forced (sparkmono_model_opts.activations)."""

    def __init__(self, path: _t.Union[str, "_os.PathLike[str]"], online_mxfp4: bool = False,
                 activations: str = "auto") -> None:
        self._h: _t.Optional[_ctypes.c_void_p] = None
        self._tok: _t.Optional[_ctypes.c_void_p] = None
        self._engines = 0
        self._constraints: "_weakref.WeakSet[Constraint]" = _weakref.WeakSet()  # released before the model closes
        if not isinstance(path, (str, _os.PathLike)):
            raise TypeError("path must be a str or os.PathLike, not %s" % type(path).__name__)
        if not isinstance(online_mxfp4, bool):
            raise TypeError("online_mxfp4 must be a bool, not %s" % type(online_mxfp4).__name__)
        self.activations: str = _choice("activations", activations, ("auto", "mxfp4", "bf16"))
        self.path: str = _os.fspath(path)
        h = _ctypes.c_void_p()
        opts = _lib.ModelOpts(int(online_mxfp4), self.activations.encode())
        _check(_lib.model_open(self.path.encode(), _ctypes.byref(opts), _ctypes.byref(h)))
        self._h = h
        info = _lib.ModelInfo()
        _check(_lib.model_get_info(h, _ctypes.byref(info)))
        self.num_layers: int = info.num_layers
        self.hidden_size: int = info.hidden_size
        self.vocab_size: int = info.vocab_size
        self.vocab_used: int = info.vocab_used
        self.bos: _t.Optional[int] = info.bos if info.bos >= 0 else None
        self.eos: _t.Tuple[int, ...] = tuple(info.eos[i] for i in range(info.n_eos))
        tj = _os.path.join(self.path, "tokenizer.json")
        if _os.path.isfile(tj):
            t, err = _ctypes.c_void_p(), _lib.Err()
            if _lib.tok_load(tj.encode(), _ctypes.byref(t), _ctypes.byref(err)):
                self.close()
                raise SparkmonoError(_SM_E_MODEL, err.msg.decode("utf-8", "replace"))
            self._tok = t

    @property
    def has_tokenizer(self) -> bool:
        return self._tok is not None

    def _need_tok(self) -> None:
        if self._tok is None:
            raise SparkmonoError(_SM_E_INVALID, "%s has no tokenizer.json: use token ids" % self.path)
        if self._h is None:
            raise SparkmonoError(_SM_E_INVALID, "the model is closed")

    def encode(self, text: str) -> _t.List[int]:
        """Token ids of text (special tokens in it are recognized)."""
        if not isinstance(text, str):
            raise TypeError("text must be a str, not %s" % type(text).__name__)
        self._need_tok()
        b = text.encode("utf-8")
        ids, n, err = _lib.c_int_p(), _ctypes.c_int(), _lib.Err()
        if _lib.tok_encode(self._tok, b, len(b), _ctypes.byref(ids), _ctypes.byref(n), _ctypes.byref(err)):
            raise SparkmonoError(_SM_E_INVALID, err.msg.decode("utf-8", "replace"))
        try:
            return ids[:n.value]
        finally:
            _lib.libc_free(ids)

    def decode(self, ids: _t.Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ids; bytes that are not valid UTF-8 (a character cut at the end) become U+FFFD.
        Special tokens (bos, eos, ...) are left out unless skip_special_tokens is False (the
        `tokenizers` library's rule)."""
        ids = _int_list("ids", ids, 0, self.vocab_size - 1)
        if not isinstance(skip_special_tokens, bool):
            raise TypeError("skip_special_tokens must be a bool, not %s" % type(skip_special_tokens).__name__)
        self._need_tok()
        if skip_special_tokens:
            ids = [i for i in ids if not _lib.tok_is_special(self._tok, i)]
        arr = (_ctypes.c_int * max(len(ids), 1))(*ids)
        txt, n, err = _ctypes.POINTER(_ctypes.c_char)(), _ctypes.c_size_t(), _lib.Err()
        if _lib.tok_decode(self._tok, arr, len(ids), _ctypes.byref(txt), _ctypes.byref(n), _ctypes.byref(err)):
            raise SparkmonoError(_SM_E_INVALID, err.msg.decode("utf-8", "replace"))
        try:
            return _ctypes.string_at(txt, n.value).decode("utf-8", "replace")
        finally:
            _lib.libc_free(txt)

    def close(self) -> None:
        """Close the model; its engines must be closed first."""
        if self._engines:
            raise SparkmonoError(_SM_E_STATE, "the model still has %d open engine(s): close them first" % self._engines)
        for c in list(getattr(self, "_constraints", ())):  # they read the model's vocabulary
            c.close()
        if self._tok is not None:
            _lib.tok_free(self._tok)
            self._tok = None
        if self._h is not None:
            _lib.model_close(self._h)
            self._h = None

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_engines", 0) == 0:
            self.close()


def _spec_text(kind: str, spec: object) -> _t.Optional[bytes]:
    """The C spec text of a constraint of kind: a JSON Schema (dict or bool) and a choice (list of
    str) as JSON, a str as its UTF-8 bytes, None as none (json_object)."""
    if kind == "json_object":
        if spec is not None:
            raise ValueError("a json_object constraint takes no spec (got %s)" % type(spec).__name__)
        return None
    if kind == "json_schema" and isinstance(spec, (dict, bool)):
        return _json.dumps(spec, ensure_ascii=False).encode()
    if kind == "choice" and isinstance(spec, (list, tuple)):
        for i, x in enumerate(spec):
            if not isinstance(x, str):
                raise TypeError("choice[%d] must be a str, not %s" % (i, type(x).__name__))
        return _json.dumps(list(spec), ensure_ascii=False).encode()
    if isinstance(spec, str):
        return spec.encode()
    want = {"json_schema": "a dict or its JSON text", "choice": "a list of str"}.get(kind, "a str")
    raise TypeError("the spec of a %s constraint must be %s, not %s" % (kind, want, type(spec).__name__))


class Constraint:
    """A structured output compiled once for a model (include/sparkmono.h: sparkmono_constraint):
    the text a request generates under it is one the constraint accepts.  kind and spec:
    "regex" (a str the whole text fullmatches), "json_schema" (a dict, or its JSON text: compact
    JSON valid under it), "json_object" (spec None: any JSON object), "choice" (a list of str:
    the text is one of them); "grammar" is refused by the engine.  any_whitespace: JSON may have
    whitespace between its tokens (False: compact).  A spec the compiler refuses is a
    SparkmonoValueError with its line.  One Constraint serves any number of requests, calls and
    engines of its model (Engine.generate(..., constraint=c)); the token masks it makes are kept
    with it.  close() (or the model's close) releases it; running requests keep their own
    reference in the engine."""

    def __init__(self, model: "Model", kind: str, spec: object = None, any_whitespace: bool = False) -> None:
        self._h: _t.Optional[_ctypes.c_void_p] = None
        if not isinstance(model, Model):
            raise TypeError("model must be a sparkmono.Model, not %s" % type(model).__name__)
        if model._h is None:
            raise SparkmonoError(_SM_E_INVALID, "the model is closed")
        if not isinstance(kind, str):
            raise TypeError("kind must be a str, not %s" % type(kind).__name__)
        if not isinstance(any_whitespace, bool):
            raise TypeError("any_whitespace must be a bool, not %s" % type(any_whitespace).__name__)
        text = _spec_text(kind, spec)
        h = _ctypes.c_void_p()
        _check(_lib.constraint_create(model._h, kind.encode(), text, len(text) if text is not None else 0,
                                      int(any_whitespace), _ctypes.byref(h)))
        self._h = h
        self.model = model
        self.kind = kind
        self.spec = spec
        self.any_whitespace = any_whitespace
        model._constraints.add(self)

    def _live(self) -> _ctypes.c_void_p:
        if self._h is None:
            raise SparkmonoError(_SM_E_INVALID, "the constraint is closed")
        return self._h

    def close(self) -> None:
        """Release the constraint (requests the engine runs keep their own reference)."""
        if self._h is not None:
            _lib.constraint_release(self._h)
            self._h = None

    def __enter__(self) -> "Constraint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_h", None) is not None:
            self.close()

    def __repr__(self) -> str:
        return "Constraint(%r, %r%s)" % (self.kind, self.spec, ", any_whitespace=True" if self.any_whitespace else "")


class Engine:
    """An engine over a model: request slots, a KV cache and a backend.

    backend: "cpu", or "cuda" (a library built with `make CUDA=1 shared`).  request_rows R:
    rows a request feeds a verify step (its last token + R-1 n-gram drafts; 1 = no
    speculation).  max_requests: requests batched in one step (generate_many).  max_len: prompt
    + generated tokens of a request.  threads: CPU worker threads (None: the online cores).
    prefill_chunk: most prompt rows a step (None: 512).  world: ranks of tensor + expert
    parallelism; with world > 1, moe ("ep": experts split across ranks, "tp": each expert split
    along its width), devices (cuda: the device of each rank, a device listed twice holds
    several ranks) and comm (cuda: "peer" or "nccl").  mono (cuda): "off", "auto" or "on", the
    monokernel for layers 1..L-2 of verify steps.  prefix_cache: the full 16-token pages of
    prompts stay cached and a later prompt beginning with them reuses them (False:
    --no-prefix-cache; cache_stats() counts it).  gpu_memory_utilization (cuda, (0, 1]): the KV
    pool takes the pages that fit in that share of each GPU's memory after the weights (None:
    every request at max_len).  The CLI's flags of the same names (`sparkmono generate --help`,
    `sparkmono serve --help`) say the same."""

    def __init__(self, model: Model, backend: str = "cpu", request_rows: int = 8, max_requests: int = 1,
                 max_len: int = 4096, threads: _t.Optional[int] = None, prefill_chunk: _t.Optional[int] = None,
                 world: int = 1, moe: str = "ep", devices: _t.Optional[_t.Sequence[int]] = None,
                 comm: _t.Optional[str] = None, mono: str = "off", prefix_cache: bool = True,
                 gpu_memory_utilization: _t.Optional[float] = None) -> None:
        self._h: _t.Optional[_ctypes.c_void_p] = None
        # the C engine is used by one thread at a time (include/sparkmono.h): calls from several
        # threads take turns here (ctypes lets go of the GIL inside the library)
        self._lock = _threading.RLock()
        if not isinstance(model, Model):
            raise TypeError("model must be a sparkmono.Model, not %s" % type(model).__name__)
        if model._h is None:
            raise SparkmonoError(_SM_E_INVALID, "the model is closed")
        self.model = model
        self.backend = _choice("backend", backend, ("cpu", "cuda"))
        # 0 would mean "the default" to the engine: here every value is meant, so >= 1
        self.request_rows = _int("request_rows", request_rows, 1, _MAX_INT)
        self.max_requests = _int("max_requests", max_requests, 1, _MAX_INT)
        self.max_len = _int("max_len", max_len, 1, _MAX_INT)
        nthreads = 0 if threads is None else _int("threads", threads, 1, _MAX_INT)
        chunk = 0 if prefill_chunk is None else _int("prefill_chunk", prefill_chunk, 1, _MAX_INT)
        self.world = _int("world", world, 1, _MAX_INT)
        moe_tp = _choice("moe", moe, ("ep", "tp")) == "tp"
        mono = _choice("mono", mono, ("off", "auto", "on"))
        dev = None
        if devices is not None:
            dev = ",".join(map(str, _int_list("devices", devices, 0, _MAX_INT)))
            if len(devices) != self.world:
                raise ValueError("devices lists %d devices: give one a rank (world = %d)" % (len(devices), self.world))
        if comm is not None:
            comm = _choice("comm", comm, ("peer", "nccl"))
        if self.world == 1 and (moe_tp or devices is not None or comm is not None):
            raise ValueError("moe, devices and comm go with world > 1")
        if mono == "on" and self.backend != "cuda":
            raise ValueError("mono 'on' needs backend 'cuda'")
        if not isinstance(prefix_cache, bool):
            raise TypeError("prefix_cache must be a bool, not %s" % type(prefix_cache).__name__)
        self.prefix_cache: bool = prefix_cache
        util = 0.0
        if gpu_memory_utilization is not None:
            if isinstance(gpu_memory_utilization, bool) or not isinstance(gpu_memory_utilization, (int, float)):
                raise TypeError("gpu_memory_utilization must be a number, not %s" % type(gpu_memory_utilization).__name__)
            util = float(gpu_memory_utilization)
            if not 0 < util <= 1:
                raise ValueError("gpu_memory_utilization %g is not in (0, 1]" % util)
            if self.backend != "cuda":
                raise ValueError("gpu_memory_utilization sizes the KV pool of backend 'cuda'")
        o = _lib.EngineOpts(backend=self.backend.encode(), request_rows=self.request_rows,
                            max_requests=self.max_requests, max_len=self.max_len, threads=nthreads,
                            prefill_chunk=chunk, world=self.world, moe_tp=int(moe_tp), mono=mono.encode(),
                            devices=dev.encode() if dev else None, comm=comm.encode() if comm else None,
                            no_prefix_cache=int(not prefix_cache), gpu_memory_utilization=util)
        h = _ctypes.c_void_p()
        _check(_lib.engine_create(model._h, _ctypes.byref(o), _ctypes.byref(h)))
        self._h = h
        model._engines += 1

    def _ids(self, prompt: _Prompt) -> _t.List[int]:
        if isinstance(prompt, str):
            return self.model.encode(prompt)
        ids = _int_list("prompt", prompt, 0, self.model.vocab_size - 1)
        if not ids:
            raise ValueError("the prompt is empty")
        return ids

    def _live(self) -> _ctypes.c_void_p:
        if self._h is None:
            raise SparkmonoError(_SM_E_INVALID, "the engine is closed")
        return self._h

    def generate(self, prompt: _Prompt, max_tokens: int = 16, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, seed: int = 0, **processors: _t.Any) -> Completion:
        """Generate from one prompt (text or ids) until max_tokens or an eos id; the keywords are
        generate_many's (processors, and a constraint: regex=, choice=, json_schema=,
        json_object=True or constraint=)."""
        return self.generate_many([prompt], max_tokens, temperature, top_p, top_k, seed, **processors)[0]

    def generate_many(self, prompts: _t.Sequence[_Prompt], max_tokens: int = 16, temperature: float = 0.0,
                      top_p: float = 1.0, top_k: int = 0, seed: int = 0, *, presence_penalty: float = 0.0,
                      frequency_penalty: float = 0.0, repetition_penalty: float = 1.0, min_tokens: int = 0,
                      ignore_eos: bool = False, min_p: float = 0.0,
                      allowed_token_ids: _t.Optional[_t.Sequence[int]] = None,
                      bad_words: _t.Optional[_t.Sequence[str]] = None, regex: _t.Optional[str] = None,
                      choice: _t.Optional[_t.Sequence[str]] = None,
                      json_schema: _t.Union[None, dict, bool, str] = None, json_object: bool = False,
                      constraint: _t.Optional[Constraint] = None, any_whitespace: bool = False) -> _t.List[Completion]:
        """Generate from every prompt, up to max_requests at once in the same verify steps; a
        prompt joins as soon as another one finishes (continuous batching).  Results are in
        the order of prompts and equal to generating each alone.  The logit processors
        (presence / frequency penalty in [-2, 2], repetition penalty > 0, min_tokens, ignore_eos,
        allowed_token_ids: only these ids, bad_words: strings whose ids are never completed, made
        ids with the model's tokenizer as the server makes them) and min_p (in [0, 1]: sampled ids
        at least min_p times the likeliest one's probability) are the engine's (include/sparkmono.h:
        sparkmono_sampling), with the server's argument rules.  At most one of regex,
        choice, json_schema, json_object=True and constraint constrains every prompt's text
        (any_whitespace: JSON with whitespace, for json_schema and json_object); a constraint
        given by keyword is compiled for this call (a Constraint object is compiled once)."""
        self._live()
        if isinstance(prompts, (str, bytes, bytearray)) or not isinstance(prompts, _abc.Sequence):
            raise TypeError("prompts must be a list of prompts, not %s" % type(prompts).__name__)
        # the server's rules (src/serve/serve_api.c): temperature in [0, 2], top_p in (0, 1],
        # top_k -1 or 0 no limit, min_tokens at most max_tokens
        max_tokens = _int("max_tokens", max_tokens, 1, _MAX_INT)
        top_p = _real("top_p", top_p, 0.0, 1.0)
        if top_p <= 0:
            raise ValueError("top_p = %r must be greater than 0" % top_p)
        top_k = _int("top_k", top_k, -1, _MAX_INT)
        if _int("min_tokens", min_tokens, 0, _MAX_INT) > max_tokens:
            raise ValueError("min_tokens = %d is more than max_tokens = %d" % (min_tokens, max_tokens))
        s = _lib.Sampling(temperature=_real("temperature", temperature, 0.0, 2.0),
                          top_k=max(top_k, 0), top_p=top_p,
                          seed=_int("seed", seed, 0, 2 ** 64 - 1),
                          presence_penalty=_real("presence_penalty", presence_penalty, -2.0, 2.0),
                          frequency_penalty=_real("frequency_penalty", frequency_penalty, -2.0, 2.0),
                          repetition_penalty=_real("repetition_penalty", repetition_penalty, 1e-6, 1e6),
                          min_tokens=_int("min_tokens", min_tokens, 0, _MAX_INT))
        if not isinstance(ignore_eos, bool):
            raise TypeError("ignore_eos must be a bool, not %s" % type(ignore_eos).__name__)
        s.ignore_eos = int(ignore_eos)
        s.min_p = _real("min_p", min_p, 0.0, 1.0)
        if allowed_token_ids is not None:
            allowed = _int_list("allowed_token_ids", allowed_token_ids, 0, self.model.vocab_size - 1)
            if not allowed or len(allowed) > _lib.MAX_ALLOWED_IDS:
                raise ValueError("allowed_token_ids has %d ids: give 1 to %d (an empty list would allow no token)"
                                 % (len(allowed), _lib.MAX_ALLOWED_IDS))
            s.n_allowed_ids = len(allowed)
            s.allowed_ids[:len(allowed)] = allowed
        if bad_words is not None:
            self._bad_words(bad_words, s)
        todo = [self._ids(p) for p in prompts]
        con, owned = self._constraint(regex, choice, json_schema, json_object, constraint, any_whitespace)
        try:
            s.constraint = con._live().value if con is not None else None
            with self._lock:
                return self._run_many(todo, max_tokens, s)
        finally:
            if owned:
                con.close()

    def _bad_words(self, words: object, s: "_lib.Sampling") -> None:
        """words (a list of str) into s's bad words, tokenized by the library as the server does."""
        if isinstance(words, (str, bytes, bytearray)) or not isinstance(words, _abc.Sequence):
            raise TypeError("bad_words must be a list of str, not %s" % type(words).__name__)
        for i, w in enumerate(words):
            if not isinstance(w, str):
                raise TypeError("bad_words[%d] must be a str, not %s" % (i, type(w).__name__))
        if len(words) > _lib.MAX_BAD_WORDS:
            raise ValueError("bad_words has %d words; at most %d are allowed" % (len(words), _lib.MAX_BAD_WORDS))
        if not words:
            return
        if self.model._tok is None:
            raise SparkmonoValueError(_SM_E_INVALID, "bad_words needs text, and %s has no tokenizer.json" % self.model.path)
        b = [w.encode("utf-8") for w in words]
        arr, lens, err = (_ctypes.c_char_p * len(b))(*b), (_ctypes.c_size_t * len(b))(*map(len, b)), _lib.Err()
        if _lib.lp_bad_words(self.model._tok, arr, lens, len(b), self.model.vocab_size, _ctypes.byref(s),
                             _ctypes.byref(err)):
            raise SparkmonoValueError(_SM_E_INVALID, "bad_words: " + err.msg.decode("utf-8", "replace"))

    def _constraint(self, regex: object, choice: object, json_schema: object, json_object: object,
                    constraint: object, any_whitespace: object) -> _t.Tuple[_t.Optional[Constraint], bool]:
        """The constraint generate_many's keywords ask for (or None), and whether it is this call's own."""
        if not isinstance(json_object, bool):
            raise TypeError("json_object must be a bool, not %s" % type(json_object).__name__)
        if not isinstance(any_whitespace, bool):
            raise TypeError("any_whitespace must be a bool, not %s" % type(any_whitespace).__name__)
        given = [(k, v) for k, v in (("regex", regex), ("choice", choice), ("json_schema", json_schema),
                                     ("constraint", constraint)) if v is not None]
        if json_object:
            given.append(("json_object", None))
        if len(given) > 1:
            raise ValueError("%s: give at most one constraint" % " and ".join(k for k, _ in given))
        if not given:
            if any_whitespace:
                raise ValueError("any_whitespace goes with json_schema= or json_object=")
            return None, False
        kind, spec = given[0]
        if kind == "constraint":
            if not isinstance(constraint, Constraint):
                raise TypeError("constraint must be a sparkmono.Constraint, not %s" % type(constraint).__name__)
            if constraint.model is not self.model:
                raise ValueError("the constraint was compiled for another model")
            if any_whitespace:
                raise ValueError("any_whitespace goes with json_schema= or json_object= (a Constraint has its own)")
            constraint._live()
            return constraint, False
        if any_whitespace and kind not in ("json_schema", "json_object"):
            raise ValueError("any_whitespace goes with json_schema= or json_object=, not %s=" % kind)
        return Constraint(self.model, kind, spec, any_whitespace), True

    def _run_many(self, todo: _t.List[_t.List[int]], max_tokens: int, s: "_lib.Sampling") -> _t.List[Completion]:
        h = self._live()  # closed by another thread meanwhile: an error, not a crash
        out: _t.List[_t.Optional[Completion]] = [None] * len(todo)
        ids: _t.List[_t.List[int]] = [[] for _ in todo]
        b = _ctypes.c_void_p()
        _check(_lib.batch_create(h, -1, _ctypes.byref(b)))
        try:
            index = {}  # batch request id -> index into prompts
            for i, p in enumerate(todo):
                rid, arr = _ctypes.c_longlong(), (_ctypes.c_int * len(p))(*p)
                _check(_lib.batch_submit(b, arr, len(p), max_tokens, _ctypes.byref(s), None, _ctypes.byref(rid)))
                index[rid.value] = i
            ev, nev, live, queued = _ctypes.POINTER(_lib.BatchEvent)(), _ctypes.c_int(), _ctypes.c_int(), _ctypes.c_int()
            while True:
                _lib.batch_counts(b, _ctypes.byref(live), _ctypes.byref(queued))
                if live.value == 0 and queued.value == 0:
                    break
                _check(_lib.batch_step(b, _ctypes.byref(ev), _ctypes.byref(nev)))
                for k in range(nev.value):
                    e = ev[k]
                    i = index[e.id]
                    ids[i] += e.ids[:e.n]
                    if e.done in (_BATCH_EOS, _BATCH_LENGTH):
                        text = self.model.decode(ids[i]) if self.model.has_tokenizer else None
                        out[i] = Completion(ids[i], text, "stop" if e.done == _BATCH_EOS else "length", e.prompt_len,
                                            e.steps, e.accepted)
                    elif e.done:  # failed in the engine
                        raise SparkmonoError(_SM_E_BACKEND, e.err.decode("utf-8", "replace"))
        finally:
            _lib.batch_destroy(b)  # an error: the engine is left empty
        return _t.cast(_t.List[Completion], out)

    def prefill_logits(self, prompt: _Prompt) -> "_np.ndarray":
        """The f32 logits [n, vocab_size] of a prefill of the prompt (softcapped; ids >=
        vocab_used are -inf), as a numpy array."""
        self._live()
        ids = self._ids(prompt)
        req = _ctypes.c_int(-1)
        arr = (_ctypes.c_int * len(ids))(*ids)
        with self._lock:
            h = self._live()
            _check(_lib.add_sampled(h, arr, len(ids), 0, _ctypes.byref(_lib.Sampling()), _ctypes.byref(req)))
            try:
                out = _np.empty((len(ids), self.model.vocab_size), dtype=_np.float32)
                _check(_lib.prefill(h, req.value, out.ctypes.data_as(_ctypes.POINTER(_ctypes.c_float))))
                return out
            finally:
                _lib.remove(h, req.value)

    def cache_stats(self) -> CacheStats:
        """The prefix cache's counters (prompt tokens looked up, served from cached pages,
        computed) and the KV page pool now (pages, used, cached, free)."""
        c = _lib.CacheStats()
        with self._lock:
            _check(_lib.cache_stats_get(self._live(), _ctypes.byref(c)))
        return CacheStats(c.queries, c.hits, c.computed, c.pages, c.pages_used, c.pages_cached, c.pages_free,
                          bool(c.enabled))

    def close(self) -> None:
        with self._lock:
            if self._h is not None:
                _lib.engine_destroy(self._h)
                self._h = None
                self.model._engines -= 1

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_h", None) is not None:
            self.close()
