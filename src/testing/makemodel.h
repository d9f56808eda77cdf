/* makemodel.h: random checkpoints in the real tensor names (docs/model.md section 2), for tests and
 * benchmarks.  Deterministic per seed: every tensor is generated from (seed, tensor name) alone,
 * so any tensor can be regenerated without the others, and the writer streams (a spark1x
 * checkpoint is never held in memory).  Magnitudes are realistic (DESIGN.md "Numbers"):
 * matrices ~ N(0, 1/fan_in) in bf16, norm gains small around 0 (effective weights near 1),
 * residual gates ~ N(0, 0.5), router bias ~ N(0, 0.01), embedding rows of RMS ~ 1.
 * The directory is written under a temporary name and renamed when complete; a failure or an
 * interruption (the `stop` flag) removes it.  Beside config.json it gets a tokenizer.json: a
 * byte-level BPE learned from a small built-in English text (sm_tokenizer_write_trained) with
 * the config's pad, bos and eos ids as the special tokens <|pad|>, <|bos|>, <|eos|> (<|eos_1|>
 * ...) and every other id below vocab_used (none when the 256 byte tokens do not fit).
 *
 * Cycle models (cycle = N): a random model whose greedy output walks a cycle of N ids, so the
 * n-gram drafter's drafts are accepted (a demonstration of speculative decoding).  The cycle is
 * the N smallest ids below vocab_used that are not bos, eos or pad (sm_make_cycle_ids), in
 * increasing order.  Two changes to the random model make it so: residual gates ~ N(-1, 0.1),
 * so every layer keeps ~97% of the residual stream (beta = sigmoid(g / 0.3) ~ 0.03) and the
 * final hidden state stays close to the normalized embedding of the current token t; and
 * lm_head row next(t) = 32 / H * (normalized embedding row of t).  The raw logit of the
 * cycle's next id is then about 32, that of the other cycle ids ~ N(0, 32^2 / H), and that of
 * every other id ~ N(0, 1/256): their rows are scaled down to N(0, 1 / (256 H)), so a token
 * outside the cycle is (almost always) followed by a cycle id.
 * Everything else, and every tensor name, shape and dtype, is as in the random model. */
#ifndef SM_MAKEMODEL_H
#define SM_MAKEMODEL_H
#include <signal.h>
#include <stdint.h>
#include "model/config.h"
#include "model/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sm_make_opts {
    sm_expert_fmt experts;   /* format of the experts of every layer but those that keep BF16
                                (sm_layer_keeps_bf16: 0 and L-1), which stay BF16 consolidated */
    uint64_t seed;
    int shards;              /* 1: model.safetensors; K > 1: K shards + index.json */
    int progress;            /* progress line on stderr for anything over a second */
    int threads;             /* generation workers; 0 = online cores, at least 2 (the bytes
                                do not depend on it) */
    int cycle;               /* 0: the random model; N >= 2: a cycle model (above) */
    sm_acts activations;     /* with MXFP4 experts, the quantization_config config.json declares:
                                AUTO none (loads as W4A16); MXFP4 Quark's W4A4 (fp4 weights and
                                dynamic fp4 input tensors per 32 values, the BF16 layers and the
                                non-expert modules excluded: sm_quant_quark_json); BF16 Quark's
                                weight-only (input_tensors null: W4A16) */
    volatile sig_atomic_t *stop; /* NULL, or a flag (set by a signal handler): when it becomes
                                non-zero the write stops, the temporary directory is removed
                                and sm_make_model fails ("interrupted") */
} sm_make_opts;

#define SM_MAKE_MAX_CYCLE 65536

int sm_make_model(const sm_config *c, const sm_make_opts *o, const char *outdir, sm_err *e);
/* The ids of a cycle of n (2..SM_MAKE_MAX_CYCLE) into ids [n]: the n smallest ids below
 * vocab_used that are not bos, eos or pad.  Error when there are not n of them. */
int sm_make_cycle_ids(const sm_config *c, int n, int *ids, sm_err *e);
/* dir/tokenizer_config.json: bos_token (NULL: none), eos_token and a chat template over them
 * (src/testing/chatconfig.c); make-model writes it with every tokenizer.json. */
int sm_make_chat_config(const char *dir, const char *bos, const char *eos, sm_err *e);

#ifdef __cplusplus
}
#endif
#endif
