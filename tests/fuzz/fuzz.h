/*
 * fuzz.h: the fuzz targets of tokgate (tests/fuzz/). Each target takes
 * arbitrary bytes and drives one parser of untrusted input: the GGUF reader,
 * the tokenizer, the spec parser, the arm-protocol request parser and the
 * store's top-k rows. A
 * target returns 0 whatever the input (bad input must be refused with an
 * error, never crash, leak or read out of bounds); it asserts only on
 * broken invariants of our own code (an error without a message).
 *
 * The same sources build two ways: with clang -fsanitize=fuzzer and
 * -DTG_LIBFUZZER each file is one libFuzzer program (make fuzz); without,
 * tests/test_fuzz_replay.c includes them all and replays the kept corpora
 * (tests/fuzz/corpus/TARGET/) under gcc in make test.
 */
#ifndef TG_FUZZ_H
#define TG_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int fuzz_gguf_one(const uint8_t *data, size_t size);
int fuzz_tokenizer_one(const uint8_t *data, size_t size);
int fuzz_spec_one(const uint8_t *data, size_t size);
int fuzz_proto_one(const uint8_t *data, size_t size);
int fuzz_store_one(const uint8_t *data, size_t size);

/* The shipped model (for the tokenizer target): $TG_FUZZ_MODEL, else
 * $TG_ROOT/models/tiny-trained-qwen3-Q4_K_M.gguf, else that path relative
 * to the current folder. */
const char *fuzz_model_path(void);

#endif
