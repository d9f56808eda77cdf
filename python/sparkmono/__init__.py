"""sparkmono: the Python binding of the sparkmono decode engine (ctypes over libsparkmono.so).

    import sparkmono
    model = sparkmono.Model("build/models/tiny")          # + tokenizer.json when the dir has one
    engine = sparkmono.Engine(model, request_rows=8, max_requests=4)
    out = engine.generate([5, 6, 7], max_tokens=16)      # or a text prompt, with a tokenizer
    out.ids, out.text, out.finish_reason                  # text is None without a tokenizer
    outs = engine.generate_many([[5, 6], [7, 8, 9]], max_tokens=8)   # batched, continuous
    logits = engine.prefill_logits([5, 6, 7])             # numpy float32 [3, vocab_size]

Every failure of the engine raises SparkmonoError carrying the engine's one-line message
(sparkmono_errmsg) and its status.  Generation is greedy unless temperature > 0; sampled draws
depend on (seed, position) only, so a request's output does not depend on what it is batched
with.  An Engine is used by one thread at a time (as the C API).  We rejected a C extension
module: ctypes needs no compiler at install, and the C API is small and stable.
"""
import ctypes
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

import numpy as np

from . import _lib

__all__ = ["Model", "Engine", "Completion", "SparkmonoError", "library_path"]

library_path = _lib.path  # the libsparkmono.so in use


class SparkmonoError(Exception):
    """An engine call failed: .status is the sm_status code, .status_name its name, and the
    message is the engine's one line."""

    def __init__(self, status: int, message: str):
        self.status = status
        self.status_name = _lib.status_str(status).decode()
        self.message = message
        super().__init__(message or self.status_name)


def _check(status: int) -> None:
    if status != 0:
        raise SparkmonoError(status, _lib.errmsg().decode("utf-8", "replace"))


_SM_E_INVALID, _SM_E_MODEL = 1, 2


@dataclass
class Completion:
    """One generated continuation."""
    ids: List[int]                 # generated token ids (an eos id, when one ended it, included)
    text: Optional[str]            # their text; None when the model has no tokenizer.json
    finish_reason: str             # "stop" (an eos id) or "length" (max_tokens)
    prompt_tokens: int             # tokens of the prompt
    steps: int                     # verify steps it took part in
    accepted: int                  # drafts accepted over those steps


class Model:
    """A checkpoint directory opened read-only (config.json + safetensors, and tokenizer.json
    when present)."""

    def __init__(self, path: str, online_mxfp4: bool = False):
        self._h = None
        self._tok = None
        self._engines = 0
        self.path = os.fspath(path)
        h = ctypes.c_void_p()
        _check(_lib.model_open(self.path.encode(), ctypes.byref(_lib.ModelOpts(int(online_mxfp4))), ctypes.byref(h)))
        self._h = h
        info = _lib.ModelInfo()
        _check(_lib.model_get_info(h, ctypes.byref(info)))
        self.num_layers = info.num_layers
        self.hidden_size = info.hidden_size
        self.vocab_size = info.vocab_size
        self.vocab_used = info.vocab_used
        self.bos = info.bos if info.bos >= 0 else None
        self.eos = tuple(info.eos[i] for i in range(info.n_eos))
        tj = os.path.join(self.path, "tokenizer.json")
        if os.path.isfile(tj):
            t, err = ctypes.c_void_p(), _lib.Err()
            if _lib.tok_load(tj.encode(), ctypes.byref(t), ctypes.byref(err)):
                self.close()
                raise SparkmonoError(_SM_E_MODEL, err.msg.decode("utf-8", "replace"))
            self._tok = t

    @property
    def has_tokenizer(self) -> bool:
        return self._tok is not None

    def _need_tok(self):
        if self._tok is None:
            raise SparkmonoError(_SM_E_INVALID, "%s has no tokenizer.json: use token ids" % self.path)
        if self._h is None:
            raise SparkmonoError(_SM_E_INVALID, "the model is closed")

    def encode(self, text: str) -> List[int]:
        """Token ids of text (special tokens in it are recognized)."""
        self._need_tok()
        b = text.encode("utf-8")
        ids, n, err = _lib.c_int_p(), ctypes.c_int(), _lib.Err()
        if _lib.tok_encode(self._tok, b, len(b), ctypes.byref(ids), ctypes.byref(n), ctypes.byref(err)):
            raise SparkmonoError(_SM_E_INVALID, err.msg.decode("utf-8", "replace"))
        try:
            return ids[:n.value]
        finally:
            _lib.libc_free(ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ids; bytes that are not valid UTF-8 (a character cut at the end) become U+FFFD.
        Special tokens (bos, eos, ...) are left out unless skip_special_tokens is False (the
        `tokenizers` library's rule)."""
        self._need_tok()
        if skip_special_tokens:
            ids = [i for i in ids if not _lib.tok_is_special(self._tok, int(i))]
        arr = (ctypes.c_int * max(len(ids), 1))(*ids)
        txt, n, err = ctypes.POINTER(ctypes.c_char)(), ctypes.c_size_t(), _lib.Err()
        if _lib.tok_decode(self._tok, arr, len(ids), ctypes.byref(txt), ctypes.byref(n), ctypes.byref(err)):
            raise SparkmonoError(_SM_E_INVALID, err.msg.decode("utf-8", "replace"))
        try:
            return ctypes.string_at(txt, n.value).decode("utf-8", "replace")
        finally:
            _lib.libc_free(txt)

    def close(self) -> None:
        """Close the model; its engines must be closed first."""
        if self._engines:
            raise SparkmonoError(6, "the model still has %d open engine(s): close them first" % self._engines)
        if self._tok is not None:
            _lib.tok_free(self._tok)
            self._tok = None
        if self._h is not None:
            _lib.model_close(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_engines", 0) == 0:
            self.close()


Prompt = Union[str, Sequence[int]]


class Engine:
    """An engine over a model: request slots, a KV cache and a backend ("cpu" in this build).
    request_rows R: rows a request feeds a verify step (its last token + R-1 n-gram drafts;
    1 = no speculation).  max_requests: requests batched in one step (generate_many)."""

    def __init__(self, model: Model, backend: str = "cpu", request_rows: int = 8, max_requests: int = 1,
                 max_len: int = 4096, threads: int = 0, prefill_chunk: int = 0):
        if model._h is None:
            raise SparkmonoError(_SM_E_INVALID, "the model is closed")
        self._h = None
        self.model = model
        self.request_rows = request_rows or 8
        self.max_requests = max_requests or 1
        self.max_len = max_len
        o = _lib.EngineOpts(backend=backend.encode(), request_rows=request_rows, max_requests=max_requests,
                            max_len=max_len, threads=threads, prefill_chunk=prefill_chunk)
        h = ctypes.c_void_p()
        _check(_lib.engine_create(model._h, ctypes.byref(o), ctypes.byref(h)))
        self._h = h
        model._engines += 1

    def _ids(self, prompt: Prompt) -> List[int]:
        if isinstance(prompt, str):
            return self.model.encode(prompt)
        ids = [int(x) for x in prompt]
        if not ids:
            raise SparkmonoError(_SM_E_INVALID, "the prompt is empty")
        return ids

    def _add(self, ids: List[int], max_tokens: int, sampling: "_lib.Sampling") -> int:
        if self._h is None:
            raise SparkmonoError(_SM_E_INVALID, "the engine is closed")
        req = ctypes.c_int(-1)
        arr = (ctypes.c_int * len(ids))(*ids)
        _check(_lib.add_sampled(self._h, arr, len(ids), max_tokens, ctypes.byref(sampling), ctypes.byref(req)))
        return req.value

    def _finish(self, req: int) -> Completion:
        """The completion of a finished request; the request is removed."""
        info = _lib.RequestInfo()
        _check(_lib.request_get_info(self._h, req, ctypes.byref(info)))
        p, n = _lib.c_int_p(), ctypes.c_int()
        _check(_lib.output(self._h, req, ctypes.byref(p), ctypes.byref(n)))
        ids = p[:n.value]
        _check(_lib.remove(self._h, req))
        text = self.model.decode(ids) if self.model.has_tokenizer else None
        return Completion(ids, text, "stop" if info.done == 1 else "length", info.prompt_len, info.steps, info.accepted)

    def _done(self, req: int) -> bool:
        info = _lib.RequestInfo()
        _check(_lib.request_get_info(self._h, req, ctypes.byref(info)))
        return info.done != 0

    def generate(self, prompt: Prompt, max_tokens: int = 16, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, seed: int = 0) -> Completion:
        """Generate from one prompt (text or ids) until max_tokens or an eos id."""
        return self.generate_many([prompt], max_tokens, temperature, top_p, top_k, seed)[0]

    def generate_many(self, prompts: Sequence[Prompt], max_tokens: int = 16, temperature: float = 0.0,
                      top_p: float = 1.0, top_k: int = 0, seed: int = 0) -> List[Completion]:
        """Generate from every prompt, up to max_requests at once in the same verify steps; a
        prompt joins as soon as another one finishes (continuous batching).  Results are in
        the order of prompts and equal to generating each alone."""
        if max_tokens < 1:
            raise SparkmonoError(_SM_E_INVALID, "max_tokens %d is less than 1" % max_tokens)
        s = _lib.Sampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed & (2 ** 64 - 1))
        todo = [self._ids(p) for p in prompts]
        out: List[Optional[Completion]] = [None] * len(todo)
        live = {}  # request id -> index into prompts
        nxt = 0
        ntok = (ctypes.c_int * self.max_requests)()
        toks = (ctypes.c_int * (self.max_requests * self.request_rows))()
        nreq = ctypes.c_int()
        try:
            while nxt < len(todo) or live:
                while nxt < len(todo) and len(live) < self.max_requests:
                    req = self._add(todo[nxt], max_tokens, s)
                    live[req] = nxt
                    nxt += 1
                    _check(_lib.prefill(self._h, req, None))  # emits the first token
                if live:
                    _check(_lib.verify(self._h, ntok, toks, ctypes.byref(nreq)))
                for req in [r for r in live if self._done(r)]:
                    out[live.pop(req)] = self._finish(req)
        finally:
            for req in live:  # an error: leave the engine empty
                _lib.remove(self._h, req)
        return out

    def prefill_logits(self, prompt: Prompt) -> np.ndarray:
        """The f32 logits [n, vocab_size] of a prefill of the prompt (softcapped; ids >=
        vocab_used are -inf), as a numpy array."""
        ids = self._ids(prompt)
        req = self._add(ids, 0, _lib.Sampling())
        try:
            out = np.empty((len(ids), self.model.vocab_size), dtype=np.float32)
            _check(_lib.prefill(self._h, req, out.ctypes.data_as(ctypes.POINTER(ctypes.c_float))))
            return out
        finally:
            _lib.remove(self._h, req)

    def close(self) -> None:
        if self._h is not None:
            _lib.engine_destroy(self._h)
            self._h = None
            self.model._engines -= 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_h", None) is not None:
            self.close()
