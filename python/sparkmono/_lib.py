"""_lib.py: finds and loads libsparkmono.so and declares the C functions the binding calls
(include/sparkmono.h, and src/model/tokenizer.h for text), each with its argument and result types.

The library is the first of: $SPARKMONO_LIB; libsparkmono.so beside this file (copied there by
`pip install ./python`); build/libsparkmono.so of the source tree this file sits in.  We
rejected searching the system's library path: a stale copy there would be used silently."""
import ctypes
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def _candidates():
    env = os.environ.get("SPARKMONO_LIB")
    if env:
        return [env]
    return [os.path.join(_HERE, "libsparkmono.so"), os.path.join(_HERE, "..", "..", "build", "libsparkmono.so")]


def _load():
    tried = _candidates()
    for path in tried:
        if os.path.isfile(path):
            return ctypes.CDLL(os.path.abspath(path)), path
    raise ImportError("sparkmono: libsparkmono.so not found (tried %s); build it with `make shared` and set "
                      "SPARKMONO_LIB to its path, or `pip install ./python` after `make shared`" % ", ".join(tried))


lib, path = _load()

c_int_p = ctypes.POINTER(ctypes.c_int)


class ModelOpts(ctypes.Structure):
    _fields_ = [("online_mxfp4", ctypes.c_int), ("activations", ctypes.c_char_p)]


class ModelInfo(ctypes.Structure):
    _fields_ = [("num_layers", ctypes.c_int), ("hidden_size", ctypes.c_int), ("vocab_size", ctypes.c_int),
                ("vocab_used", ctypes.c_int), ("bos", ctypes.c_int), ("n_eos", ctypes.c_int),
                ("eos", ctypes.c_int * 8)]


class EngineOpts(ctypes.Structure):
    _fields_ = [("backend", ctypes.c_char_p), ("request_rows", ctypes.c_int), ("max_requests", ctypes.c_int),
                ("max_len", ctypes.c_int), ("kv_blocks", ctypes.c_int), ("prefill_chunk", ctypes.c_int),
                ("naux", ctypes.c_int), ("aux_layers", c_int_p), ("threads", ctypes.c_int), ("world", ctypes.c_int),
                ("moe_tp", ctypes.c_int), ("mono", ctypes.c_char_p),
                ("devices", ctypes.c_char_p), ("comm", ctypes.c_char_p), ("no_prefix_cache", ctypes.c_int),
                ("gpu_memory_utilization", ctypes.c_float)]


class CacheStats(ctypes.Structure):
    """sparkmono_cache_stats of include/sparkmono.h."""
    _fields_ = [("queries", ctypes.c_longlong), ("hits", ctypes.c_longlong), ("computed", ctypes.c_longlong),
                ("pages", ctypes.c_int), ("pages_used", ctypes.c_int), ("pages_cached", ctypes.c_int),
                ("pages_free", ctypes.c_int), ("enabled", ctypes.c_int)]


MAX_BIAS = 300      # SPARKMONO_MAX_BIAS
MAX_STOP_IDS = 32   # SPARKMONO_MAX_STOP_IDS
MAX_ALLOWED_IDS = 1024   # SPARKMONO_MAX_ALLOWED_IDS
MAX_BAD_WORDS = 64       # SPARKMONO_MAX_BAD_WORDS
MAX_BAD_WORD_IDS = 512   # SPARKMONO_MAX_BAD_WORD_IDS


class Bias(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("bias", ctypes.c_float)]


class Sampling(ctypes.Structure):
    _fields_ = [("temperature", ctypes.c_float), ("top_k", ctypes.c_int), ("top_p", ctypes.c_float),
                ("seed", ctypes.c_ulonglong), ("presence_penalty", ctypes.c_float),
                ("frequency_penalty", ctypes.c_float), ("repetition_penalty", ctypes.c_float),
                ("min_tokens", ctypes.c_int), ("ignore_eos", ctypes.c_int), ("n_bias", ctypes.c_int),
                ("bias", Bias * MAX_BIAS), ("n_stop_ids", ctypes.c_int), ("stop_ids", ctypes.c_int * MAX_STOP_IDS),
                ("logprobs", ctypes.c_int), ("top_logprobs", ctypes.c_int), ("prompt_logprobs", ctypes.c_int),
                ("constraint", ctypes.c_void_p), ("min_p", ctypes.c_float), ("n_allowed_ids", ctypes.c_int),
                ("allowed_ids", ctypes.c_int * MAX_ALLOWED_IDS), ("n_bad_words", ctypes.c_int),
                ("bad_word_len", ctypes.c_int * MAX_BAD_WORDS), ("bad_word_ids", ctypes.c_int * MAX_BAD_WORD_IDS)]


class RequestInfo(ctypes.Structure):
    _fields_ = [("prompt_len", ctypes.c_int), ("max_tokens", ctypes.c_int), ("ngen", ctypes.c_int),
                ("kv_len", ctypes.c_int), ("prefilled", ctypes.c_int), ("done", ctypes.c_int),
                ("steps", ctypes.c_int), ("accepted", ctypes.c_int)]


class BatchEvent(ctypes.Structure):
    """sparkmono_batch_event of include/sparkmono.h."""
    _fields_ = [("id", ctypes.c_longlong), ("user", ctypes.c_void_p), ("ids", c_int_p), ("n", ctypes.c_int),
                ("ngen", ctypes.c_int), ("done", ctypes.c_int), ("prompt_len", ctypes.c_int), ("steps", ctypes.c_int),
                ("accepted", ctypes.c_int), ("err", ctypes.c_char_p), ("logprobs", ctypes.POINTER(ctypes.c_float)),
                ("top_ids", c_int_p), ("top_lp", ctypes.POINTER(ctypes.c_float)), ("top", ctypes.c_int),
                ("prompt_lp", ctypes.POINTER(ctypes.c_float)), ("prompt_top_ids", c_int_p),
                ("prompt_top_lp", ctypes.POINTER(ctypes.c_float)), ("prompt_rank", c_int_p)]


class Err(ctypes.Structure):
    """sm_err of src/base/err.h: one line."""
    _fields_ = [("msg", ctypes.c_char * 1024)]


def _fn(name, res, *args):
    f = getattr(lib, name)
    f.restype = res
    f.argtypes = list(args)
    return f


vp = ctypes.c_void_p
errmsg = _fn("sparkmono_errmsg", ctypes.c_char_p)
status_str = _fn("sparkmono_status_str", ctypes.c_char_p, ctypes.c_int)
model_open = _fn("sparkmono_model_open", ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ModelOpts), ctypes.POINTER(vp))
model_close = _fn("sparkmono_model_close", None, vp)
model_get_info = _fn("sparkmono_model_get_info", ctypes.c_int, vp, ctypes.POINTER(ModelInfo))
engine_create = _fn("sparkmono_engine_create", ctypes.c_int, vp, ctypes.POINTER(EngineOpts), ctypes.POINTER(vp))
engine_destroy = _fn("sparkmono_engine_destroy", None, vp)
add_sampled = _fn("sparkmono_add_sampled", ctypes.c_int, vp, c_int_p, ctypes.c_int, ctypes.c_int,
                  ctypes.POINTER(Sampling), c_int_p)
remove = _fn("sparkmono_remove", ctypes.c_int, vp, ctypes.c_int)
prefill = _fn("sparkmono_prefill", ctypes.c_int, vp, ctypes.c_int, ctypes.POINTER(ctypes.c_float))
verify = _fn("sparkmono_verify", ctypes.c_int, vp, c_int_p, c_int_p, c_int_p)
request_get_info = _fn("sparkmono_request_get_info", ctypes.c_int, vp, ctypes.c_int, ctypes.POINTER(RequestInfo))
output = _fn("sparkmono_output", ctypes.c_int, vp, ctypes.c_int, ctypes.POINTER(c_int_p), c_int_p)
version = _fn("sparkmono_version", ctypes.c_char_p)
try:
    struct_size = _fn("sparkmono_struct_size", ctypes.c_size_t, ctypes.c_char_p)
except AttributeError:
    raise ImportError("sparkmono: the library %s does not export sparkmono_struct_size: it is older than this "
                      "package (rebuild it with `make shared`)" % path) from None
# the structs above mirror include/sparkmono.h: a library whose layout differs is refused here,
# not misread later
for _name, _cls in (("sparkmono_model_opts", ModelOpts), ("sparkmono_model_info", ModelInfo),
                    ("sparkmono_engine_opts", EngineOpts), ("sparkmono_bias", Bias), ("sparkmono_sampling", Sampling),
                    ("sparkmono_request_info", RequestInfo), ("sparkmono_batch_event", BatchEvent),
                    ("sparkmono_cache_stats", CacheStats)):
    if struct_size(_name.encode()) != ctypes.sizeof(_cls):
        raise ImportError("sparkmono: the library %s has %s of %d bytes, this package expects %d: the library and "
                          "the package are of different versions" % (path, _name, struct_size(_name.encode()),
                                                                     ctypes.sizeof(_cls)))
cache_stats_get = _fn("sparkmono_cache_stats_get", ctypes.c_int, vp, ctypes.POINTER(CacheStats))
batch_create = _fn("sparkmono_batch_create", ctypes.c_int, vp, ctypes.c_int, ctypes.POINTER(vp))
batch_destroy = _fn("sparkmono_batch_destroy", None, vp)
batch_submit = _fn("sparkmono_batch_submit", ctypes.c_int, vp, c_int_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(Sampling),
                   vp, ctypes.POINTER(ctypes.c_longlong))
batch_step = _fn("sparkmono_batch_step", ctypes.c_int, vp, ctypes.POINTER(ctypes.POINTER(BatchEvent)), c_int_p)
batch_counts = _fn("sparkmono_batch_counts", None, vp, c_int_p, c_int_p)
constraint_create = _fn("sparkmono_constraint_create", ctypes.c_int, vp, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                        ctypes.c_int, ctypes.POINTER(vp))
constraint_release = _fn("sparkmono_constraint_release", None, vp)
tok_load = _fn("sm_tokenizer_load", ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(vp), ctypes.POINTER(Err))
tok_free = _fn("sm_tokenizer_free", None, vp)
tok_encode = _fn("sm_tokenizer_encode", ctypes.c_int, vp, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(c_int_p),
                 c_int_p, ctypes.POINTER(Err))
tok_is_special = _fn("sm_tokenizer_is_special", ctypes.c_int, vp, ctypes.c_int)
# bad words made id sequences as the server makes them (src/engine/logitproc.h)
lp_bad_words = _fn("sm_lp_bad_words", ctypes.c_int, vp, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_size_t),
                   ctypes.c_int, ctypes.c_int, ctypes.POINTER(Sampling), ctypes.POINTER(Err))
c_char_pp = ctypes.POINTER(ctypes.POINTER(ctypes.c_char))  # text out: bytes, may hold NUL
tok_decode = _fn("sm_tokenizer_decode", ctypes.c_int, vp, c_int_p, ctypes.c_int, c_char_pp,
                 ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(Err))
# the tokenizer's buffers are malloc'd by the library: freed with the C library's free
libc_free = _fn("free", None, vp)
