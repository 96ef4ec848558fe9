/*
 * tokenizer.h: byte-level BPE, id for id what llama.cpp's tokenizer gives
 * for the same GGUF vocabulary (tokenizer.ggml.model "gpt2").
 *
 * Pre-tokenizers (tokenizer.ggml.pre): "qwen2" (also "deepseek-r1-qwen"),
 * "llama3" (also "llama-v3", "llama-bpe") and "gpt-2" (llama.cpp's name for
 * the original GPT-2 split; "gpt2" is accepted as its alias). Any other name
 * is an error, never a silent fallback.
 *
 * What "identical to llama.cpp" covers (see tokenizer.c for the details):
 * the special-token partition (control, user-defined and unknown tokens
 * matched as whole strings, longest first; user-defined ones even when
 * parse_special is off), the split (PCRE2 with the whitespace set and the
 * contraction rules of llama.cpp's hand-written splitters; invalid UTF-8
 * bytes become U+FFFD), the GPT-2 byte-to-unicode mapping, merges by rank
 * (lowest rank, then leftmost pair), and detokenization bytes-exact
 * (including llama.cpp's space clean-up for the pre-tokenizers that enable
 * it: llama3 and gpt-2, not qwen2).
 *
 * A tg_tokenizer is immutable after tg_tokenizer_from_gguf() except for an
 * internal word cache guarded by a mutex: tg_tokenize() and tg_detokenize()
 * may be called from several threads at once.
 */
#ifndef TG_TOKENIZER_H
#define TG_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "util.h"

typedef struct tg_tokenizer tg_tokenizer;

/* Builds the tokenizer from a GGUF's tokenizer.ggml.* metadata. The gguf may
 * be closed afterwards (everything needed is copied). Returns 0 and *out, or
 * -1 with e naming the file and the key: a missing or mistyped key, a model
 * other than "gpt2", an unknown or missing tokenizer.ggml.pre. */
int tg_tokenizer_from_gguf(tg_tokenizer **out, const gguf *g, tg_err *e);
void tg_tokenizer_free(tg_tokenizer *t);  /* NULL is a no-op */
int32_t tg_tokenizer_n_vocab(const tg_tokenizer *t);

/* BOS / EOS ids (-1 when the vocabulary has none) and whether
 * add_special adds them (tokenizer.ggml.add_bos_token / add_eos_token, or
 * the pre-tokenizer's default as llama.cpp has it). */
int32_t tg_tokenizer_bos(const tg_tokenizer *t);
int32_t tg_tokenizer_eos(const tg_tokenizer *t);
int tg_tokenizer_add_bos(const tg_tokenizer *t);
int tg_tokenizer_add_eos(const tg_tokenizer *t);

/* Tokenizes len bytes of text (any bytes; NULs and invalid UTF-8 allowed).
 * add_special: add BOS/EOS as the file says (llama_tokenize's add_special);
 * parse_special: match control token texts too (llama_tokenize's
 * parse_special; user-defined tokens are matched either way, as in
 * llama.cpp). Returns 0 with *ids (malloc'ed, caller frees; NULL when
 * *n_ids is 0) and *n_ids, or -1 with e: out of memory, or a code point
 * above U+10FFFF in the text (a 0xF5..0xF7 lead byte, which llama.cpp
 * rejects by throwing), naming the byte offset. */
int tg_tokenize(const tg_tokenizer *t, const char *text, size_t len, int add_special,
                int parse_special, int32_t **ids, size_t *n_ids, tg_err *e);

/* The bytes of ids concatenated (llama_detokenize with remove_special off):
 * *out is malloc'ed with a NUL added but not counted in *len. render_special:
 * include the text of control and unknown tokens (llama_detokenize's
 * unparse_special). Returns 0, or -1 with e for an id outside
 * [0, n_vocab) (naming its index) or out of memory. */
int tg_detokenize(const tg_tokenizer *t, const int32_t *ids, size_t n, int render_special,
                  char **out, size_t *len, tg_err *e);

/* The piece of one token, as llama_token_to_piece(special = render_special)
 * gives it: a pointer into t (valid while t lives) and its length in *len,
 * or NULL for an id out of range. */
const char *tg_token_piece(const tg_tokenizer *t, int32_t id, int render_special, size_t *len);

/* The token's text as stored in the vocabulary (NUL-terminated), or NULL. */
const char *tg_token_text(const tg_tokenizer *t, int32_t id);

#endif
