/*
 * test_report.c: reports of a scored run, read from the store only. The run
 * is the crafted row set tests/data/transcripts/fourway.json written through
 * the store API; each format is rendered to memory and checked: text (tables
 * and keys), the keys block (order), json (parsed with jansson), junit
 * (well-formed tags, counts), md (identity block, SVG plots), the `step`
 * view, reports of an older verdict set after a rescore, and that the keys
 * are recomputable with the SQL of docs/store.md.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <sqlite3.h>

#include "craft.h"
#include "testenv.h"
#include "report.h"
#include "verdict.h"

typedef struct ctx {
    tg_store *st;
    char path[256];
    int64_t run;
} ctx;

static const char *root_dir(void)
{
    const char *r = getenv("TG_ROOT");
    return r && r[0] ? r : ".";
}

/* Writes the row set of a transcript file into st; returns the run id. */
static int64_t load_transcript(tg_store *st, const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/transcripts/%s", root_dir(), name);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) fail_msg("%s:%d: %s", path, je.line, je.text);
    json_t *jarms = json_object_get(j, "arms");
    craft_arm arms[16];
    int n_arms = (int)json_array_size(jarms);
    for (int i = 0; i < n_arms; i++) {
        json_t *a = json_array_get(jarms, (size_t)i);
        arms[i] = (craft_arm){json_string_value(json_object_get(a, "name")),
                              json_string_value(json_object_get(a, "kind")),
                              json_string_value(json_object_get(a, "role")),
                              json_string_value(json_object_get(a, "config"))};
    }
    json_t *rows = json_object_get(j, "rows");
    const char *reference = json_string_value(json_object_get(j, "reference"));
    int n_prompts = (int)json_array_size(json_object_get(rows, reference));
    int legs = (int)json_integer_value(json_object_get(j, "legs"));
    int64_t run = craft_run(st, json_string_value(json_object_get(j, "spec")),
                            json_string_value(json_object_get(j, "artifact_sha256")),
                            json_string_value(json_object_get(j, "mode")), reference,
                            json_string_value(json_object_get(j, "policy")),
                            json_number_value(json_object_get(j, "band")), legs, n_arms, arms,
                            n_prompts);
    assert_true(run > 0);
    craft_lp ref[16];
    for (int pass = 0; pass < 2; pass++) /* the reference first: others are forced along it */
        for (int i = 0; i < n_arms; i++) {
            int is_ref = !strcmp(arms[i].name, reference);
            if (is_ref != (pass == 0)) continue;
            json_t *ap = json_object_get(rows, arms[i].name);
            craft_lp lp[16];
            for (int p = 0; p < n_prompts; p++) {
                json_t *jp = json_array_get(ap, (size_t)p);
                json_t *tk = json_object_get(jp, "tokens"), *gp = json_object_get(jp, "gaps");
                int32_t t[CRAFT_MAX_STEPS];
                int n = (int)json_array_size(tk);
                for (int s = 0; s < n; s++) t[s] = (int32_t)json_integer_value(json_array_get(tk, (size_t)s));
                lp[p] = craft_prompt(n, t);
                for (int s = 0; s < (int)json_array_size(gp); s++)
                    lp[p].gap[s] = json_number_value(json_array_get(gp, (size_t)s));
                lp[p].text = json_string_value(json_object_get(jp, "text"));
                if (is_ref) ref[p] = lp[p];
                else if (!strcmp(arms[i].role, "custody")) lp[p].n_ids = lp[p].n_dec = 0;
                else craft_force(&lp[p], &ref[p]);
            }
            json_t *a = json_array_get(jarms, (size_t)i);
            craft_legopt o = {.device_ops = json_integer_value(json_object_get(a, "device_ops"))};
            if (craft_legs(st, run, arms[i].name, legs, n_prompts, lp, &o) < 0) fail_msg("craft");
        }
    /* strings borrowed from j were copied by SQLite */
    json_decref(j);
    return run;
}

static int setup(void **state)
{
    ctx *c = calloc(1, sizeof *c);
    c->st = craft_store(c->path);
    if (!c->st) return -1;
    c->run = load_transcript(c->st, "fourway.json");
    verdict_result v;
    tg_err e = {{0}};
    if (verdict_score_run(c->st, c->run, NULL, &v, &e) < 0) {
        fprintf(stderr, "score: %s\n", e.msg);
        return -1;
    }
    *state = c;
    return 0;
}

static int teardown(void **state)
{
    ctx *c = *state;
    craft_store_drop(c->st, c->path);
    free(c);
    return 0;
}

/* Renders a report into a malloc'ed string (caller frees). */
static char *render(ctx *c, report_format f, int set)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    report_options o = {f, set};
    tg_err e = {{0}};
    int rc = report_write(c->st, c->run, &o, m, &e);
    fclose(m);
    if (rc != 0) fail_msg("report_write(%d): %s", (int)f, e.msg);
    return buf;
}

static int occurrences(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

#define HAS(text, s) \
    do { if (!strstr((text), (s))) fail_msg("report lacks \"%s\"", (s)); } while (0)

static void test_text(void **state)
{
    ctx *c = *state;
    char *t = render(c, REPORT_TEXT, 0);
    HAS(t, "\nTOKEN_GATE=FAIL\n");
    HAS(t, "\nARM.cpu.TOKEN_GATE=PASS\n");
    HAS(t, "\nARM.gpu.TOKEN_GATE=FAIL\n");
    HAS(t, "\nCHAIN_OF_CUSTODY=PREFIX\n");
    HAS(t, "engine arms DIFFER; gpu is wrong");
    HAS(t, "engine arms AGREE; the oracles disagree with each other");
    HAS(t, "ORACLE_SPLIT");
    HAS(t, "RANK2");
    HAS(t, "p2/4");  /* in the near-tie set */
    free(t);
}

static void test_keys_block(void **state)
{
    ctx *c = *state;
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    tg_err e = {{0}};
    assert_int_equal(report_write_keys(c->st, c->run, 0, m, &e), 0);
    fclose(m);
    const char *want =
        "TOKEN_GATE=FAIL\n"
        "TOKENIZER_DIVERGENCES=0/4\n"
        "GENERATION_DIVERGENCES=5/24\n"
        "LEGS_CLEAN=4/4\n"
        "LEGS_IDENTICAL=YES\n"
        "ORACLE_REPRO=FIRST\n"
        "CHAIN_OF_CUSTODY=PREFIX\n"
        "REFERENCE_TIER_HITS=0\n"
        "DEVICE_OPS=8192\n";
    if (strncmp(buf, want, strlen(want))) fail_msg("keys block:\n%s\nexpected to start with:\n%s", buf, want);
    HAS(buf, "ARM.gpu.GENERATION_DIVERGENCES=3/12\n");
    HAS(buf, "ARM.cpu.GENERATION_DIVERGENCES=2/12\n");
    HAS(buf, "ARM.stock.CHAIN_OF_CUSTODY=PREFIX\n");
    HAS(buf, "ARM.llama-cpu.ORACLE_REPRO=FIRST\n");
    free(buf);
}

/* The keys are recomputable from the compare rows (docs/store.md). */
static void test_recomputable(void **state)
{
    ctx *c = *state;
    sqlite3_stmt *s;
    assert_int_equal(sqlite3_prepare_v2(store_db(c->st),
                                        "SELECT sum(class <> 'EXACT') || '/' || count(*) FROM v_step_compare"
                                        " WHERE run_id=?1 AND arm IN (SELECT name FROM arm WHERE run_id=?1"
                                        " AND role='test') AND leg=1 AND class <> 'UNCOMPARABLE'",
                                        -1, &s, NULL), SQLITE_OK);
    sqlite3_bind_int64(s, 1, c->run);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(s, 0), "5/24");
    sqlite3_finalize(s);
    assert_int_equal(sqlite3_prepare_v2(store_db(c->st),
                                        "SELECT count(DISTINCT prompt || '/' || step) FROM v_near_tie"
                                        " WHERE run_id=?1", -1, &s, NULL), SQLITE_OK);
    sqlite3_bind_int64(s, 1, c->run);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int(s, 0), 2); /* p1/1 (gap 0.05) and p2/4 (gap 0.1) */
    sqlite3_finalize(s);
}

static void test_json(void **state)
{
    ctx *c = *state;
    char *t = render(c, REPORT_JSON, 0);
    json_error_t je;
    json_t *j = json_loads(t, 0, &je);
    if (!j) fail_msg("json report does not parse: line %d: %s", je.line, je.text);
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "keys"), "TOKEN_GATE")), "FAIL");
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "run"), "artifact_sha256")), "a7f1");
    json_t *arms = json_object_get(j, "arms");
    assert_int_equal(json_array_size(arms), 5);
    json_t *gpu = json_array_get(arms, 2);
    assert_string_equal(json_string_value(json_object_get(gpu, "name")), "gpu");
    json_t *fd = json_object_get(json_array_get(json_object_get(gpu, "prompts"), 0), "first_diff");
    assert_int_equal(json_integer_value(json_object_get(fd, "step")), 1);
    assert_string_equal(json_string_value(json_object_get(fd, "class")), "NEAR_TIE");
    json_t *gk = json_object_get(json_array_get(json_object_get(gpu, "prompts"), 0), "keys");
    assert_string_equal(json_string_value(json_object_get(gk, "FIRST_FAIL")), "3");
    assert_int_equal(json_array_size(json_object_get(j, "contested")), 4);
    json_t *hist = json_object_get(gpu, "rank_histogram");
    assert_int_equal(json_integer_value(json_object_get(hist, "outside")), 1);
    json_decref(j);
    free(t);
}

/* Tags balance (names matched), attributes quoted; enough to call it
 * well-formed for JUnit consumers. */
static void check_xml(const char *x)
{
    char stack[32][64];
    int depth = 0;
    for (const char *p = x; (p = strchr(p, '<'));) {
        if (p[1] == '?') {
            p = strstr(p, "?>");
            assert_non_null(p);
            continue;
        }
        const char *end = p + 1;
        int quoted = 0;
        while (*end && (quoted || *end != '>')) {
            if (*end == '"') quoted = !quoted;
            end++;
        }
        if (!*end) fail_msg("unterminated tag");
        char name[64];
        int close = p[1] == '/', self = end[-1] == '/';
        sscanf(p + 1 + close, "%63[^ />]", name);
        if (close) {
            if (depth == 0 || strcmp(stack[depth - 1], name)) fail_msg("</%s> closes nothing open", name);
            depth--;
        } else if (!self) {
            assert_true(depth < 32);
            snprintf(stack[depth++], 64, "%s", name);
        }
        p = end;
    }
    if (depth) fail_msg("<%s> never closed", stack[depth - 1]);
}

static void test_junit(void **state)
{
    ctx *c = *state;
    char *t = render(c, REPORT_JUNIT, 0);
    assert_int_equal(strncmp(t, "<?xml", 5), 0);
    check_xml(t);
    /* gpu, cpu and llama-aarch64 x two prompts */
    assert_int_equal(occurrences(t, "<testcase "), 6);
    HAS(t, "tests=\"6\" failures=\"2\" errors=\"0\"");
    HAS(t, "first differing step 1");
    HAS(t, "TOKEN_GATE=FAIL");
    free(t);
}

static void test_md(void **state)
{
    ctx *c = *state;
    char *t = render(c, REPORT_MD, 0);
    HAS(t, "## Identity");
    HAS(t, "| artifact sha256 | `a7f1` |");
    HAS(t, "| spec sha256 | `5pec` |");
    HAS(t, "`b1n`");         /* binaries' sha256 */
    HAS(t, "**TOKEN_GATE=FAIL**");
    assert_int_equal(occurrences(t, "<svg "), 2);
    assert_int_equal(occurrences(t, "</svg>"), 2);
    HAS(t, "stroke=\"#d62728\""); /* divergences marked on the gap plot */
    free(t);
}

static void test_step_view(void **state)
{
    ctx *c = *state;
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    tg_err e = {{0}};
    assert_int_equal(report_step(c->st, c->run, "p1", 3, 0, m, &e), 0);
    fclose(m);
    HAS(buf, "engine arms DIFFER; gpu is wrong");
    HAS(buf, "RANK2");
    HAS(buf, "401"); /* gpu's token */
    free(buf);
    m = open_memstream(&buf, &len);
    assert_int_equal(report_step(c->st, c->run, "p1", 0, 0, m, &e), 0);
    fclose(m);
    HAS(buf, "not contested");
    free(buf);
    m = open_memstream(&buf, &len);
    assert_int_equal(report_step(c->st, c->run, "p9", 1, 0, m, &e), -1);
    assert_non_null(strstr(e.msg, "no prompt p9"));
    assert_int_equal(report_step(c->st, c->run, "p1", 999, 0, m, &e), -1);
    assert_non_null(strstr(e.msg, "p1/999"));
    fclose(m);
    free(buf);
    char prompt[64];
    int step;
    assert_int_equal(report_parse_step_ref("p1/45", prompt, &step, &e), 0);
    assert_string_equal(prompt, "p1");
    assert_int_equal(step, 45);
    assert_int_equal(report_parse_step_ref("p1", prompt, &step, &e), -1);
    assert_int_equal(report_parse_step_ref("p1/x", prompt, &step, &e), -1);
    assert_int_equal(report_parse_step_ref("/4", prompt, &step, &e), -1);
    assert_int_equal(report_parse_step_ref("a/b/7", prompt, &step, &e), 0);
    assert_string_equal(prompt, "a/b");
    report_format f;
    assert_int_equal(report_parse_format("junit", &f, &e), 0);
    assert_int_equal(f, REPORT_JUNIT);
    assert_int_equal(report_parse_format("html", &f, &e), -1);
    assert_non_null(strstr(e.msg, "html"));
}

static void test_rescore_keeps_history(void **state)
{
    ctx *c = *state;
    verdict_options o = verdict_options_default();
    o.policy_kind = "exact";
    verdict_result v;
    tg_err e = {{0}};
    assert_int_equal(verdict_score_run(c->st, c->run, &o, &v, &e), 0);
    assert_int_equal(v.set, 2);
    char *now = render(c, REPORT_TEXT, 0), *then = render(c, REPORT_TEXT, 1);
    HAS(now, "ARM.cpu.TOKEN_GATE=FAIL");
    HAS(now, "policy exact");
    HAS(then, "ARM.cpu.TOKEN_GATE=PASS");
    HAS(then, "policy near-tie");
    free(now);
    free(then);
}

static void test_unscored_run(void **state)
{
    ctx *c = *state;
    craft_arm arms[1] = {{"r", "llama", "oracle", NULL}};
    int64_t run = craft_run(c->st, "x", "y", "free", "r", "exact", 0, 1, 1, arms, 1);
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    report_options o = {REPORT_TEXT, 0};
    tg_err e = {{0}};
    assert_int_equal(report_write(c->st, run, &o, m, &e), -1);
    assert_non_null(strstr(e.msg, "no verdicts"));
    assert_int_equal(report_write(c->st, 4242, &o, m, &e), -1);
    assert_non_null(strstr(e.msg, "no run 4242"));
    fclose(m);
    free(buf);
}

/* Control bytes in stored text (a worker's message, a host name) never
 * reach the markup raw: JUnit (XML cannot carry C0 controls at all) and
 * markdown show them as \xNN, so the XML stays well-formed. */
static void test_control_bytes_escaped(void **state)
{
    ctx *c = *state;
    sqlite3_stmt *q;
    assert_int_equal(sqlite3_prepare_v2(store_db(c->st),
                                        "UPDATE verdict SET value = ?2 WHERE run_id = ?1 AND key = 'REASON'",
                                        -1, &q, NULL), SQLITE_OK);
    sqlite3_bind_int64(q, 1, c->run);
    sqlite3_bind_text(q, 2, "bad \x1b[31mred\x1b[0m \x01\x7f end", -1, SQLITE_STATIC);
    assert_int_equal(sqlite3_step(q), SQLITE_DONE);
    sqlite3_finalize(q);
    assert_int_equal(sqlite3_prepare_v2(store_db(c->st), "UPDATE run SET host = 'h\x02st' WHERE id = ?1", -1, &q,
                                        NULL), SQLITE_OK);
    sqlite3_bind_int64(q, 1, c->run);
    assert_int_equal(sqlite3_step(q), SQLITE_DONE);
    sqlite3_finalize(q);
    static const report_format fmts[] = {REPORT_JUNIT, REPORT_MD};
    for (int i = 0; i < 2; i++) {
        char *t = render(c, fmts[i], 0);
        for (const unsigned char *p = (const unsigned char *)t; *p; p++)
            if ((*p < 0x20 && *p != '\n' && *p != '\t' && *p != '\r') || *p == 0x7f)
                fail_msg("format %d: raw control byte 0x%02x at offset %ld", (int)fmts[i], *p,
                         (long)(p - (const unsigned char *)t));
        HAS(t, "bad \\x1b[31mred\\x1b[0m \\x01\\x7f end");
        HAS(t, "h\\x02st");
        if (fmts[i] == REPORT_JUNIT) check_xml(t);
        free(t);
    }
}

TG_TEST_MAIN_WITH(
    setup, teardown, test_text, test_keys_block, test_recomputable, test_json, test_junit, test_md, test_step_view,
    test_rescore_keeps_history, test_unscored_run, test_control_bytes_escaped)
