/* stock/synth.h: forwards to cuda/rank/synth.h, where the synthetic backend moved with the rank
 * driver; kept only until tests/gpu/model.c and model_engine.c include the new path. */
#include "cuda/rank/synth.h"
