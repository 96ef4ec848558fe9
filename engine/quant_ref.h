/*
 * quant_ref.h: the scalar reference quantizers behind engine/quant.c's
 * faster ones, for the tests that hold the fast ones to the same bytes.
 * Internal to the engine and its tests; nothing else needs it.
 */
#ifndef TG_QUANT_REF_H
#define TG_QUANT_REF_H

#include <stdint.h>

#include "quant.h"

/* Returns the scalar reference quantizer of type: for Q4_K, Q5_K and Q6_K
 * the plain-loop scale search that tg_traits(type)->from_float must match
 * byte for byte, for the other types that from_float itself; NULL when the
 * type has no quantizer. */
tg_from_float_fn tg_from_float_ref(uint32_t type);

#endif
