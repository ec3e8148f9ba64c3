/*
 * job_db.c — the job store's SQLite file (job_db.h). Called under the job store's lock.
 */
#include "jobs/job_db.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "util/fault.h"
#include "util/log.h"

#define JOB_DB_SCHEMA 1

enum { ST_PUT_JOB, ST_PUT_EVENT, ST_DROP_EVENTS, ST_DEL_JOB, ST_DEL_EVENTS, ST_COUNT_ };

static const char *const k_sql[ST_COUNT_] = {
    "INSERT OR REPLACE INTO jobs(id, seq, doc) VALUES (?1, ?2, ?3)",
    "INSERT OR REPLACE INTO events(job, eid, doc) VALUES (?1, ?2, ?3)",
    "DELETE FROM events WHERE job = ?1 AND eid < ?2",
    "DELETE FROM jobs WHERE id = ?1",
    "DELETE FROM events WHERE job = ?1",
};

struct job_db {
    sqlite3      *db;
    sqlite3_stmt *st[ST_COUNT_];
    int           depth;         /* job_db_begin nesting */
    long          write_errors;  /* writes that failed since open */
    int           failing;       /* the last transaction failed (cleared by the next good one) */
    long          tx_errors;     /* write_errors when the open transaction began */
    char          last_error[200];
    char         *path;          /* owned, for messages */
};

/* A failed write: counted, remembered, logged once per failing period. sqlite_error: take the
 * message from SQLite (else last_error was set by the caller). */
static void write_failed(job_db *d, const char *what, int sqlite_error) {
    if (sqlite_error) snprintf(d->last_error, sizeof d->last_error, "%s", sqlite3_errmsg(d->db));
    if (!d->failing) log_error("job store %s: %s failed: %s", d->path, what, d->last_error);
    d->write_errors++;
    d->failing = 1;
}

/* The test hook FAULT_STORE_FAIL (util/fault.h): this write fails as a failing SQLite write would. */
static int fault_now(job_db *d) {
    if (!fault_hit(FAULT_STORE_FAIL, &(fault_at){0})) return 0;
    snprintf(d->last_error, sizeof d->last_error, "injected by %s", fault_name(FAULT_STORE_FAIL));
    return 1;
}

/* err for a statement that failed while the file is opened or read back: rc its extended result
 * code, msg its message. */
static int store_failed(job_db *d, int rc, const char *msg, um_err *err) {
    if ((rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED)
        return um_err_set(err, UM_ERR_IO,
                          "job store %s is in use by another unmask server; give each server its own --store "
                          "sqlite:PATH",
                          d->path);
    if ((rc & 0xff) == SQLITE_NOTADB || (rc & 0xff) == SQLITE_CORRUPT)
        return um_err_set(err, UM_ERR_FORMAT,
                          "job store %s is not a valid SQLite database (damaged, or another file): %s; move it "
                          "away to start with an empty store (nothing is reset automatically)",
                          d->path, msg);
    return um_err_set(err, UM_ERR_IO, "job store %s: %s", d->path, msg);
}

static int exec(job_db *d, const char *sql, um_err *err) {
    char *msg = NULL;
    if (sqlite3_exec(d->db, sql, NULL, NULL, &msg) == SQLITE_OK) return 0;
    if (err) store_failed(d, sqlite3_extended_errcode(d->db), msg ? msg : sqlite3_errmsg(d->db), err);
    sqlite3_free(msg);
    return -1;
}

/* Before anything is written to an opened file: one that holds tables but no job store's is
 * another program's database, refused untouched. */
static int check_owner(job_db *d, um_err *err) {
    sqlite3_stmt *q = NULL;
    char tables[160] = "";
    int n = 0, ours = 0;
    int rc = sqlite3_prepare_v2(d->db, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name", -1, &q, NULL);
    while (rc == SQLITE_OK || rc == SQLITE_ROW) {
        if ((rc = sqlite3_step(q)) != SQLITE_ROW) break;
        const char *name = (const char *)sqlite3_column_text(q, 0);
        if (!name) continue;
        if (strcmp(name, "meta") == 0) ours = 1;
        size_t at = strlen(tables);
        if (at + 1 < sizeof tables) snprintf(tables + at, sizeof tables - at, "%s%s", n ? ", " : "", name);
        n++;
    }
    if (rc != SQLITE_DONE) { /* not a database, damaged, or held by another server */
        store_failed(d, sqlite3_extended_errcode(d->db), sqlite3_errmsg(d->db), err);
        sqlite3_finalize(q);
        return -1;
    }
    sqlite3_finalize(q);
    if (ours) {
        int stamped = 0;
        if (sqlite3_prepare_v2(d->db, "SELECT 1 FROM meta WHERE key = 'unmask_job_store'", -1, &q, NULL) == SQLITE_OK)
            stamped = sqlite3_step(q) == SQLITE_ROW;
        sqlite3_finalize(q);
        ours = stamped;
    }
    if (n > 0 && !ours)
        return um_err_set(err, UM_ERR_FORMAT,
                          "job store %s is an SQLite database of another program (tables: %s), not an unmask job "
                          "store; it was left as it is: give --store a file of its own",
                          d->path, tables);
    return 0;
}

/* Schema version and integrity of an opened file; creates the tables in a new one. */
static int check_schema(job_db *d, um_err *err) {
    if (exec(d, "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                "CREATE TABLE IF NOT EXISTS jobs(id TEXT PRIMARY KEY, seq INTEGER NOT NULL, doc TEXT NOT NULL);"
                "CREATE TABLE IF NOT EXISTS events(job TEXT NOT NULL, eid INTEGER NOT NULL, doc TEXT NOT NULL, "
                "PRIMARY KEY(job, eid)) WITHOUT ROWID;"
                "INSERT OR IGNORE INTO meta(key, value) VALUES ('unmask_job_store', '1');",
             err) != 0)
        return -1;
    sqlite3_stmt *q = NULL;
    int ok = 0;
    if (sqlite3_prepare_v2(d->db, "SELECT value FROM meta WHERE key = 'unmask_job_store'", -1, &q, NULL) == SQLITE_OK &&
        sqlite3_step(q) == SQLITE_ROW)
        ok = atoi((const char *)sqlite3_column_text(q, 0)) == JOB_DB_SCHEMA;
    sqlite3_finalize(q);
    if (!ok)
        return um_err_set(err, UM_ERR_FORMAT,
                          "job store %s has another schema version than %d (another version of unmask wrote it): "
                          "start that version on it, or move it away to start with an empty store",
                          d->path, JOB_DB_SCHEMA);
    char *res = NULL;
    if (sqlite3_prepare_v2(d->db, "PRAGMA quick_check", -1, &q, NULL) == SQLITE_OK && sqlite3_step(q) == SQLITE_ROW)
        res = strdup((const char *)sqlite3_column_text(q, 0));
    sqlite3_finalize(q);
    int good = res && strcmp(res, "ok") == 0;
    if (!good)
        um_err_set(err, UM_ERR_FORMAT,
                   "job store %s is damaged (integrity check: %s); move it away to start with an empty store "
                   "(nothing is reset automatically)",
                   d->path, res ? res : "failed");
    free(res);
    return good ? 0 : -1;
}

int job_db_open(const char *path, job_db **out, um_err *err) {
    *out = NULL;
    job_db *d = xcalloc(1, sizeof *d);
    d->path = xstrdup(path);
    if (sqlite3_open_v2(path, &d->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL) !=
        SQLITE_OK) {
        um_err_set(err, UM_ERR_IO, "cannot open the job store %s: %s", path, d->db ? sqlite3_errmsg(d->db) : "no memory");
        job_db_close(d);
        return -1;
    }
    /* exclusive: the lock is taken by the first write below and held while the server runs */
    if (exec(d, "PRAGMA locking_mode=EXCLUSIVE", err) != 0 || check_owner(d, err) != 0 ||
        exec(d, "PRAGMA journal_mode=WAL", err) != 0 ||
        exec(d, "PRAGMA synchronous=NORMAL", err) != 0 || exec(d, "BEGIN EXCLUSIVE; COMMIT;", err) != 0 ||
        check_schema(d, err) != 0) {
        job_db_close(d);
        return -1;
    }
    for (int i = 0; i < ST_COUNT_; i++)
        if (sqlite3_prepare_v3(d->db, k_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &d->st[i], NULL) != SQLITE_OK) {
            um_err_set(err, UM_ERR_FORMAT,
                       "job store %s does not have the tables of a job store (%s); it was changed by another program: "
                       "move it away to start with an empty store (nothing is reset automatically)",
                       path, sqlite3_errmsg(d->db));
            job_db_close(d);
            return -1;
        }
    *out = d;
    return 0;
}

void job_db_close(job_db *d) {
    if (!d) return;
    while (d->depth > 0) job_db_end(d);
    for (int i = 0; i < ST_COUNT_; i++) sqlite3_finalize(d->st[i]);
    if (d->db) sqlite3_close(d->db);
    free(d->path);
    free(d);
}

/* Runs prepared statement i with (text a, int64 b, text c) bound where given. */
static void run(job_db *d, int i, const char *a, int64_t b, const char *c) {
    sqlite3_stmt *s = d->st[i];
    if (fault_now(d)) {
        write_failed(d, "write", 0);
        return;
    }
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    sqlite3_bind_text(s, 1, a, -1, SQLITE_STATIC);
    if (sqlite3_bind_parameter_count(s) >= 2) sqlite3_bind_int64(s, 2, b);
    if (c) sqlite3_bind_text(s, 3, c, -1, SQLITE_STATIC);
    if (sqlite3_step(s) != SQLITE_DONE) {
        write_failed(d, "write", 1);
    }
    sqlite3_reset(s);
}

void job_db_put_job(job_db *d, const char *id, int64_t seq, const char *doc) { run(d, ST_PUT_JOB, id, seq, doc); }
void job_db_put_event(job_db *d, const char *id, int64_t eid, const char *doc) { run(d, ST_PUT_EVENT, id, eid, doc); }
void job_db_drop_events_before(job_db *d, const char *id, int64_t first) { run(d, ST_DROP_EVENTS, id, first, NULL); }

void job_db_delete_job(job_db *d, const char *id) {
    run(d, ST_DEL_JOB, id, 0, NULL);
    run(d, ST_DEL_EVENTS, id, 0, NULL);
}

void job_db_begin(job_db *d) {
    if (d->depth++ > 0) return;
    d->tx_errors = d->write_errors;
    if (exec(d, "BEGIN", NULL) != 0) {
        write_failed(d, "begin", 1);
    }
}

void job_db_end(job_db *d) {
    if (d->depth == 0 || --d->depth > 0) return;
    int injected = fault_now(d);
    if (injected || exec(d, "COMMIT", NULL) != 0) {
        write_failed(d, "commit", !injected);
        sqlite3_exec(d->db, "ROLLBACK", NULL, NULL, NULL);
    } else if (d->write_errors == d->tx_errors && d->failing) {
        d->failing = 0;
        log_info("job store %s: writes work again", d->path);
    }
}

const char *job_db_failing(job_db *d) { return d && d->failing ? d->last_error : NULL; }

/* A refused row: e (what is wrong with it) becomes one message in err naming the file, the row and
 * what to do. what: "job" or "event N of job". */
static int row_refused(job_db *d, const char *what, const char *id, const um_err *e, um_err *err) {
    char shown[48], key[64]; /* the id as it can be printed (a damaged one may hold anything); its SQL */
    size_t n = 0;
    for (const char *p = id ? id : ""; *p && n < 40; p++) shown[n++] = *p > ' ' && *p < 127 && *p != '\'' ? *p : '?';
    shown[n] = 0;
    if (id) snprintf(key, sizeof key, "= '%s'", shown);
    else snprintf(key, sizeof key, "IS NULL");
    return um_err_set(err, UM_ERR_FORMAT,
                      "job store %s: %s '%s': %s. The file is damaged or was changed by another program; nothing is "
                      "changed automatically: move the file away to start with an empty store, or delete that job "
                      "(DELETE FROM jobs WHERE id %s; DELETE FROM events WHERE job %s) and start again",
                      d->path, what, id ? shown : "(null)", e->msg, key, key);
}

/* Hands every row of query q (text key, integer number, text doc) to fn; what names a row in
 * messages ("job", "event"). */
static int load_rows(job_db *d, const char *sql, const char *what, job_db_job_fn fn, void *user, um_err *err) {
    sqlite3_stmt *q = NULL;
    int rc = sqlite3_prepare_v2(d->db, sql, -1, &q, NULL);
    if (rc != SQLITE_OK) return store_failed(d, sqlite3_extended_errcode(d->db), sqlite3_errmsg(d->db), err);
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        /* types first: reading a column as another type converts it */
        int typed = sqlite3_column_type(q, 0) == SQLITE_TEXT && sqlite3_column_type(q, 1) == SQLITE_INTEGER &&
                    sqlite3_column_type(q, 2) == SQLITE_TEXT;
        const char *key = (const char *)sqlite3_column_text(q, 0);
        um_err e = {0};
        if (typed && fn(user, key, sqlite3_column_int64(q, 1), (const char *)sqlite3_column_text(q, 2), &e) == 0) continue;
        if (!typed) um_err_set(&e, UM_ERR_FORMAT, "its row has a column of the wrong type");
        char row[64];
        if (strcmp(what, "event") == 0) snprintf(row, sizeof row, "event %lld of job", (long long)sqlite3_column_int64(q, 1));
        else snprintf(row, sizeof row, "%s", what);
        row_refused(d, row, key, &e, err);
        sqlite3_finalize(q);
        return -1;
    }
    if (rc != SQLITE_DONE) store_failed(d, sqlite3_extended_errcode(d->db), sqlite3_errmsg(d->db), err);
    sqlite3_finalize(q);
    return rc == SQLITE_DONE ? 0 : -1;
}

int job_db_load(job_db *d, job_db_job_fn on_job, job_db_event_fn on_event, void *user, um_err *err) {
    if (load_rows(d, "SELECT id, seq, doc FROM jobs ORDER BY seq", "job", on_job, user, err) != 0) return -1;
    return load_rows(d, "SELECT job, eid, doc FROM events ORDER BY job, eid", "event", on_event, user, err);
}

long job_db_write_errors(job_db *d) { return d ? d->write_errors : 0; }

/* ---------------------------------------------------------------- as a job_backend */

static job_db *ctx(job_backend *b) { return b->context; }
static void be_free(job_backend *b) {
    job_db_close(ctx(b));
    free(b);
}
static void be_put_job(job_backend *b, const char *id, int64_t seq, const char *owner, const char *doc, int terminal) {
    (void)owner, (void)terminal;
    job_db_put_job(ctx(b), id, seq, doc);
}
static void be_put_event(job_backend *b, const char *id, int64_t eid, const char *doc) { job_db_put_event(ctx(b), id, eid, doc); }
static void be_drop(job_backend *b, const char *id, int64_t first) { job_db_drop_events_before(ctx(b), id, first); }
static void be_delete(job_backend *b, const char *id) { job_db_delete_job(ctx(b), id); }
static void be_begin(job_backend *b) { job_db_begin(ctx(b)); }
static void be_end(job_backend *b) { job_db_end(ctx(b)); }
static long be_errors(job_backend *b) { return job_db_write_errors(ctx(b)); }
static const char *be_failing(job_backend *b) { return job_db_failing(ctx(b)); }
static int be_load(job_backend *b, job_backend_job_fn on_job, job_backend_event_fn on_event, void *user, um_err *err) {
    return job_db_load(ctx(b), on_job, on_event, user, err);
}

static const struct job_backend_i k_sqlite_iface = {
    .name = "sqlite",
    .free = be_free,
    .put_job = be_put_job,
    .put_event = be_put_event,
    .drop_events_before = be_drop,
    .delete_job = be_delete,
    .begin = be_begin,
    .end = be_end,
    .write_errors = be_errors,
    .failing = be_failing,
    .load = be_load,
};

int job_db_backend_open(const char *path, job_backend **out, um_err *err) {
    job_db *d = NULL;
    *out = NULL;
    if (job_db_open(path, &d, err) != 0) return -1;
    job_backend *b = xcalloc(1, sizeof *b);
    b->iface = &k_sqlite_iface;
    b->context = d;
    *out = b;
    return 0;
}
