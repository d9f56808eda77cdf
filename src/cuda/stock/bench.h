/* stock/bench.h: forwards to cuda/bench/bench.h, where the bench hooks moved; kept only until
 * tests/gpu/model.c and model_engine.c include the new path. */
#include "cuda/bench/bench.h"
