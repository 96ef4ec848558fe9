/*
 * tokenizer.c: byte-level BPE that gives llama.cpp's ids for a GGUF vocab.
 *
 * Pipeline of tg_tokenize(), each step as llama.cpp's llama-vocab.cpp and
 * unicode.cpp do it (facts read there; the code is ours):
 *
 * 1. Special-token partition. Tokens whose attributes are CONTROL,
 *    USER_DEFINED or UNKNOWN, longest text first, cut the raw text: each one
 *    in turn is searched (left to right, non-overlapping) in every fragment
 *    still raw. With parse_special off, CONTROL and UNKNOWN tokens are
 *    skipped but USER_DEFINED ones still cut. Equal lengths are taken in id
 *    order (llama.cpp's std::sort leaves their order unspecified).
 * 2. Each raw fragment is decoded to code points the lenient way llama.cpp
 *    does: a byte that does not start a well-formed sequence becomes U+FFFD
 *    and decoding resumes at the next byte; overlong forms and surrogates are
 *    accepted as the values they encode. The pieces are re-encoded from those
 *    code points, so an invalid byte turns into EF BF BD.
 * 3. Split with PCRE2 (UTF, UCP, JIT) using the pre-tokenizer's regex with
 *    llama.cpp's own whitespace set spelled out instead of \s (its hand-made
 *    splitters use a fixed set: \t \n \v \f \r, space, U+0085, U+00A0,
 *    U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000) and the
 *    contractions spelled case by case ('s 'S, not (?i) which would also take
 *    U+017F). For gpt-2 an extra final "\s+" stands for llama.cpp's rule that
 *    a code point no alternative matches is a piece of its own.
 *    Letters and numbers are \p{L} and \p{N} of PCRE2's Unicode tables; a
 *    probe of every code point against llama.cpp's tables found one range
 *    that differs (Kaktovik numerals), added to the number class by hand. A
 *    PCRE2 or llama.cpp with another Unicode version may differ elsewhere.
 * 4. Every piece is mapped byte by byte through the GPT-2 byte-to-unicode
 *    table and merged by BPE: the adjacent pair of lowest merge rank first,
 *    the leftmost among equal ranks, until no pair has a rank. llama3 first
 *    looks the whole piece up in the vocabulary (ignore_merges). A final
 *    symbol that is not a token falls back to its single bytes that are.
 *
 * Strings (token texts, merge parts, merge results) are interned into one
 * table: a token's string id is its token id (the last one for duplicate
 * texts, as llama.cpp's token_to_id map), other strings get ids from n_vocab
 * on. Merges are a hash from a pair of string ids to (rank, result id), so
 * BPE never touches a string. A word cache (piece bytes -> ids) behind a
 * mutex saves BPE on repeated words.
 */
#include "tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* llama.cpp token attributes (llama.h enum llama_token_attr). */
enum {
    ATTR_UNDEFINED = 0, ATTR_UNKNOWN = 1 << 0, ATTR_UNUSED = 1 << 1, ATTR_NORMAL = 1 << 2,
    ATTR_CONTROL = 1 << 3, ATTR_USER_DEFINED = 1 << 4, ATTR_BYTE = 1 << 5,
};

enum pre_type { PRE_QWEN2, PRE_LLAMA3, PRE_GPT2 };

/* Whitespace as llama.cpp's splitters see it (unicode_set_whitespace). */
#define WS "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define CONTRACTIONS_CI "'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"

/* Numbers: PCRE2's \p{N} plus the Kaktovik numerals (U+1D2C0..U+1D2D3, No
 * since Unicode 15), the only code points whose class differs between
 * Debian 12's PCRE2 and llama.cpp's tables (found by tokenizing every code
 * point in context with both). */
#define NUM "\\p{N}\\x{1D2C0}-\\x{1D2D3}"

static const char RX_QWEN2[] =
    "(?:" CONTRACTIONS_CI ")|[^\\r\\n\\p{L}" NUM "]?\\p{L}+|[" NUM "]| ?[^" WS "\\p{L}" NUM "]+[\\r\\n]*|"
    "[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+";
static const char RX_LLAMA3[] =
    "(?:" CONTRACTIONS_CI ")|[^\\r\\n\\p{L}" NUM "]?\\p{L}+|[" NUM "]{1,3}| ?[^" WS "\\p{L}" NUM "]+[\\r\\n]*|"
    "[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+";
static const char RX_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?[" NUM "]+| ?[^" WS "\\p{L}" NUM "]+|[" WS "]+(?![^" WS "])|[" WS "]+";

/* One interned string: bytes at pool + off. */
typedef struct str_ref {
    uint32_t off;
    uint32_t len;
} str_ref;

typedef struct merge_slot {
    uint64_t key;       /* (left sid << 32) | right sid; UINT64_MAX when empty */
    int32_t rank;
    int32_t result;     /* sid of left+right */
} merge_slot;

/* Word cache entry: piece bytes -> ids, all in one malloc'ed block. */
typedef struct cache_slot {
    uint64_t hash;
    uint32_t len;       /* bytes of the piece */
    uint32_t n;         /* ids */
    char *data;         /* piece bytes, then n int32 ids (aligned); NULL when empty */
} cache_slot;

#define CACHE_SLOTS 65536       /* power of two; cleared when a quarter full */
#define CACHE_MAX_PIECE 64      /* longer pieces are not cached */

struct tg_tokenizer {
    int32_t n_vocab;
    char *pool;               /* every interned string, back to back */
    size_t pool_len, pool_cap;
    str_ref *strs;            /* (n_strs) by string id; [0, n_vocab) are the tokens */
    int32_t n_strs, cap_strs;
    int32_t *str_hash;        /* (str_hash_cap) open addressing: sid or -1 */
    uint32_t str_hash_cap;
    uint8_t *attr;            /* (n_vocab) ATTR_* bits */
    char *pieces;             /* detokenized piece of each token (special rendering) */
    uint32_t *piece_off;      /* (n_vocab + 1) */
    merge_slot *merges;       /* (merge_cap) */
    uint32_t merge_cap;
    int32_t byte_sid[256];    /* sid of the GPT-2 char of each byte, or -1 */
    char byte_enc[256][3];    /* GPT-2 char of each byte, UTF-8, NUL padded */
    uint8_t byte_enc_len[256];
    int32_t *special;         /* (n_special) cut order for the partition */
    int32_t n_special;
    enum pre_type pre;
    int ignore_merges, clean_spaces, add_bos, add_eos;
    int32_t bos, eos;
    pcre2_code *re;
    pthread_mutex_t cache_mu;
    cache_slot *cache;        /* (CACHE_SLOTS) */
    uint32_t cache_used;
};

/* ---------------------------------------------------------------- utf-8 */

/* Decodes one code point at s[*off] the way llama.cpp's
 * unicode_cpt_from_utf8 does; on a malformed sequence returns U+FFFD and
 * advances by one byte. May return values above U+10FFFF (F5..F7 leads). */
static uint32_t utf8_next(const uint8_t *s, size_t n, size_t *off)
{
    size_t i = *off;
    uint8_t c = s[i];
    if (!(c & 0x80)) { *off = i + 1; return c; }
    if (!(c & 0x40)) goto bad;
    if (!(c & 0x20)) {
        if (i + 1 >= n || (s[i + 1] & 0xc0) != 0x80) goto bad;
        *off = i + 2;
        return ((uint32_t)(c & 0x1f) << 6) | (s[i + 1] & 0x3f);
    }
    if (!(c & 0x10)) {
        if (i + 2 >= n || (s[i + 1] & 0xc0) != 0x80 || (s[i + 2] & 0xc0) != 0x80) goto bad;
        *off = i + 3;
        return ((uint32_t)(c & 0x0f) << 12) | ((uint32_t)(s[i + 1] & 0x3f) << 6) | (s[i + 2] & 0x3f);
    }
    if (!(c & 0x08)) {
        if (i + 3 >= n || (s[i + 1] & 0xc0) != 0x80 || (s[i + 2] & 0xc0) != 0x80 ||
            (s[i + 3] & 0xc0) != 0x80)
            goto bad;
        *off = i + 4;
        return ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3f) << 12) |
               ((uint32_t)(s[i + 2] & 0x3f) << 6) | (s[i + 3] & 0x3f);
    }
bad:
    *off = i + 1;
    return 0xFFFD;
}

/* Writes cpt (<= 0x10FFFF; surrogates allowed) as UTF-8; returns the length. */
static int utf8_put(uint32_t cpt, char *o)
{
    if (cpt <= 0x7f) { o[0] = (char)cpt; return 1; }
    if (cpt <= 0x7ff) {
        o[0] = (char)(0xc0 | (cpt >> 6));
        o[1] = (char)(0x80 | (cpt & 0x3f));
        return 2;
    }
    if (cpt <= 0xffff) {
        o[0] = (char)(0xe0 | (cpt >> 12));
        o[1] = (char)(0x80 | ((cpt >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cpt & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cpt >> 18));
    o[1] = (char)(0x80 | ((cpt >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cpt >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cpt & 0x3f));
    return 4;
}

/* The GPT-2 byte-to-unicode table: printable bytes (! .. ~, ¡ .. ¬, ® .. ÿ)
 * map to the code point of the same value, the other 68 bytes to U+0100
 * onwards in byte order. */
static uint32_t gpt2_byte_cpt(int b, const int *rank_of_unprintable)
{
    int printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
    return printable ? (uint32_t)b : 0x100u + (uint32_t)rank_of_unprintable[b];
}

/* -------------------------------------------------------- string interning */

static uint64_t hash_bytes(const void *p, size_t n) { return XXH3_64bits(p, n); }

/* Id of the interned string (p, n), or -1. */
static int32_t str_find(const tg_tokenizer *t, const char *p, size_t n)
{
    uint32_t mask = t->str_hash_cap - 1;
    for (uint32_t h = (uint32_t)hash_bytes(p, n) & mask;; h = (h + 1) & mask) {
        int32_t sid = t->str_hash[h];
        if (sid < 0) return -1;
        const str_ref *r = &t->strs[sid];
        if (r->len == n && !memcmp(t->pool + r->off, p, n)) return sid;
    }
}

/* Hash slot for (p, n): the slot holding it, or the empty one to fill. */
static uint32_t str_slot(const tg_tokenizer *t, const char *p, size_t n)
{
    uint32_t mask = t->str_hash_cap - 1;
    for (uint32_t h = (uint32_t)hash_bytes(p, n) & mask;; h = (h + 1) & mask) {
        int32_t sid = t->str_hash[h];
        if (sid < 0) return h;
        const str_ref *r = &t->strs[sid];
        if (r->len == n && !memcmp(t->pool + r->off, p, n)) return h;
    }
}

/* Appends a string (a new sid), NUL-terminated in the pool. Returns the sid
 * or -1 on OOM. */
static int32_t str_push(tg_tokenizer *t, const char *p, size_t n)
{
    if (t->pool_len + n + 1 > t->pool_cap) {
        size_t cap = t->pool_cap ? t->pool_cap : 1 << 20;
        while (cap < t->pool_len + n + 1) cap *= 2;
        char *np = realloc(t->pool, cap);
        if (!np) return -1;
        t->pool = np;
        t->pool_cap = cap;
    }
    if (t->n_strs == t->cap_strs) {
        int32_t cap = t->cap_strs ? t->cap_strs * 2 : 1024;
        str_ref *ns = realloc(t->strs, (size_t)cap * sizeof *ns);
        if (!ns) return -1;
        t->strs = ns;
        t->cap_strs = cap;
    }
    memcpy(t->pool + t->pool_len, p, n);
    t->strs[t->n_strs].off = (uint32_t)t->pool_len;
    t->strs[t->n_strs].len = (uint32_t)n;
    t->pool[t->pool_len + n] = 0; /* every string is NUL-terminated too */
    t->pool_len += n + 1;
    return t->n_strs++;
}

/* Interns (p, n) without giving it a token id: returns its existing sid or a
 * new one, or -1 on OOM. The hash must have room (sized at load). */
static int32_t str_intern(tg_tokenizer *t, const char *p, size_t n)
{
    uint32_t h = str_slot(t, p, n);
    if (t->str_hash[h] >= 0) return t->str_hash[h];
    int32_t sid = str_push(t, p, n);
    if (sid >= 0) t->str_hash[h] = sid;
    return sid;
}

/* ------------------------------------------------------------------ merges */

static uint32_t merge_hash(uint64_t key)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (uint32_t)key;
}

/* The merge of (a, b): its slot, or NULL when the pair has no rank. */
static const merge_slot *merge_find(const tg_tokenizer *t, int32_t a, int32_t b)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t mask = t->merge_cap - 1;
    for (uint32_t h = merge_hash(key) & mask;; h = (h + 1) & mask) {
        const merge_slot *m = &t->merges[h];
        if (m->key == key) return m;
        if (m->key == UINT64_MAX) return NULL;
    }
}

/* Adds (a, b) -> rank unless the pair is there already (the first rank
 * wins, as std::map::emplace in llama.cpp). */
static void merge_add(tg_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t result)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t mask = t->merge_cap - 1;
    for (uint32_t h = merge_hash(key) & mask;; h = (h + 1) & mask) {
        merge_slot *m = &t->merges[h];
        if (m->key == key) return;
        if (m->key == UINT64_MAX) {
            m->key = key;
            m->rank = rank;
            m->result = result;
            return;
        }
    }
}

/* ------------------------------------------------------------------- load */

static int streq(gguf_str s, const char *c) { return s.n == strlen(c) && !memcmp(s.p, c, s.n); }

/* Decodes a NORMAL token's text back to bytes (llama_decode_text): each
 * code point that is a GPT-2 char gives its byte; any other gives
 * "[UNK_BYTE_0x<hex>" + the whole text + "]". Appends to *o (cap grown). */
typedef struct buf {
    char *p;
    size_t n, cap;
} buf;

static int buf_put(buf *b, const void *p, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) return -1;
        b->p = np;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

static int decode_token_text(const tg_tokenizer *t, const int *cpt_to_byte, const char *txt, size_t n,
                             buf *o)
{
    size_t off = 0;
    while (off < n) {
        uint32_t cpt = utf8_next((const uint8_t *)txt, n, &off);
        if (cpt < 0x144 && cpt_to_byte[cpt] >= 0) {
            char c = (char)cpt_to_byte[cpt];
            if (buf_put(o, &c, 1)) return -1;
            continue;
        }
        char u[4], hex[40];
        int k = cpt <= 0x10ffff ? utf8_put(cpt, u) : 0;
        int h = snprintf(hex, sizeof hex, "[UNK_BYTE_0x");
        for (int j = 0; j < k; j++) h += snprintf(hex + h, sizeof hex - (size_t)h, "%02x", (uint8_t)u[j]);
        if (buf_put(o, hex, (size_t)h) || buf_put(o, txt, n) || buf_put(o, "]", 1)) return -1;
    }
    (void)t;
    return 0;
}

/* Token-type code (tokenizer.ggml.token_type) -> attributes, as llama.cpp. */
static uint8_t attr_of_type(int32_t ty)
{
    switch (ty) {
    case 1: return ATTR_NORMAL;
    case 2: return ATTR_UNKNOWN;
    case 3: return ATTR_CONTROL;
    case 4: return ATTR_USER_DEFINED;
    case 5: return ATTR_UNUSED;
    case 6: return ATTR_BYTE;
    default: return ATTR_UNDEFINED;
    }
}

/* Texts llama.cpp's loader recognises by name, per special id; a token with
 * one of these texts is made CONTROL when the file does not set that id. */
static const char *const AUTO_EOT[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
    "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
    "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "<end_of_utterance>", NULL};
static const char *const AUTO_EOM[] = {"<|eom_id|>", NULL};
static const char *const AUTO_FIM_PRE[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
    "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<PRE>", "\xe2\x96\x81<PRE>", "<|code_prefix|>",
    "<|prefix|>", NULL};
static const char *const AUTO_FIM_SUF[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
    "<\xef\xbd\x9c" "fim\xe2\x96\x81hole\xef\xbd\x9c>", "<SUF>", "\xe2\x96\x81<SUF>", "<|code_suffix|>",
    "<|suffix|>", NULL};
static const char *const AUTO_FIM_MID[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
    "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", "<MID>", "\xe2\x96\x81<MID>", "<|code_middle|>",
    "<|middle|>", NULL};
static const char *const AUTO_FIM_PAD[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
static const char *const AUTO_FIM_REP[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
    "<reponame>", NULL};
static const char *const AUTO_FIM_SEP[] = {"<|file_sep|>", NULL};
static const char *const AUTO_EOG[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",
    "<|flush|>", "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>",
    "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "[e~[", NULL};

static int32_t text_id(const tg_tokenizer *t, const char *s)
{
    int32_t sid = str_find(t, s, strlen(s));
    return sid >= 0 && sid < t->n_vocab ? sid : -1;
}

/* The attribute fix-ups of llama.cpp's vocab loader that change how tokens
 * are cut or rendered. */
static void fix_attrs(tg_tokenizer *t, const gguf *g)
{
    static const struct { const char *key; const char *const *texts; } autos[] = {
        {"tokenizer.ggml.eot_token_id", AUTO_EOT}, {"tokenizer.ggml.eom_token_id", AUTO_EOM},
        {"tokenizer.ggml.fim_pre_token_id", AUTO_FIM_PRE}, {"tokenizer.ggml.fim_suf_token_id", AUTO_FIM_SUF},
        {"tokenizer.ggml.fim_mid_token_id", AUTO_FIM_MID}, {"tokenizer.ggml.fim_pad_token_id", AUTO_FIM_PAD},
        {"tokenizer.ggml.fim_rep_token_id", AUTO_FIM_REP}, {"tokenizer.ggml.fim_sep_token_id", AUTO_FIM_SEP},
    };
    static const char *const deprecated[] = {NULL, NULL, "tokenizer.ggml.prefix_token_id",
        "tokenizer.ggml.suffix_token_id", "tokenizer.ggml.middle_token_id", NULL, NULL, NULL};
    for (size_t a = 0; a < sizeof autos / sizeof autos[0]; a++) {
        uint32_t v;
        if (!gguf_get_u32(g, autos[a].key, &v, NULL) && v < (uint32_t)t->n_vocab) continue;
        if (deprecated[a] && !gguf_get_u32(g, deprecated[a], &v, NULL) && v < (uint32_t)t->n_vocab) continue;
        /* the first candidate found (llama.cpp: in hash-map order; here: lowest id) */
        int32_t best = -1;
        for (const char *const *s = autos[a].texts; *s; s++) {
            int32_t id = text_id(t, *s);
            if (id >= 0 && (best < 0 || id < best)) best = id;
        }
        if (best >= 0) t->attr[best] |= ATTR_CONTROL;
    }
    /* control tokens named "unused" are unused too */
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!(t->attr[id] & ATTR_CONTROL)) continue;
        const str_ref *r = &t->strs[id];
        if (memmem(t->pool + r->off, r->len, "unused", 6) && str_find(t, t->pool + r->off, r->len) == id)
            t->attr[id] |= ATTR_UNUSED;
    }
    for (const char *const *s = AUTO_EOG; *s; s++) {
        int32_t id = text_id(t, *s);
        if (id >= 0) t->attr[id] |= ATTR_CONTROL;
    }
    static const char *const always_render[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"};
    for (size_t i = 0; i < 4; i++) {
        int32_t id = text_id(t, always_render[i]);
        if (id >= 0) t->attr[id] = ATTR_USER_DEFINED;
    }
    int32_t end = text_id(t, "<|end|>");
    if (end >= 0 && ((text_id(t, "<|return|>") >= 0 && text_id(t, "<|call|>") >= 0) ||
                     (text_id(t, "<|calls|>") >= 0 && text_id(t, "<|flush|>") >= 0)))
        t->attr[end] = ATTR_USER_DEFINED;
    int32_t s_end = text_id(t, "</s>");
    if (s_end >= 0 && text_id(t, "<|tool_response>") >= 0) t->attr[s_end] = ATTR_NORMAL;
}

static int cmp_special(const void *a, const void *b, void *arg)
{
    const tg_tokenizer *t = arg;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = t->strs[x].len, ly = t->strs[y].len;
    if (lx != ly) return lx > ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

int tg_tokenizer_from_gguf(tg_tokenizer **out, const gguf *g, tg_err *e)
{
    const char *path = gguf_path(g);
    tg_tokenizer *t = calloc(1, sizeof *t);
    buf pieces = {0};
    int *cpt_to_byte = NULL;
    *out = NULL;
    if (!t) return tg_errf(e, "%s: out of memory", path);
    pthread_mutex_init(&t->cache_mu, NULL);
    t->bos = t->eos = -1;

    gguf_str model, pre;
    if (gguf_get_str(g, "tokenizer.ggml.model", &model, e)) goto fail;
    if (!streq(model, "gpt2")) {
        tg_errf(e, "%s: tokenizer.ggml.model is '%.*s', expected 'gpt2' (byte-level BPE)", path,
                (int)(model.n > 64 ? 64 : model.n), model.p);
        goto fail;
    }
    if (gguf_find_key(g, "tokenizer.ggml.pre") < 0) {
        tg_errf(e, "%s: tokenizer.ggml.pre is absent; expected one of qwen2, llama3, gpt-2 "
                   "(llama.cpp would fall back to 'default'; tokgate does not)", path);
        goto fail;
    }
    if (gguf_get_str(g, "tokenizer.ggml.pre", &pre, e)) goto fail;
    const char *rx;
    t->clean_spaces = 1;
    if (streq(pre, "qwen2") || streq(pre, "deepseek-r1-qwen")) {
        t->pre = PRE_QWEN2, rx = RX_QWEN2, t->clean_spaces = 0;
    } else if (streq(pre, "llama3") || streq(pre, "llama-v3") || streq(pre, "llama-bpe")) {
        t->pre = PRE_LLAMA3, rx = RX_LLAMA3, t->ignore_merges = 1, t->add_bos = 1;
    } else if (streq(pre, "gpt-2") || streq(pre, "gpt2")) {
        t->pre = PRE_GPT2, rx = RX_GPT2;
    } else {
        tg_errf(e, "%s: tokenizer.ggml.pre '%.*s' is not supported; expected one of qwen2, "
                   "deepseek-r1-qwen, llama3, llama-v3, llama-bpe, gpt-2", path,
                (int)(pre.n > 64 ? 64 : pre.n), pre.p);
        goto fail;
    }

    /* tokens */
    enum gguf_vtype et;
    uint64_t n_tok;
    if (gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n_tok, e)) goto fail;
    if (et != GGUF_STRING || n_tok == 0 || n_tok > (1u << 30)) {
        tg_errf(e, "%s: tokenizer.ggml.tokens: expected a non-empty array of strings (at most 2^30), "
                   "got %llu elements of type %d", path, (unsigned long long)n_tok, (int)et);
        goto fail;
    }
    t->n_vocab = (int32_t)n_tok;
    uint64_t n_merges = 0;
    if (gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n_merges, e)) goto fail;
    if (et != GGUF_STRING || n_merges > (1u << 28)) {
        tg_errf(e, "%s: tokenizer.ggml.merges: expected an array of strings", path);
        goto fail;
    }
    t->str_hash_cap = 1024;
    while (t->str_hash_cap < 2 * (n_tok + 2 * n_merges + 256)) t->str_hash_cap *= 2;
    t->str_hash = malloc((size_t)t->str_hash_cap * sizeof *t->str_hash);
    t->attr = calloc((size_t)n_tok, 1);
    if (!t->str_hash || !t->attr) goto oom;
    memset(t->str_hash, 0xff, (size_t)t->str_hash_cap * sizeof *t->str_hash);
    for (uint64_t i = 0; i < n_tok; i++) {
        gguf_str s;
        if (gguf_arr_str(g, "tokenizer.ggml.tokens", i, &s, e)) goto fail;
        char tmp[48];
        if (s.n == 0) {
            snprintf(tmp, sizeof tmp, "[EMPTY_%llu]", (unsigned long long)i);
            s.p = tmp, s.n = strlen(tmp);
        }
        if (s.n > (1u << 20)) {
            tg_errf(e, "%s: tokenizer.ggml.tokens[%llu]: %llu bytes, expected at most 1 MiB", path,
                    (unsigned long long)i, (unsigned long long)s.n);
            goto fail;
        }
        if (str_push(t, s.p, s.n) != (int32_t)i) goto oom;
        uint32_t h = str_slot(t, s.p, s.n);
        t->str_hash[h] = (int32_t)i; /* a later duplicate wins */
    }

    /* token types */
    if (gguf_find_key(g, "tokenizer.ggml.token_type") >= 0) {
        uint64_t n_tt;
        if (gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n_tt, e)) goto fail;
        if (et != GGUF_I32 || n_tt < n_tok) {
            tg_errf(e, "%s: tokenizer.ggml.token_type: expected an i32 array of at least %llu elements",
                    path, (unsigned long long)n_tok);
            goto fail;
        }
        const uint8_t *tt = gguf_arr_data(g, "tokenizer.ggml.token_type");
        for (uint64_t i = 0; i < n_tok; i++) {
            int32_t ty;
            memcpy(&ty, tt + 4 * i, 4);
            t->attr[i] = attr_of_type(ty);
        }
    } else {
        memset(t->attr, ATTR_NORMAL, (size_t)n_tok);
    }

    /* GPT-2 byte table; single-byte symbols */
    int unprintable_rank[256], k = 0;
    cpt_to_byte = malloc(0x144 * sizeof *cpt_to_byte);
    if (!cpt_to_byte) goto oom;
    for (int c = 0; c < 0x144; c++) cpt_to_byte[c] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
        unprintable_rank[b] = printable ? -1 : k++;
    }
    for (int b = 0; b < 256; b++) {
        uint32_t cpt = gpt2_byte_cpt(b, unprintable_rank);
        t->byte_enc_len[b] = (uint8_t)utf8_put(cpt, t->byte_enc[b]);
        cpt_to_byte[cpt] = b;
    }

    /* merges: "a b" split at the first space after byte 0 */
    t->merge_cap = 1024;
    while (t->merge_cap < 2 * n_merges + 2) t->merge_cap *= 2;
    t->merges = malloc((size_t)t->merge_cap * sizeof *t->merges);
    if (!t->merges) goto oom;
    for (uint32_t i = 0; i < t->merge_cap; i++) t->merges[i].key = UINT64_MAX;
    char *joined = NULL;
    size_t joined_cap = 0;
    for (uint64_t i = 0; i < n_merges; i++) {
        gguf_str s;
        if (gguf_arr_str(g, "tokenizer.ggml.merges", i, &s, e)) { free(joined); goto fail; }
        const char *sp = s.n > 1 ? memchr(s.p + 1, ' ', s.n - 1) : NULL;
        if (!sp) continue; /* llama.cpp ranks the pair ("", ""), which never occurs */
        size_t la = (size_t)(sp - s.p), lb = s.n - la - 1;
        if (la + lb > joined_cap) {
            joined_cap = 2 * (la + lb) + 64;
            char *nj = realloc(joined, joined_cap);
            if (!nj) { free(joined); goto oom; }
            joined = nj;
        }
        memcpy(joined, s.p, la);
        memcpy(joined + la, sp + 1, lb);
        int32_t a = str_intern(t, s.p, la);
        int32_t b = a >= 0 ? str_intern(t, sp + 1, lb) : -1;
        int32_t r = b >= 0 ? str_intern(t, joined, la + lb) : -1;
        if (r < 0) { free(joined); goto oom; }
        if (la && lb) merge_add(t, a, b, (int32_t)i, r);
    }
    free(joined);
    for (int b = 0; b < 256; b++) t->byte_sid[b] = str_find(t, t->byte_enc[b], t->byte_enc_len[b]);

    /* special ids and add_bos / add_eos */
    t->bos = t->eos = 11; /* llama.cpp's defaults for "gpt2" vocabularies */
    uint32_t v;
    if (!gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &v, NULL) && v < n_tok) t->bos = (int32_t)v;
    if (!gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &v, NULL) && v < n_tok) t->eos = (int32_t)v;
    if (t->bos >= t->n_vocab) t->bos = -1;
    if (t->eos >= t->n_vocab) t->eos = -1;
    int bv;
    if (gguf_find_key(g, "tokenizer.ggml.add_bos_token") >= 0) {
        if (gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &bv, e)) goto fail;
        t->add_bos = bv;
    }
    if (gguf_find_key(g, "tokenizer.ggml.add_eos_token") >= 0) {
        if (gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &bv, e)) goto fail;
        t->add_eos = bv;
    }
    if ((t->add_bos && t->bos < 0) || (t->add_eos && t->eos < 0)) {
        tg_errf(e, "%s: add_bos_token/add_eos_token set but the vocabulary has no such token", path);
        goto fail;
    }

    fix_attrs(t, g);

    /* special-token cut order */
    t->special = malloc((size_t)n_tok * sizeof *t->special);
    if (!t->special) goto oom;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->attr[id] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)) t->special[t->n_special++] = id;
    qsort_r(t->special, (size_t)t->n_special, sizeof *t->special, cmp_special, t);

    /* pieces (llama_token_to_piece with special = true) */
    t->piece_off = malloc(((size_t)n_tok + 1) * sizeof *t->piece_off);
    if (!t->piece_off) goto oom;
    if (buf_put(&pieces, "", 0)) goto oom;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        t->piece_off[id] = (uint32_t)pieces.n;
        const char *txt = t->pool + t->strs[id].off;
        size_t n = t->strs[id].len;
        uint8_t a = t->attr[id];
        int rc = 0;
        if (a & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED)) {
            rc = buf_put(&pieces, txt, n);
        } else if (a & ATTR_NORMAL) {
            rc = decode_token_text(t, cpt_to_byte, txt, n, &pieces);
        } else if (a & ATTR_BYTE) {
            char hex[3] = {n > 3 ? txt[3] : 0, n > 4 ? txt[4] : 0, 0};
            char c = (char)strtol(hex, NULL, 16);
            rc = buf_put(&pieces, &c, 1);
        }
        if (rc) goto oom;
        if (pieces.n > UINT32_MAX / 2) {
            tg_errf(e, "%s: the vocabulary's pieces exceed 2 GiB", path);
            goto fail;
        }
    }
    t->piece_off[t->n_vocab] = (uint32_t)pieces.n;
    t->pieces = pieces.p;
    pieces.p = NULL;

    /* the split regex */
    int ec;
    PCRE2_SIZE eo;
    t->re = pcre2_compile((PCRE2_SPTR)rx, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        tg_errf(e, "%s: internal: the split regex does not compile at %zu: %s", path, (size_t)eo, msg);
        goto fail;
    }
    pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE); /* without JIT it still works, slower */

    t->cache = calloc(CACHE_SLOTS, sizeof *t->cache);
    if (!t->cache) goto oom;
    free(cpt_to_byte);
    *out = t;
    return 0;

oom:
    tg_errf(e, "%s: out of memory building the tokenizer", path);
fail:
    free(pieces.p);
    free(cpt_to_byte);
    tg_tokenizer_free(t);
    return -1;
}

static void cache_clear(tg_tokenizer *t)
{
    for (uint32_t i = 0; i < CACHE_SLOTS; i++) {
        free(t->cache[i].data);
        t->cache[i].data = NULL;
    }
    t->cache_used = 0;
}

void tg_tokenizer_free(tg_tokenizer *t)
{
    if (!t) return;
    if (t->cache) cache_clear(t);
    free(t->cache);
    pthread_mutex_destroy(&t->cache_mu);
    pcre2_code_free(t->re);
    free(t->pool);
    free(t->strs);
    free(t->str_hash);
    free(t->attr);
    free(t->pieces);
    free(t->piece_off);
    free(t->merges);
    free(t->special);
    free(t);
}

int32_t tg_tokenizer_n_vocab(const tg_tokenizer *t) { return t->n_vocab; }
int32_t tg_tokenizer_bos(const tg_tokenizer *t) { return t->bos; }
int32_t tg_tokenizer_eos(const tg_tokenizer *t) { return t->eos; }
int tg_tokenizer_add_bos(const tg_tokenizer *t) { return t->add_bos; }
int tg_tokenizer_add_eos(const tg_tokenizer *t) { return t->add_eos; }

const char *tg_token_text(const tg_tokenizer *t, int32_t id)
{
    if (id < 0 || id >= t->n_vocab) return NULL;
    return t->pool + t->strs[id].off;
}

const char *tg_token_piece(const tg_tokenizer *t, int32_t id, int render_special, size_t *len)
{
    if (id < 0 || id >= t->n_vocab) return NULL;
    if (!render_special && (t->attr[id] & (ATTR_UNKNOWN | ATTR_CONTROL))) {
        *len = 0;
        return t->pieces + t->piece_off[id];
    }
    *len = t->piece_off[id + 1] - t->piece_off[id];
    return t->pieces + t->piece_off[id];
}

/* --------------------------------------------------------------- tokenize */

/* Growable id list. */
typedef struct ids {
    int32_t *p;
    size_t n, cap;
} ids;

static int ids_push(ids *v, int32_t id)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *np = realloc(v->p, cap * sizeof *np);
        if (!np) return -1;
        v->p = np;
        v->cap = cap;
    }
    v->p[v->n++] = id;
    return 0;
}

/* Per-call scratch for BPE. */
typedef struct symbol {
    int32_t sid;      /* string id, or -1 when the string is not interned */
    int32_t start;    /* first byte in the piece */
    int32_t len;      /* bytes of the piece it covers; 0 once merged away */
    int32_t prev, next;
} symbol;

typedef struct bigram {
    int32_t rank, left, right, len_left, len_right;
} bigram;

typedef struct scratch {
    symbol *sym;
    size_t sym_cap;
    bigram *heap;
    size_t heap_n, heap_cap;
    char *enc;
    size_t enc_cap;
    char *canon;       /* re-encoded fragment */
    size_t canon_cap;
    char *subj;        /* what PCRE2 sees */
    size_t subj_cap;
} scratch;

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *np = realloc(*p, c * elem);
    if (!np) return -1;
    *p = np;
    *cap = c;
    return 0;
}

static int heap_less(const bigram *a, const bigram *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static int heap_push(scratch *s, bigram b)
{
    if (grow((void **)&s->heap, &s->heap_cap, s->heap_n + 1, sizeof *s->heap)) return -1;
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&b, &s->heap[p])) break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = b;
    return 0;
}

static bigram heap_pop(scratch *s)
{
    bigram top = s->heap[0], last = s->heap[--s->heap_n];
    size_t i = 0, n = s->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_less(&s->heap[c + 1], &s->heap[c])) c++;
        if (!heap_less(&s->heap[c], &last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n) s->heap[i] = last;
    return top;
}

static int try_bigram(const tg_tokenizer *t, scratch *s, int32_t l, int32_t r)
{
    if (l < 0 || r < 0) return 0;
    const symbol *a = &s->sym[l], *b = &s->sym[r];
    if (a->sid < 0 || b->sid < 0) return 0;
    const merge_slot *m = merge_find(t, a->sid, b->sid);
    if (!m) return 0;
    bigram bg = {m->rank, l, r, a->len, b->len};
    return heap_push(s, bg);
}

/* GPT-2 encoding of piece bytes p[0..n) into s->enc; returns its length or
 * -1 on OOM. */
static long encode_piece(const tg_tokenizer *t, scratch *s, const uint8_t *p, size_t n)
{
    if (grow((void **)&s->enc, &s->enc_cap, 2 * n + 1, 1)) return -1;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(s->enc + k, t->byte_enc[p[i]], t->byte_enc_len[p[i]]);
        k += t->byte_enc_len[p[i]];
    }
    return (long)k;
}

/* Emits the ids of a symbol that is not a token: its GPT-2 bytes that are
 * single-byte tokens, one by one (llama.cpp's fallback). */
static int emit_fallback(const tg_tokenizer *t, scratch *s, const uint8_t *p, size_t n, ids *o)
{
    long k = encode_piece(t, s, p, n);
    if (k < 0) return -1;
    for (long i = 0; i < k; i++) {
        int32_t sid = str_find(t, s->enc + i, 1);
        if (sid >= 0 && sid < t->n_vocab && ids_push(o, sid)) return -1;
    }
    return 0;
}

/* BPE of one piece (raw bytes p[0..n), already canonical UTF-8); appends
 * ids to o. Returns 0 or -1 on OOM. */
static int bpe_piece(const tg_tokenizer *t, scratch *s, const uint8_t *p, size_t n, ids *o)
{
    if (t->ignore_merges) {
        long k = encode_piece(t, s, p, n);
        if (k < 0) return -1;
        int32_t sid = str_find(t, s->enc, (size_t)k);
        if (sid >= 0 && sid < t->n_vocab) return ids_push(o, sid);
    }
    if (grow((void **)&s->sym, &s->sym_cap, n, sizeof *s->sym)) return -1;
    /* symbols: one per UTF-8 character of the encoded piece, i.e. one per byte */
    for (size_t i = 0; i < n; i++) {
        symbol *y = &s->sym[i];
        y->sid = t->byte_sid[p[i]];
        y->start = (int32_t)i;
        y->len = 1;
        y->prev = (int32_t)i - 1;
        y->next = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    s->heap_n = 0;
    for (size_t i = 1; i < n; i++)
        if (try_bigram(t, s, (int32_t)i - 1, (int32_t)i)) return -1;
    while (s->heap_n) {
        bigram bg = heap_pop(s);
        symbol *l = &s->sym[bg.left], *r = &s->sym[bg.right];
        if (l->len == 0 || r->len == 0 || l->len != bg.len_left || r->len != bg.len_right) continue;
        const merge_slot *m = merge_find(t, l->sid, r->sid);
        l->sid = m->result;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) s->sym[r->next].prev = bg.left;
        if (try_bigram(t, s, l->prev, bg.left) || try_bigram(t, s, bg.left, l->next)) return -1;
    }
    for (int32_t i = 0; i >= 0 && (size_t)i < n; i = s->sym[i].next) {
        const symbol *y = &s->sym[i];
        if (y->sid >= 0 && y->sid < t->n_vocab) {
            if (ids_push(o, y->sid)) return -1;
        } else if (emit_fallback(t, s, p + y->start, (size_t)y->len, o)) {
            return -1;
        }
    }
    return 0;
}

/* Ids of one piece through the word cache. */
static int piece_ids(tg_tokenizer *t, scratch *s, const uint8_t *p, size_t n, ids *o)
{
    if (n > CACHE_MAX_PIECE) return bpe_piece(t, s, p, n, o);
    uint64_t h = hash_bytes(p, n);
    uint32_t mask = CACHE_SLOTS - 1;
    pthread_mutex_lock(&t->cache_mu);
    for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
        cache_slot *c = &t->cache[i];
        if (!c->data) break;
        if (c->hash == h && c->len == n && !memcmp(c->data, p, n)) {
            const char *idp = c->data + ((n + 3) & ~(size_t)3);
            for (uint32_t k = 0; k < c->n; k++) {
                int32_t id;
                memcpy(&id, idp + 4 * k, 4);
                if (ids_push(o, id)) { pthread_mutex_unlock(&t->cache_mu); return -1; }
            }
            pthread_mutex_unlock(&t->cache_mu);
            return 0;
        }
    }
    pthread_mutex_unlock(&t->cache_mu);

    size_t first = o->n;
    if (bpe_piece(t, s, p, n, o)) return -1;
    size_t k = o->n - first;
    size_t al = (n + 3) & ~(size_t)3;
    char *data = malloc(al + 4 * k + 1);
    if (!data) return 0; /* the cache is an optimisation */
    memcpy(data, p, n);
    memcpy(data + al, o->p + first, 4 * k);

    pthread_mutex_lock(&t->cache_mu);
    if (t->cache_used >= CACHE_SLOTS / 4) cache_clear(t);
    for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
        cache_slot *c = &t->cache[i];
        if (!c->data) {
            c->hash = h;
            c->len = (uint32_t)n;
            c->n = (uint32_t)k;
            c->data = data;
            t->cache_used++;
            break;
        }
        if (c->hash == h && c->len == n && !memcmp(c->data, p, n)) { /* another thread was first */
            free(data);
            break;
        }
    }
    pthread_mutex_unlock(&t->cache_mu);
    return 0;
}

/* Re-encodes the raw fragment text[0..n) as llama.cpp sees it (see the file
 * comment) into s->canon, and into s->subj the same bytes with surrogates
 * replaced by U+FFFD (same length) for PCRE2. Sets *out_n. Returns 0, or -1
 * with e for a code point above U+10FFFF, or on OOM. */
static int canonicalize(scratch *s, const uint8_t *text, size_t n, size_t base, size_t *out_n, tg_err *e)
{
    if (grow((void **)&s->canon, &s->canon_cap, 3 * n + 1, 1) ||
        grow((void **)&s->subj, &s->subj_cap, 3 * n + 1, 1))
        return tg_errf(e, "tokenize: out of memory");
    size_t k = 0;
    for (size_t off = 0; off < n;) {
        if (text[off] < 0x80) {
            s->canon[k] = s->subj[k] = (char)text[off++];
            k++;
            continue;
        }
        size_t at = off;
        uint32_t cpt = utf8_next(text, n, &off);
        if (cpt > 0x10ffff)
            return tg_errf(e, "tokenize: byte offset %zu: the sequence decodes to U+%X, above U+10FFFF "
                              "(llama.cpp throws on it)", base + at, (unsigned)cpt);
        int m = utf8_put(cpt, s->canon + k);
        if (cpt >= 0xd800 && cpt <= 0xdfff) utf8_put(0xfffd, s->subj + k);
        else memcpy(s->subj + k, s->canon + k, (size_t)m);
        k += (size_t)m;
    }
    *out_n = k;
    return 0;
}

/* Splits and BPEs one raw fragment; appends ids. */
static int tokenize_fragment(tg_tokenizer *t, scratch *s, pcre2_match_data *md, const uint8_t *text,
                             size_t n, size_t base, ids *o, tg_err *e)
{
    size_t m = 0;
    if (canonicalize(s, text, n, base, &m, e)) return -1;
    PCRE2_SIZE pos = 0;
    while (pos < m) {
        int rc = pcre2_match(t->re, (PCRE2_SPTR)s->subj, m, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc < 0) {
            if (rc == PCRE2_ERROR_NOMATCH) {
                /* cannot happen with these regexes (the last alternative takes any
                 * whitespace, the others everything else); keep the rest as one piece */
                if (piece_ids(t, s, (const uint8_t *)s->canon + pos, m - pos, o))
                    return tg_errf(e, "tokenize: out of memory");
                break;
            }
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return tg_errf(e, "tokenize: byte offset %zu: PCRE2 match failed: %s", base + pos, msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[0] > pos) /* an unmatched gap is a piece of its own */
            if (piece_ids(t, s, (const uint8_t *)s->canon + pos, ov[0] - pos, o))
                return tg_errf(e, "tokenize: out of memory");
        size_t end = ov[1];
        if (end == ov[0]) { /* empty match: cannot happen; take one character */
            end = ov[0] + 1;
            while (end < m && ((uint8_t)s->subj[end] & 0xc0) == 0x80) end++;
        }
        if (piece_ids(t, s, (const uint8_t *)s->canon + ov[0], end - ov[0], o))
            return tg_errf(e, "tokenize: out of memory");
        pos = end;
    }
    return 0;
}

/* A fragment of the text: raw bytes [off, off+len) or a special token. */
typedef struct frag {
    size_t off, len;
    int32_t token; /* -1: raw text */
} frag;

int tg_tokenize(const tg_tokenizer *tc, const char *text, size_t len, int add_special, int parse_special,
                int32_t **out_ids, size_t *n_ids, tg_err *e)
{
    tg_tokenizer *t = (tg_tokenizer *)tc; /* only the cache (under its mutex) changes */
    ids o = {0};
    scratch s = {0};
    frag *fr = NULL, *nf = NULL;
    size_t n_fr = 0, cap_fr = 0, cap_nf = 0;
    pcre2_match_data *md = NULL;
    int rc = -1;
    *out_ids = NULL;
    *n_ids = 0;

    if (add_special && t->add_bos && ids_push(&o, t->bos)) goto oom;
    if (len > 0) {
        if (grow((void **)&fr, &cap_fr, 1, sizeof *fr)) goto oom;
        fr[0] = (frag){0, len, -1};
        n_fr = 1;
    }
    /* 1. special-token partition */
    for (int32_t si = 0; si < t->n_special && n_fr; si++) {
        int32_t id = t->special[si];
        if (!parse_special && (t->attr[id] & (ATTR_CONTROL | ATTR_UNKNOWN))) continue;
        const char *tt = t->pool + t->strs[id].off;
        size_t tl = t->strs[id].len;
        size_t n_new = 0;
        for (size_t f = 0; f < n_fr; f++) {
            if (fr[f].token >= 0) {
                if (grow((void **)&nf, &cap_nf, n_new + 1, sizeof *nf)) goto oom;
                nf[n_new++] = fr[f];
                continue;
            }
            size_t off = fr[f].off, end = fr[f].off + fr[f].len;
            for (;;) {
                const char *hit = end - off >= tl ? memmem(text + off, end - off, tt, tl) : NULL;
                if (grow((void **)&nf, &cap_nf, n_new + 2, sizeof *nf)) goto oom;
                if (!hit) {
                    if (end > off) nf[n_new++] = (frag){off, end - off, -1};
                    break;
                }
                size_t h = (size_t)(hit - text);
                if (h > off) nf[n_new++] = (frag){off, h - off, -1};
                nf[n_new++] = (frag){h, tl, id};
                off = h + tl;
            }
        }
        frag *tmp = fr;
        size_t tcap = cap_fr;
        fr = nf, cap_fr = cap_nf, n_fr = n_new;
        nf = tmp, cap_nf = tcap;
    }
    /* 2-4. split and BPE every raw fragment */
    md = pcre2_match_data_create_from_pattern(t->re, NULL);
    if (!md) goto oom;
    for (size_t f = 0; f < n_fr; f++) {
        if (fr[f].token >= 0) {
            if (ids_push(&o, fr[f].token)) goto oom;
            continue;
        }
        if (tokenize_fragment(t, &s, md, (const uint8_t *)text + fr[f].off, fr[f].len, fr[f].off, &o, e))
            goto out;
    }
    if (add_special && t->add_eos && ids_push(&o, t->eos)) goto oom;
    *out_ids = o.p;
    *n_ids = o.n;
    o.p = NULL;
    if (!*n_ids) {
        free(*out_ids);
        *out_ids = NULL;
    }
    rc = 0;
    goto out;
oom:
    tg_errf(e, "tokenize: out of memory");
out:
    pcre2_match_data_free(md);
    free(o.p);
    free(fr);
    free(nf);
    free(s.sym);
    free(s.heap);
    free(s.enc);
    free(s.canon);
    free(s.subj);
    return rc;
}

/* ------------------------------------------------------------- detokenize */

/* llama.cpp's clean_up_tokenization_spaces passes, in place; returns the new
 * length. */
static size_t clean_spaces(char *text, size_t total)
{
    /* " ?", " !", " .", " ," lose the space */
    size_t t1 = total, n = total ? 1 : 0;
    for (size_t i = 1; i < t1; i++) {
        char x = text[i];
        if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) n--;
        text[n++] = x;
    }
    /* a single apostrophe between spaces loses both spaces */
    size_t t2 = n;
    n = t2 ? 1 : 0;
    for (size_t i = 1; i < t2; i++) {
        char x = text[i];
        if (x == '\'' && i + 1 < t2 && text[i - 1] == ' ' && text[i + 1] == ' ') {
            n--;
            text[++i] = '\0';
        }
        text[n++] = x;
    }
    /* " 's", " 'm", " 're", " 've" lose the space */
    size_t t3 = n;
    n = t3 ? 1 : 0;
    for (size_t i = 1; i < t3; i++) {
        char x = text[i];
        if (text[i - 1] == ' ' && x == '\'' && i + 1 < t3) {
            char x1 = text[i + 1];
            if (x1 == 's' || x1 == 'm') n--;
            else if (i + 2 < t3 && ((x1 == 'r' && text[i + 2] == 'e') || (x1 == 'v' && text[i + 2] == 'e'))) n--;
        }
        text[n++] = x;
    }
    return n;
}

int tg_detokenize(const tg_tokenizer *t, const int32_t *idv, size_t n, int render_special, char **out,
                  size_t *len, tg_err *e)
{
    buf b = {0};
    *out = NULL;
    *len = 0;
    if (buf_put(&b, "", 0)) return tg_errf(e, "detokenize: out of memory");
    for (size_t i = 0; i < n; i++) {
        size_t pl;
        const char *p = tg_token_piece(t, idv[i], render_special, &pl);
        if (!p) {
            free(b.p);
            return tg_errf(e, "detokenize: ids[%zu] = %d is outside [0, %d)", i, idv[i], t->n_vocab);
        }
        if (buf_put(&b, p, pl)) {
            free(b.p);
            return tg_errf(e, "detokenize: out of memory");
        }
    }
    if (t->clean_spaces) {
        b.n = clean_spaces(b.p, b.n);
        b.p[b.n] = 0;
    }
    *out = b.p;
    *len = b.n;
    return 0;
}
