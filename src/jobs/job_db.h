/*
 * job_db.h — the durable side of the job store: an SQLite file (WAL) that holds every job's state
 * and its event log, written through by jobs.c as they change, and read back when a server starts,
 * so a job accepted with 202 survives a restart, a crash or SIGKILL.
 *
 * The file is held by one server at a time (SQLite's exclusive locking mode): a second server
 * pointed at it fails at start instead of running the same jobs twice. A file that is not an
 * unmask job store, or is damaged, is an error at open — never silently reset; another program's
 * SQLite database is refused before anything is written to it.
 * Durability: WAL with synchronous=NORMAL — every write survives the process dying (crash,
 * SIGKILL); an operating-system crash or power loss may lose the last moments of writes.
 *
 * Not here: what a job is (jobs.c owns the JSON of a job row), sharing jobs between servers
 * (jobs/job_redis.c). jobs.c reaches it through the job_backend seam (jobs/job_backend.h).
 * Threads: not thread-safe; jobs.c calls it under the store's lock.
 */
#ifndef UM_JOB_DB_H
#define UM_JOB_DB_H

#include <stdint.h>

#include "jobs/job_backend.h"
#include "util/err.h"

typedef struct job_db job_db;

/* job_db_open() as a job_backend (jobs/job_backend.h) that owns the file. */
int  job_db_backend_open(const char *path, job_backend **out, um_err *err);

/* Opens (creating when absent, with its directory's parent existing) the store at path, checks it
 * (schema, integrity) and takes it for this process. -1 with err naming path and the problem:
 * in use by another server, not a job store, damaged, unwritable. */
int  job_db_open(const char *path, job_db **out, um_err *err);
void job_db_close(job_db *db);

/* Write-through (errors are logged, not returned: the in-memory store stays authoritative for the
 * running process; /health reports a store that failed a write). */
void job_db_put_job(job_db *db, const char *id, int64_t seq, const char *doc);  /* insert or replace */
void job_db_put_event(job_db *db, const char *id, int64_t eid, const char *doc);
void job_db_drop_events_before(job_db *db, const char *id, int64_t first_kept);
void job_db_delete_job(job_db *db, const char *id);                             /* and its events */

/* Groups the writes between begin and end in one transaction (one WAL commit): the runner wraps
 * each decode step's events in it. Nested calls count. */
void job_db_begin(job_db *db);
void job_db_end(job_db *db);

/* Every job (by seq) and then every event (by job, eid), through the callbacks. -1 with err when
 * the file cannot be read, or a row has columns of the wrong type or a callback refused it: err then
 * names the file, the row (job id, event id), what is wrong and what to do. */
typedef job_backend_job_fn   job_db_job_fn;
typedef job_backend_event_fn job_db_event_fn;
int job_db_load(job_db *db, job_db_job_fn on_job, job_db_event_fn on_event, void *user, um_err *err);

/* Writes that failed since open. */
long job_db_write_errors(job_db *db);
/* While the last transaction failed (until one succeeds again): its error, else NULL. */
const char *job_db_failing(job_db *db);

#endif /* UM_JOB_DB_H */
