/*
 * hfvocab.h: turns a Hugging Face tokenizer.json (byte-level BPE, the Qwen3
 * tokenizer) into the GGUF tokenizer metadata that llama.cpp's converter
 * (convert_hf_to_gguf.py with gguf-py's SpecialVocab) writes for Qwen3.
 *
 * Keys written, in the converter's order:
 *   tokenizer.ggml.model "gpt2", tokenizer.ggml.pre "qwen2",
 *   tokenizer.ggml.tokens (every id 0..n-1; added tokens at their ids;
 *     "[PAD{i}]" for ids the file does not define, up to pad_to),
 *   tokenizer.ggml.token_type (i32: 1 normal, 3 control for special added
 *     tokens and added tokens that look special ("<|...|>"), 4 user-defined
 *     for the other added tokens, 5 unused for the padding),
 *   tokenizer.ggml.merges ("a b", a space inside a part written as U+0120),
 *   tokenizer.ggml.eos_token_id, padding_token_id, bos_token_id (u32),
 *   tokenizer.ggml.add_bos_token (false, unless tokenizer_config.json says
 *   otherwise), tokenizer.chat_template (when tokenizer_config.json has one).
 *
 * Special token ids come from a tokenizer_config.json lying next to the
 * tokenizer.json when there is one (eos_token, pad_token, bos_token,
 * add_bos_token, add_eos_token, chat_template), as the converter reads them;
 * the bos id, which the converter takes from config.json's bos_token_id, is
 * that of "<|endoftext|>" as in every Qwen3 config.json. Without a
 * tokenizer_config.json the Qwen3 instruct defaults apply: eos "<|im_end|>",
 * pad and bos "<|endoftext|>", add_bos_token false.
 */
#ifndef TG_HFVOCAB_H
#define TG_HFVOCAB_H

#include <stdint.h>

#include "gguf.h"
#include "util.h"

/* Reads tokenizer_json_path and adds the tokenizer keys above to w.
 * pad_to: total vocab size to pad to with unused "[PAD{i}]" tokens (151936
 * for Qwen3 files); 0 means no padding (n = highest id + 1).
 * Returns 0, or -1 with e naming the file and the field that is missing or
 * malformed (e.g. a pad_to below the highest id, a pre-tokenizer other than
 * the qwen2 split regex, a model type other than BPE). On failure w may
 * hold some of the keys already. */
int tg_hfvocab_write(gguf_writer *w, const char *tokenizer_json_path,
                     int64_t pad_to, tg_err *e);

#endif
