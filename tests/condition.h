/* condition.h: make a loaded random model well conditioned for whole-model comparisons between
 * implementations (CPU world vs one rank, GPU vs CPU), as trained models are.
 *
 * A random model is chaotic: its N(0, 0.5) residual gates replace most of the stream every
 * layer, its router's top-K margins are ~1e-3, and the QK-normed attention (scores of std ~5)
 * multiplies relative differences by ~5-10 per layer.  One bf16 rounding that moves between two
 * correct implementations then grows to tens of percent of the logits after 4 layers, and
 * discrete choices within noise of a tie (routes, argmaxes) flip.  Two changes fix that without
 * touching any code path: residual-dominant gates (g in [-1.2, -0.45]: beta = sigmoid(g / 0.3)
 * in [0.02, 0.18], alpha ~ 1) and a router correction bias scaled so routing margins are wide.
 * Only the loaded model's precomputed alpha/beta vectors and bias pointers change (the bias
 * copies are owned by the caller: free *bias_out). */
#ifndef SM_TEST_CONDITION_H
#define SM_TEST_CONDITION_H
#include <stdint.h>
#include <stdlib.h>
#include "model/codec.h"
#include "model/weights.h"

static inline void residual_dominant(sm_model *m, uint64_t seed) {
    int H = m->cfg.H;
    uint16_t *g = malloc(sizeof(uint16_t) * (size_t)H);
    if (!g) return;
    for (int l = 0; l < m->cfg.L; l++)
        for (int which = 0; which < 2; which++) {
            for (int x = 0; x < H; x++) {
                seed ^= seed << 13; seed ^= seed >> 7; seed ^= seed << 17;
                g[x] = sm_f32_to_bf16(-0.45f - 0.75f * (float)(seed % 1000) / 1000.0f);
            }
            sm_layer *Ly = &m->layers[l];
            sm_residual_gate(g, H, m->cfg.gate_temp, which ? Ly->ffn_alpha : Ly->att_alpha, which ? Ly->ffn_beta : Ly->att_beta);
        }
    free(g);
}

/* Multiply every layer's router correction bias by scale (into a new [L, E] buffer). */
static inline int separate_routing(sm_model *m, float scale, float **bias_out) {
    int L = m->cfg.L, E = m->cfg.E;
    float *b = malloc(sizeof(float) * (size_t)L * E);
    *bias_out = b;
    if (!b) return -1;
    for (int l = 0; l < L; l++) {
        for (int x = 0; x < E; x++) b[(size_t)l * E + x] = m->layers[l].router_bias[x] * scale;
        m->layers[l].router_bias = b + (size_t)l * E;
    }
    return 0;
}

#endif
