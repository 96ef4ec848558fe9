/*
 * tg-fault-arm.c: a TEST DOUBLE arm worker, for testing error handling
 * only. It is not an engine and not an oracle: its "logits" are made-up
 * numbers. It speaks just enough of arm protocol v1 to reach the point
 * where it misbehaves in the way its mode names, so tests/test_arm.c and
 * tests/test_gate.c can check that the harness ends each fault with the
 * right cause, within its timeout, without zombies or hangs.
 *
 *   tg-fault-arm MODE
 *
 * Modes (the fault happens at the first request of the kind named):
 *   ok            a well-behaved session (the baseline the faults differ from)
 *   segv-hello    SIGSEGV on the first request, before answering
 *   segv-decode   SIGSEGV in the middle of a decode (after 2 step lines)
 *   hang          reads requests, never answers
 *   garbage       answers every request with a line that is not JSON
 *   wrong-fields  valid JSON with the wrong fields ({"ok":true,"arms":{}} to hello)
 *   wrong-step    a decode step line whose "token" is a string
 *   eof-decode    closes stdout after 1 step line of a decode, exits 0 later
 *   bigline       answers hello with a 100 MB line
 *   drip          answers hello one byte every 50 ms, forever
 *   exit0         exits 0 at the first request without answering
 *   ignore-term   ignores SIGTERM and never answers
 *   fault-stderr  a good session that prints "Memory access fault" on stderr
 *   error-decode  answers decode with {"ok":false,...} and stays up
 *   exit3         a good session that exits with status 3 after bye
 *   child-ignore-term  forks a child that ignores SIGTERM and keeps the
 *                 pipes open; the parent exits 0 at the first request
 *                 without answering (so stdout never reaches EOF: only a
 *                 kill of the whole process group ends the leg)
 *   segv-prompt2  a good first decode, SIGSEGV in the second one
 *   dump-lie      a decode whose first line is a dump line naming an 8-byte
 *                 file in the dump folder with n = 2^31 values (the harness
 *                 must check n against the file before it allocates or reads)
 *   dump-abs      a decode whose first line is a dump line naming /dev/zero
 *                 (outside the dump folder; sent whether dumps were asked
 *                 for or not)
 *   error-load    answers load with {"ok":false} and an error that repeats
 *                 the op's name and carries ANSI escapes ("load: load:
 *                 \033[31mno such model\033[0m"), and stays up
 *   huge-counters a good session whose done lines report device_ops,
 *                 host_ops and an "ops" counter "matmul/ref" of 2^63 - 2 each
 *   nan-logits    a good session whose step lines give every logit as "nan"
 *                 (the protocol's spelling of a NaN logit)
 *   flat-logits   a good session whose step lines give every logit the same
 *                 value (a flat distribution: no argmax to judge by)
 *
 * With TG_FAULT_PIDFILE set, every instance appends its pid to that file
 * first (tests check that no worker outlives tokgate); TG_FAULT_DELAY_MS
 * makes every step line that many milliseconds late (so legs overlap).
 */
#include <jansson.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/types.h>
#include <unistd.h>

static void msleep(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void hang(void)
{
    for (;;) msleep(1000);
}

/* Dies by SIGSEGV for real, also under a sanitizer that catches it. */
static void crash(void)
{
    fflush(stdout);
    signal(SIGSEGV, SIG_DFL);
    raise(SIGSEGV);
}

static void answer(json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);
    printf("%s\n", s);
    fflush(stdout);
    free(s);
    json_decref(j);
}

static void decode(const char *mode, json_t *req)
{
    json_t *prompt = json_object_get(req, "prompt"), *force = json_object_get(req, "force");
    int steps = (int)json_integer_value(json_object_get(req, "steps"));
    int top_k = (int)json_integer_value(json_object_get(req, "top_k"));
    if (top_k < 1) top_k = 1;
    if (!strcmp(mode, "error-decode")) {
        answer(json_pack("{s:b,s:s}", "ok", 0, "error", "decode: the test double refuses to decode"));
        return;
    }
    long last = 0;
    for (size_t i = 0; i < json_array_size(prompt); i++) last = json_integer_value(json_array_get(prompt, i));
    if (!strcmp(mode, "dump-lie")) {
        const char *dir = json_string_value(json_object_get(json_object_get(req, "dump"), "path"));
        char file[4096];
        snprintf(file, sizeof file, "%s/s0-l0-q.f32", dir ? dir : ".");
        FILE *f = fopen(file, "wb");
        if (f) {
            fwrite("12345678", 1, 8, f);
            fclose(f);
        }
        answer(json_pack("{s:{s:i,s:i,s:s,s:I,s:s}}", "dump", "step", 0, "layer", 0, "stage", "q", "n",
                         (json_int_t)1 << 31, "file", file));
    }
    if (!strcmp(mode, "dump-abs"))
        answer(json_pack("{s:{s:i,s:i,s:s,s:I,s:s}}", "dump", "step", 0, "layer", 0, "stage", "q", "n",
                         (json_int_t)4, "file", "/dev/zero"));
    const char *delay = getenv("TG_FAULT_DELAY_MS");
    for (int s = 0; s < steps; s++) {
        if (delay) msleep(atol(delay));
        if (!strcmp(mode, "segv-decode") && s == 2) crash();
        if (!strcmp(mode, "eof-decode") && s == 1) {
            fclose(stdout);
            msleep(200);
            exit(0);
        }
        int tok = (int)((last * 7 + 3) % 50);
        json_t *top = json_array();
        for (int k = 0; k < top_k && k < 4; k++) {
            int id = (tok + k) % 50 + (k ? 50 * k : 0);
            if (!strcmp(mode, "nan-logits")) json_array_append_new(top, json_pack("[i,s]", id, "nan"));
            else if (!strcmp(mode, "flat-logits")) json_array_append_new(top, json_pack("[i,f]", id, 10.0));
            else json_array_append_new(top, json_pack("[i,f]", id, 10.0 - k * 0.5));
        }
        json_t *line = json_pack("{s:i,s:o,s:o,s:s}", "step", s,
                                 "token", !strcmp(mode, "wrong-step") ? json_string("x") : json_integer(tok),
                                 "top", top, "digest", "0123456789abcdef");
        answer(line);
        last = force && s < (int)json_array_size(force) ? json_integer_value(json_array_get(force, (size_t)s)) : tok;
    }
    if (!strcmp(mode, "huge-counters")) {
        json_int_t big = INT64_MAX - 1;
        answer(json_pack("{s:b,s:b,s:{s:I,s:I,s:{s:I}},s:{s:f,s:f,s:f}}", "ok", 1, "done", 1, "counters",
                         "device_ops", big, "host_ops", big, "ops", "matmul/ref", big, "ms", "load", 1.0,
                         "prefill", 2.0, "decode", 3.0));
        return;
    }
    answer(json_pack("{s:b,s:b,s:{s:i,s:i},s:{s:f,s:f,s:f}}", "ok", 1, "done", 1, "counters", "device_ops", 0,
                     "host_ops", steps, "ms", "load", 1.0, "prefill", 2.0, "decode", 3.0));
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "ok";
    const char *pidfile = getenv("TG_FAULT_PIDFILE");
    if (pidfile) {
        FILE *f = fopen(pidfile, "a");
        if (f) {
            fprintf(f, "%d\n", (int)getpid());
            fclose(f);
        }
    }
    if (!strcmp(mode, "ignore-term")) signal(SIGTERM, SIG_IGN);
    int decodes = 0;
    if (!strcmp(mode, "fault-stderr")) {
        fprintf(stderr, "starting up\nMemory access fault by GPU node-1 on address 0x0\n");
        fflush(stderr);
    }
    char line[1 << 16];
    while (fgets(line, sizeof line, stdin)) {
        if (!strcmp(mode, "segv-hello")) crash();
        if (!strcmp(mode, "hang") || !strcmp(mode, "ignore-term")) hang();
        if (!strcmp(mode, "exit0")) exit(0);
        if (!strcmp(mode, "child-ignore-term")) {
            pid_t pid = fork();
            if (pid == 0) {
                signal(SIGTERM, SIG_IGN);
                hang();
            }
            exit(0);
        }
        if (!strcmp(mode, "garbage")) {
            printf("this is not JSON {\n");
            fflush(stdout);
            continue;
        }
        json_error_t je;
        json_t *req = json_loads(line, 0, &je);
        const char *op = json_string_value(json_object_get(req, "op"));
        if (!op) {
            answer(json_pack("{s:b,s:s}", "ok", 0, "error", "expected an object with \"op\""));
        } else if (!strcmp(op, "hello")) {
            if (!strcmp(mode, "wrong-fields")) answer(json_pack("{s:b,s:{}}", "ok", 1, "arms"));
            else if (!strcmp(mode, "bigline")) {
                static char chunk[1 << 20];
                memset(chunk, 'x', sizeof chunk);
                for (int i = 0; i < 100; i++) fwrite(chunk, 1, sizeof chunk, stdout);
                printf("\n");
                fflush(stdout);
            } else if (!strcmp(mode, "drip")) {
                for (;;) {
                    putchar('{');
                    fflush(stdout);
                    msleep(50);
                }
            } else
                answer(json_pack("{s:b,s:{s:s,s:s,s:s}}", "ok", 1, "arm", "kind", "test-double", "version",
                                 "fault-arm 1", "device", "none"));
        } else if (!strcmp(op, "load") && !strcmp(mode, "error-load")) {
            answer(json_pack("{s:b,s:s}", "ok", 0, "error", "load: load: \033[31mno such model\033[0m"));
        } else if (!strcmp(op, "load")) {
            answer(json_pack("{s:b,s:{s:s,s:i}}", "ok", 1, "model", "arch", "none", "n_vocab", 200));
        } else if (!strcmp(op, "tokenize")) {
            const char *t = json_string_value(json_object_get(req, "text"));
            json_t *ids = json_array();
            for (const char *p = t ? t : ""; *p; p++) json_array_append_new(ids, json_integer((unsigned char)*p % 50));
            answer(json_pack("{s:b,s:o}", "ok", 1, "ids", ids));
        } else if (!strcmp(op, "detokenize")) {
            answer(json_pack("{s:b,s:s,s:s}", "ok", 1, "text", "AB", "hex", "4142"));
        } else if (!strcmp(op, "decode")) {
            if (!strcmp(mode, "segv-prompt2") && ++decodes == 2) crash();
            decode(mode, req);
        } else if (!strcmp(op, "bye")) {
            json_decref(req);
            break;
        } else {
            answer(json_pack("{s:b,s:s}", "ok", 0, "error", "unknown op"));
        }
        json_decref(req);
    }
    return !strcmp(mode, "exit3") ? 3 : 0;
}
