/*
 * replay_hook.c: the stage replay's record, input and file format (replay_hook.h).
 *
 * Every (layer, stage) slot has a record buffer for all tokens, filled with
 * NaN, so a value a tier never wrote (a position the attention skipped)
 * compares as wrong; the input buffers hold the reference values of the
 * slots the input file has. Hooks touch disjoint ranges from pool threads;
 * the "seen" flags are atomic stores.
 */
#include "replay_hook.h"

#include "quant.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RP_MAGIC "TGRPLAY1"

static const char *const rs_names[TG_RS_COUNT] = {
    "attn_norm", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "q_rope", "k_rope",
    "k_cache", "v_cache", "scores", "attn", "attn_out", "attn_res", "ffn_norm", "gate",
    "up", "swiglu", "ffn_out", "residual", "out_norm", "logits", "embd",
};

const char *tg_rstage_name(int stage)
{
    return tg_name_at(rs_names, TG_RS_COUNT, stage);
}

int tg_rstage_parse(const char *s)
{
    return tg_name_index(rs_names, TG_RS_COUNT, s);
}

struct tg_replay {
    tg_hparams hp;
    int T;
    int n_slots;           /* (n_layer + 1) * TG_RS_COUNT; slot 0..COUNT-1 is layer -1 */
    float **rec;           /* (n_slots) record buffers, NaN-filled */
    float **in;            /* (n_slots) reference values or NULL */
    unsigned char *seen;   /* (n_slots) a hook wrote the slot */
    int n_in;
    tg_replay_num num;
};

int64_t tg_replay_width(const tg_hparams *hp, int stage)
{
    const int64_t E = hp->n_embd, Q = (int64_t)hp->n_head * hp->head_dim,
                  KV = (int64_t)hp->n_head_kv * hp->head_dim, F = hp->n_ff;
    switch (stage) {
    case TG_RS_ATTN_NORM: case TG_RS_ATTN_OUT: case TG_RS_ATTN_RES: case TG_RS_FFN_NORM:
    case TG_RS_FFN_OUT: case TG_RS_RESIDUAL: case TG_RS_OUT_NORM: case TG_RS_EMBD:
        return E;
    case TG_RS_Q_PROJ: case TG_RS_Q_NORM: case TG_RS_Q_ROPE: case TG_RS_ATTN:
        return Q;
    case TG_RS_K_PROJ: case TG_RS_V_PROJ: case TG_RS_K_NORM: case TG_RS_K_ROPE: case TG_RS_K_CACHE:
    case TG_RS_V_CACHE:
        return KV;
    case TG_RS_GATE: case TG_RS_UP: case TG_RS_SWIGLU:
        return F;
    case TG_RS_LOGITS:
        return hp->n_vocab;
    default:
        return 0;
    }
}

/* The stages after the last layer (layer -1). */
static int final_stage(int stage)
{
    return stage == TG_RS_OUT_NORM || stage == TG_RS_LOGITS;
}

/* The logits are kept for the last token only (a row of n_vocab for every
 * token would be large); the final norm has a row for every token, filled
 * where an evaluation's last token computed it (NaN elsewhere). */
static int last_only(int stage)
{
    return stage == TG_RS_LOGITS;
}

/* Floats of a slot's buffer. */
static int64_t slot_n(const tg_replay *r, int stage)
{
    if (stage == TG_RS_SCORES)
        return (int64_t)r->hp.n_head * r->T * (r->T + 1) / 2;
    return last_only(stage) ? tg_replay_width(&r->hp, stage) : (int64_t)r->T * tg_replay_width(&r->hp, stage);
}

static int slot_of(const tg_replay *r, int layer, int stage)
{
    if (layer < -1 || layer >= r->hp.n_layer || stage < 0 || stage >= TG_RS_COUNT)
        return -1;
    if ((layer == -1) != final_stage(stage) || (stage == TG_RS_EMBD && layer != 0))
        return -1;
    return (layer + 1) * TG_RS_COUNT + stage;
}

void tg_replay_free(tg_replay *r)
{
    if (!r)
        return;
    for (int i = 0; r->rec && i < r->n_slots; i++)
        free(r->rec[i]);
    for (int i = 0; r->in && i < r->n_slots; i++)
        free(r->in[i]);
    free(r->rec);
    free(r->in);
    free(r->seen);
    free(r);
}

static int rd(FILE *f, void *p, size_t n)
{
    return fread(p, 1, n, f) == n ? 0 : -1;
}

FILE *tg_rfile_open(const char *path, const char *what, uint32_t h[8], tg_err *e)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        tg_errf(e, "%s %s: cannot open: %s", what, path, strerror(errno));
        return NULL;
    }
    char magic[8];
    if (rd(f, magic, 8) || memcmp(magic, RP_MAGIC, 8) != 0 || rd(f, h, 8 * sizeof *h)) {
        fclose(f);
        tg_errf(e, "%s %s: not a replay file (expected the magic %s and an 8-word header)", what, path, RP_MAGIC);
        return NULL;
    }
    return f;
}

int tg_rfile_read(FILE *f, const char *path, const char *what, tg_rfile_dest_fn dest, void *ud, tg_err *e)
{
    tg_err why = {{0}};
    for (;;) {
        int32_t ls[2];
        uint64_t n;
        size_t got = fread(ls, 1, sizeof ls, f);
        if (got == 0 && feof(f))
            break;
        if (got != sizeof ls || rd(f, &n, sizeof n)) {
            fclose(f);
            return tg_errf(e, "%s %s: truncated record header", what, path);
        }
        float *x = dest(ud, ls[0], ls[1], n, &why);
        if (!x) {
            fclose(f);
            return tg_errf(e, "%s %s: %s", what, path, why.msg);
        }
        if (rd(f, x, (size_t)n * sizeof(float))) {
            fclose(f);
            return tg_errf(e, "%s %s: truncated record (layer %d stage %s)", what, path, ls[0],
                           tg_rstage_name(ls[1]));
        }
    }
    fclose(f);
    return 0;
}

FILE *tg_rfile_create(const char *path, const char *what, const uint32_t h[8], tg_err *e)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        tg_errf(e, "%s %s: cannot create: %s", what, path, strerror(errno));
        return NULL;
    }
    if (fwrite(RP_MAGIC, 1, 8, f) != 8 || fwrite(h, 8 * sizeof *h, 1, f) != 1) {
        fclose(f);
        tg_errf(e, "%s %s: write failed", what, path);
        return NULL;
    }
    return f;
}

int tg_rfile_put(FILE *f, int layer, int stage, const float *x, uint64_t n)
{
    const int32_t ls[2] = {layer, stage};
    return fwrite(ls, sizeof ls, 1, f) == 1 && fwrite(&n, sizeof n, 1, f) == 1 &&
           fwrite(x, sizeof(float), (size_t)n, f) == (size_t)n;
}

/* The file header of r's model and token count. */
static void file_header(const tg_replay *r, uint32_t h[8])
{
    const tg_hparams *hp = &r->hp;
    const uint32_t v[8] = {(uint32_t)hp->n_layer, (uint32_t)hp->n_embd, (uint32_t)hp->n_head,
                           (uint32_t)hp->n_head_kv, (uint32_t)hp->head_dim, (uint32_t)hp->n_ff,
                           (uint32_t)hp->n_vocab, (uint32_t)r->T};
    memcpy(h, v, sizeof v);
}

/* tg_rfile_dest_fn of the input: the slot's input buffer, once, of the slot's size. */
static float *input_dest(void *ud, int layer, int stage, uint64_t n, tg_err *e)
{
    tg_replay *r = ud;
    int slot = slot_of(r, layer, stage);
    if (slot < 0 || (int64_t)n != slot_n(r, stage) || r->in[slot]) {
        tg_errf(e, "record layer %d stage %d with %llu values: %s", layer, stage, (unsigned long long)n,
                slot < 0 ? "no such layer and stage" : r->in[slot] ? "given twice" : "wrong size");
        return NULL;
    }
    r->in[slot] = malloc((size_t)n * sizeof(float));
    if (!r->in[slot]) {
        tg_errf(e, "out of memory");
        return NULL;
    }
    r->n_in++;
    return r->in[slot];
}

/* Reads path's records into r->in. Returns 0 or -1 with e. */
static int read_input(tg_replay *r, const char *path, tg_err *e)
{
    uint32_t h[8], want[8];
    FILE *f = tg_rfile_open(path, "replay input", h, e);
    if (!f)
        return -1;
    file_header(r, want);
    static const char *const hn[8] = {"n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "n_ff", "n_vocab",
                                      "n_tokens"};
    for (int i = 0; i < 8; i++)
        if (h[i] != want[i]) {
            fclose(f);
            return tg_errf(e, "replay input %s: header %s is %u, expected %u (this model and prompt)", path, hn[i],
                           h[i], want[i]);
        }
    return tg_rfile_read(f, path, "replay input", input_dest, r, e);
}

int tg_replay_new(tg_replay **out, const tg_model *m, int n_tokens, const char *in_path, tg_err *e)
{
    *out = NULL;
    if (n_tokens < 1)
        return tg_errf(e, "replay: expected at least one token");
    tg_replay *r = calloc(1, sizeof *r);
    if (!r)
        return tg_errf(e, "replay: out of memory");
    r->hp = m->hp;
    r->T = n_tokens;
    r->n_slots = (m->hp.n_layer + 1) * TG_RS_COUNT;
    r->rec = calloc((size_t)r->n_slots, sizeof *r->rec);
    r->in = calloc((size_t)r->n_slots, sizeof *r->in);
    r->seen = calloc((size_t)r->n_slots, 1);
    if (!r->rec || !r->in || !r->seen) {
        tg_replay_free(r);
        return tg_errf(e, "replay: out of memory");
    }
    for (int layer = -1; layer < m->hp.n_layer; layer++)
        for (int st = 0; st < TG_RS_COUNT; st++) {
            int slot = slot_of(r, layer, st);
            if (slot < 0)
                continue;
            int64_t n = slot_n(r, st);
            float *b = malloc((size_t)n * sizeof(float));
            if (!b) {
                tg_replay_free(r);
                return tg_errf(e, "replay: out of memory for %d tokens", n_tokens);
            }
            for (int64_t i = 0; i < n; i++)
                b[i] = NAN;
            r->rec[slot] = b;
        }
    if (in_path && read_input(r, in_path, e) != 0) {
        tg_replay_free(r);
        return -1;
    }
    *out = r;
    return 0;
}

tg_replay_num *tg_replay_numerics(tg_replay *r)
{
    return &r->num;
}

int tg_replay_n_tokens(const tg_replay *r)
{
    return r->T;
}

int tg_replay_n_overwritten(const tg_replay *r)
{
    return r->n_in;
}

int tg_replay_write(const tg_replay *r, const char *path, tg_err *e)
{
    uint32_t h[8];
    file_header(r, h);
    FILE *f = tg_rfile_create(path, "replay record", h, e);
    if (!f)
        return -1;
    int ok = 1, n_rec = 0;
    const int n_layer = r->hp.n_layer;
    for (int layer = 0; layer <= n_layer && ok; layer++) {
        int lay = layer == n_layer ? -1 : layer;   /* layer -1 last, in forward order */
        for (int st = 0; st < TG_RS_COUNT && ok; st++) {
            int slot = slot_of(r, lay, st);
            if (slot < 0 || !r->seen[slot])
                continue;
            ok = tg_rfile_put(f, lay, st, r->rec[slot], (uint64_t)slot_n(r, st));
            n_rec++;
        }
    }
    if (fclose(f) != 0 || !ok)
        return tg_errf(e, "replay record %s: write failed", path);
    return n_rec;
}

/* The offset of token pos's row in a slot, or -1 when pos is not replayed. */
static int64_t row_off(const tg_replay *r, int stage, int pos)
{
    if (pos < 0 || pos >= r->T)
        return -1;
    if (last_only(stage))
        return pos == r->T - 1 ? 0 : -1;
    return (int64_t)pos * tg_replay_width(&r->hp, stage);
}

void tg_replay_rows(tg_replay *r, int layer, int stage, int pos0, int nb, void *x, int f64, int64_t stride,
                    int64_t c0, int64_t c1)
{
    int slot = slot_of(r, layer, stage);
    if (slot < 0 || stage == TG_RS_SCORES)
        return;
    __atomic_store_n(&r->seen[slot], 1, __ATOMIC_RELAXED);
    const float *in = r->in[slot];
    for (int b = 0; b < nb; b++) {
        int64_t off = row_off(r, stage, pos0 + b);
        if (off < 0)
            continue;
        float *rec = r->rec[slot] + off;
        if (f64) {
            /* the ref tier's f64 rows: recorded as f32, overwritten with the f32 reference */
            double *row = (double *)x + (int64_t)b * stride;
            for (int64_t i = c0; i < c1; i++)
                rec[i] = (float)row[i];
            for (int64_t i = c0; in && !isnan(in[off + c0]) && i < c1; i++)
                row[i] = (double)in[off + i];
        } else {
            float *row = (float *)x + (int64_t)b * stride;
            memcpy(rec + c0, row + c0, (size_t)(c1 - c0) * sizeof(float));
            if (in && !isnan(in[off + c0]))   /* a final norm the reference did not compute there: keep */
                memcpy(row + c0, in + off + c0, (size_t)(c1 - c0) * sizeof(float));
        }
    }
}

/* Offset of (pos, head, j) in the scores slot, or -1. */
static int64_t score_off(const tg_replay *r, int pos, int head, int j)
{
    if (pos < 0 || pos >= r->T || head < 0 || head >= r->hp.n_head || j < 0)
        return -1;
    return (int64_t)r->hp.n_head * pos * (pos + 1) / 2 + (int64_t)head * (pos + 1) + (j <= pos ? j : pos);
}

double tg_replay_score(tg_replay *r, int layer, int pos, int head, int j, double v)
{
    int slot = slot_of(r, layer, TG_RS_SCORES);
    int64_t off = slot < 0 ? -1 : score_off(r, pos, head, j);
    if (off < 0)
        return v;
    __atomic_store_n(&r->seen[slot], 1, __ATOMIC_RELAXED);
    if (j > pos) {
        // a position after the token's own: the mask is wrong; make it show
        r->rec[slot][off] = NAN;
        return v;
    }
    r->rec[slot][off] = (float)v;
    return r->in[slot] ? (double)r->in[slot][off] : v;
}

/* f64 values of the ref tier stay f32 values after a perturbation. */
static double s_round(double v)
{
    return (double)(float)v;
}

double tg_pert_value(const tg_opts *o, double v, int pos, int64_t col)
{
    switch (o->pert_kind) {
    case 1:
        return tg_bf16_to_f32(tg_f32_to_bf16((float)v));
    case 2:
        return tg_half_to_f32(tg_f32_to_half((float)v));
    case 3:
        return v * (1.0 + o->pert_eps);
    case 4: {
        // splitmix64 of (pos, col): u uniform in [-sqrt 3, sqrt 3) (unit variance)
        uint64_t z = ((uint64_t)(uint32_t)pos << 32 ^ (uint64_t)col) + 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        double u = ((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0) * 1.7320508075688772;
        return v * (1.0 + o->pert_eps * u);
    }
    case 5:
        return 0.0;
    default:
        return v;
    }
}

void tg_pert_rows(const tg_opts *o, int pos0, int nb, void *x, int f64, int64_t stride, int64_t c0, int64_t c1)
{
    for (int b = 0; b < nb; b++)
        for (int64_t i = c0; i < c1; i++) {
            const int64_t k = (int64_t)b * stride + i;
            if (f64)
                ((double *)x)[k] = s_round(tg_pert_value(o, ((double *)x)[k], pos0 + b, i));
            else
                ((float *)x)[k] = (float)tg_pert_value(o, ((float *)x)[k], pos0 + b, i);
        }
}
