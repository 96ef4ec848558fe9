/*
 * tg-llama-quantize: writes a GGUF in another quantization with llama.cpp's
 * own quantizer (llama_model_quantize of a libllama opened at run time), so
 * that the tests can run the engine on files llama.cpp made in types the
 * project ships no model of (Q4_0, Q5_0, ...). A quantized input is
 * dequantized and quantized again (llama.cpp's allow_requantize).
 *
 *   tg-llama-quantize --lib LIBLLAMA IN.gguf OUT.gguf TYPE [--pure]
 *
 * TYPE: q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k_m, q4_k_m, q5_k_m, q6_k,
 * iq4_nl (llama-quantize's mixtures;
 * --pure: every matrix in the type itself). Exit 0 on success, 1 with a
 * message naming what failed. The process only ever runs this one call.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama/llama_dl.h"

static const struct { const char *name; enum llama_ftype ftype; } TYPES[] = {
    {"q4_0", LLAMA_FTYPE_MOSTLY_Q4_0},     {"q5_0", LLAMA_FTYPE_MOSTLY_Q5_0},
    {"q8_0", LLAMA_FTYPE_MOSTLY_Q8_0},     {"q4_k_m", LLAMA_FTYPE_MOSTLY_Q4_K_M},
    {"q5_k_m", LLAMA_FTYPE_MOSTLY_Q5_K_M}, {"q6_k", LLAMA_FTYPE_MOSTLY_Q6_K},
    {"q3_k_m", LLAMA_FTYPE_MOSTLY_Q3_K_M}, {"q2_k", LLAMA_FTYPE_MOSTLY_Q2_K},
    {"q4_1", LLAMA_FTYPE_MOSTLY_Q4_1},     {"q5_1", LLAMA_FTYPE_MOSTLY_Q5_1},
    {"iq4_nl", LLAMA_FTYPE_MOSTLY_IQ4_NL}, /* a type the engine refuses: for the refusal's test */
};

static int usage(void)
{
    fprintf(stderr, "usage: tg-llama-quantize --lib LIBLLAMA IN.gguf OUT.gguf TYPE [--pure]\n"
                    "  TYPE: q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k_m, q4_k_m, q5_k_m, q6_k or iq4_nl\n");
    return 1;
}

int main(int argc, char **argv)
{
    const char *lib = NULL, *pos[3] = {NULL, NULL, NULL};
    int npos = 0, pure = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--lib") && i + 1 < argc) lib = argv[++i];
        else if (!strcmp(argv[i], "--pure")) pure = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return usage(), 0;
        else if (npos < 3) pos[npos++] = argv[i];
        else return usage();
    }
    if (!lib || npos != 3) return usage();
    int t = -1;
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (!strcmp(TYPES[i].name, pos[2])) t = (int)i;
    if (t < 0) {
        fprintf(stderr, "tg-llama-quantize: type '%s': expected q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k_m, q4_k_m, q5_k_m, "
                        "q6_k or iq4_nl\n", pos[2]);
        return 1;
    }
    llama_dl *dl;
    tg_err e = {{0}};
    if (llama_dl_open(lib, &dl, &e)) {
        fprintf(stderr, "tg-llama-quantize: %s\n", e.msg);
        return 1;
    }
    struct llama_model_quantize_params (*defaults)(void) =
        (struct llama_model_quantize_params (*)(void))dlsym(dl->handle, "llama_model_quantize_default_params");
    uint32_t (*quantize)(const char *, const char *, const struct llama_model_quantize_params *) =
        (uint32_t (*)(const char *, const char *, const struct llama_model_quantize_params *))dlsym(
            dl->handle, "llama_model_quantize");
    if (!defaults || !quantize) {
        fprintf(stderr, "tg-llama-quantize: %s has no llama_model_quantize\n", lib);
        llama_dl_free(dl);
        return 1;
    }
    struct llama_model_quantize_params p = defaults();
    p.ftype = TYPES[t].ftype;
    p.allow_requantize = true;
    p.pure = pure != 0;
    p.nthread = 1;
    const uint32_t rc = quantize(pos[0], pos[1], &p);
    llama_dl_free(dl);
    if (rc != 0) {
        fprintf(stderr, "tg-llama-quantize: llama_model_quantize(%s -> %s, %s) returned %u\n", pos[0], pos[1],
                pos[2], rc);
        return 1;
    }
    return 0;
}
