/*
 * fuzz_spec.c: the spec parser (libfyaml underneath) over arbitrary bytes.
 * A spec that loads is then turned into every arm's argv, as the gate does,
 * and every argv must be NULL-terminated with no NULL inside. Inputs that
 * name a device file (/dev/...) are skipped: reading /dev/zero as a prompt
 * file is bounded (256 MiB) but slow, and /dev/stdin would wait.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "spec.h"

int fuzz_spec_one(const uint8_t *data, size_t size)
{
    if (memmem(data, size, "/dev", 4) || memmem(data, size, "/proc", 5)) return 0;
    char *text = malloc(size ? size : 1);
    if (!text) return 0;
    if (size) memcpy(text, data, size);
    tg_spec *s = NULL;
    tg_err e = {{0}};
    if (spec_parse(&s, "fuzz-spec.yaml", text, size, &e) < 0) {
        assert(e.msg[0] && "spec_parse failed without a message");
        free(text);
        return 0;
    }
    assert(s->n_arms >= 1);
    assert(s->ref_index >= 0 && s->ref_index < s->n_arms);
    assert(spec_find_arm(s, s->reference) == s->ref_index);
    for (int i = 0; i < s->n_arms; i++) {
        char **argv;
        if (s->arms[i].kind == SPEC_ARM_COMMAND)
            argv = spec_command_argv(s, i, s->n_prompts ? s->prompts[0].text : "", &e);
        else
            argv = spec_arm_argv(s, i, "/nonexistent-tokgate-bin", &e);
        assert(argv && "an arm of a loaded spec has no argv");
        int n = 0;
        while (argv[n]) n++;
        assert(n >= 1);
        spec_argv_free(argv);
    }
    spec_free(s);
    free(text);
    return 0;
}

#ifdef TG_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_spec_one(data, size); }
#endif
