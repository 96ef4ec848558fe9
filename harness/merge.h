/*
 * merge.h: merging tokgate stores (shards run on several machines) into
 * one. Runs are identified across stores by run.uid (a random id set when
 * the run began, schema version 2); every row is re-keyed on the way in, so
 * autoincrement ids of different stores never collide.
 *
 * Idempotent: a run whose uid the target already holds with the same
 * content (run fields, arms, prompts, legs, steps, verdict sets and rows) is
 * skipped, so merging the same shard twice changes nothing. The same uid
 * with different content is a conflict: an error naming the run, both
 * stores and the first part that differs; the source being merged is then
 * rolled back as a whole (one transaction per source store).
 *
 * Ownership: every pointer argument is borrowed for the call.
 */
#ifndef TG_MERGE_H
#define TG_MERGE_H

#include "store.h"
#include "util.h"

typedef struct merge_stats {
    int runs_added;          /* runs copied into the target */
    int runs_same;           /* runs the target already held, identical */
    int tables_skipped;      /* non-empty tables this tokgate does not know (not copied, warned) */
} merge_stats;

/* Merges every run of the store at src_path into dst (opened with
 * store_open). The source is opened with store_open first (so an older
 * store is migrated in place) and must not be dst's own file. Adds to *ms.
 * Returns 0, or -1 with e (missing or unreadable source, a conflict, a
 * store error); on -1 nothing of this source was written. */
int merge_store(tg_store *dst, const char *src_path, merge_stats *ms, tg_err *e);

/* `tokgate merge A.db B.db ... -o ALL.db`: returns the exit code (0, or 2
 * on a usage error, a missing input or a conflict). */
int merge_main(int argc, char **argv);

#endif
