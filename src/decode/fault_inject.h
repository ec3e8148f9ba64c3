/*
 * fault_inject.h — TEST HOOK: injected forward failures, for end-to-end tests of the engine-failure
 * path. Off unless the environment variable UNMASK_FAULT_FORWARD_FAIL is set when the server
 * starts (read once). The production scheduler knows nothing of it: the server installs
 * decode_faults_check as sched_opts.step_check only when rules were given.
 *
 * UNMASK_FAULT_FORWARD_FAIL is one or more rules separated by ';':
 *     seed=S[,after=A][,times=K]
 * A batched decode step fails when one of its sequences has decode seed S (a request's `seed`;
 * `n` copies use S, S+1, ...) and has already taken at least A steps (default 0: its first step).
 * times=K: only the first K steps matching that rule fail, then the rule is spent (default: every
 * one). A failing step behaves exactly like a failing backend forward: the step is not run and
 * EVERY sequence of it (its batch-mates too) finishes with DECODE_FINISH_ERROR. A malformed value
 * stops the server (UM_FATAL).
 *
 * Threads: load / free on the main thread; decode_faults_check on any engine thread (the counters
 * are atomic).
 */
#ifndef UM_FAULT_INJECT_H
#define UM_FAULT_INJECT_H

#include "decode/decode.h"
#include "util/err.h"

typedef struct decode_faults decode_faults;

/* The rules of UNMASK_FAULT_FORWARD_FAIL (a warning is logged per rule), or NULL when it is unset
 * or empty. Aborts on a malformed value. */
decode_faults *decode_faults_from_env(void);
/* Free the rules (NULL: no-op). No check may be running. */
void decode_faults_free(decode_faults *f);
/* A sched_check_fn: 0, or -1 + err (UM_ERR_INTERNAL, "forward pass failed (injected by ...)")
 * when a rule says the step over seqs[0..n) fails. user is the decode_faults. */
int  decode_faults_check(void *user, decode_seq **seqs, int n, um_err *err);

#endif /* UM_FAULT_INJECT_H */
