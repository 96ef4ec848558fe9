/*
 * ops.h: op accounting for the engine's tiers.
 *
 * Every op call of a forward pass is counted per (op, tier), and matmuls and
 * embedding lookups also per weight type, so a run can report
 * "matmul_q4_K/cpu": 1792, "rmsnorm/cpu": 577, ... The totals split into
 * device ops (run on a GPU) and host ops (everything on the CPU, ref and cpu
 * tiers alike); ops of the ref tier inside a run of a faster tier are
 * reference-tier hits (a fallback the gate wants to see).
 *
 * The counters are plain integers updated by the thread that dispatches the
 * op (never by pool workers), so no atomics are needed.
 */
#ifndef TG_OPS_H
#define TG_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "quant.h"

enum tg_tier { TG_TIER_REF = 0, TG_TIER_CPU = 1, TG_TIER_GPU = 2, TG_TIER_COUNT = 3 };

enum tg_op {
    TG_OP_EMBED,        /* token embedding row lookup (per weight type) */
    TG_OP_MATMUL,       /* weight x activations (per weight type) */
    TG_OP_QUANTIZE,     /* activation rows to the weights' vec_dot type (per that type) */
    TG_OP_RMSNORM,
    TG_OP_ROPE,
    TG_OP_KV_STORE,     /* append k, v to the cache */
    TG_OP_ATTN,         /* softmax(q k / sqrt(d)) v over the cache */
    TG_OP_SWIGLU,
    TG_OP_ADD,          /* residual add */
    TG_OP_PERTURB,      /* the debug perturbation (load option "perturb") */
    TG_OP_COUNT
};

typedef struct tg_ops {
    uint64_t n[TG_OP_COUNT][TG_TYPE_COUNT][TG_TIER_COUNT];
} tg_ops;

/* Name of a tier: "ref", "cpu", "gpu"; "?" when out of range. */
const char *tg_tier_name(int tier);
/* Parses "ref" | "cpu" | "gpu"; returns the tier or -1. */
int tg_tier_parse(const char *s);

static inline void tg_ops_count(tg_ops *o, enum tg_op op, uint32_t type, enum tg_tier tier)
{
    if (o)
        o->n[op][type < TG_TYPE_COUNT ? type : 0][tier]++;
}

void tg_ops_clear(tg_ops *o);
/* Adds every counter of b into a. */
void tg_ops_merge(tg_ops *a, const tg_ops *b);
/* Totals: ops on the GPU tier, ops on host tiers, and ops of the ref tier
 * when `run_tier` is faster than ref (0 for a ref-tier run). */
uint64_t tg_ops_device(const tg_ops *o);
uint64_t tg_ops_host(const tg_ops *o);
uint64_t tg_ops_ref_hits(const tg_ops *o, enum tg_tier run_tier);

/* Calls fn(name, count, ud) for every nonzero counter, in a fixed order;
 * name is "matmul_q4_K/cpu" for typed ops, "rmsnorm/cpu" otherwise (valid
 * during the call only). */
void tg_ops_foreach(const tg_ops *o, void (*fn)(const char *name, uint64_t count, void *ud), void *ud);

#endif
