/*
 * ops.c: op counters of the engine's tiers (see ops.h): names, totals and
 * the walk that the worker turns into the protocol's "counters" object.
 */
#include "ops.h"

#include <stdio.h>
#include <string.h>

static const char *const op_names[TG_OP_COUNT] = {
    [TG_OP_EMBED] = "embed", [TG_OP_MATMUL] = "matmul", [TG_OP_QUANTIZE] = "quantize",
    [TG_OP_RMSNORM] = "rmsnorm", [TG_OP_ROPE] = "rope", [TG_OP_KV_STORE] = "kv_store",
    [TG_OP_ATTN] = "attn", [TG_OP_SWIGLU] = "swiglu", [TG_OP_ADD] = "add",
    [TG_OP_PERTURB] = "perturb",
};

/* Ops whose name carries the weight (or activation) type. */
static int op_typed(int op)
{
    return op == TG_OP_EMBED || op == TG_OP_MATMUL || op == TG_OP_QUANTIZE;
}

const char *tg_tier_name(int tier)
{
    switch (tier) {
    case TG_TIER_REF: return "ref";
    case TG_TIER_CPU: return "cpu";
    case TG_TIER_GPU: return "gpu";
    default: return "?";
    }
}

int tg_tier_parse(const char *s)
{
    for (int t = 0; t < TG_TIER_COUNT; t++)
        if (s && strcmp(s, tg_tier_name(t)) == 0)
            return t;
    return -1;
}

void tg_ops_clear(tg_ops *o)
{
    memset(o, 0, sizeof *o);
}

void tg_ops_merge(tg_ops *a, const tg_ops *b)
{
    for (int op = 0; op < TG_OP_COUNT; op++)
        for (int ty = 0; ty < TG_TYPE_COUNT; ty++)
            for (int t = 0; t < TG_TIER_COUNT; t++)
                a->n[op][ty][t] += b->n[op][ty][t];
}

static uint64_t tier_total(const tg_ops *o, int tier)
{
    uint64_t s = 0;
    for (int op = 0; op < TG_OP_COUNT; op++)
        for (int ty = 0; ty < TG_TYPE_COUNT; ty++)
            s += o->n[op][ty][tier];
    return s;
}

uint64_t tg_ops_device(const tg_ops *o)
{
    return tier_total(o, TG_TIER_GPU);
}

uint64_t tg_ops_host(const tg_ops *o)
{
    return tier_total(o, TG_TIER_REF) + tier_total(o, TG_TIER_CPU);
}

uint64_t tg_ops_ref_hits(const tg_ops *o, enum tg_tier run_tier)
{
    return run_tier == TG_TIER_REF ? 0 : tier_total(o, TG_TIER_REF);
}

void tg_ops_foreach(const tg_ops *o, void (*fn)(const char *name, uint64_t count, void *ud), void *ud)
{
    char name[64];
    for (int op = 0; op < TG_OP_COUNT; op++)
        for (int ty = 0; ty < TG_TYPE_COUNT; ty++)
            for (int t = 0; t < TG_TIER_COUNT; t++) {
                uint64_t c = o->n[op][ty][t];
                if (!c)
                    continue;
                if (op_typed(op))
                    snprintf(name, sizeof name, "%s_%s/%s", op_names[op], tg_type_name((uint32_t)ty),
                             tg_tier_name(t));
                else
                    snprintf(name, sizeof name, "%s/%s", op_names[op], tg_tier_name(t));
                fn(name, c, ud);
            }
}
