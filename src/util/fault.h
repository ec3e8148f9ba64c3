/*
 * fault.h — TEST HOOKS: the one registry of fault points, the seams where a test may make the
 * process fail on purpose (a decode step's forward, a job-store write, a CPU kernel path's trial,
 * an NCCL rank's init). Each point is one environment variable, parsed once when the process
 * starts (fault_init_env, called by main before anything else runs); a malformed value is a
 * start-up error naming the variable. docs/reliability.md ("Test hooks") lists them; the table in
 * fault.c is the only place that parses them.
 * Not here: what a failure does. Each layer asks fault_hit() at its seam and, on a hit, fails there
 * exactly as it would for a real failure; nothing else in the process changes when a point is on
 * (the scheduler runs the same schedule). A process that never calls fault_init_env (unit tests,
 * tools) has every point off unless it calls fault_set.
 * Threads: fault_init_env / fault_set / fault_reset on the main thread while no other thread asks;
 * fault_hit on any thread (the rules are read-only then, their counters atomic).
 */
#ifndef UM_FAULT_H
#define UM_FAULT_H

#include <stdint.h>

#include "util/err.h"

enum fault_point {
    FAULT_FORWARD_FAIL,     /* UNMASK_FAULT_FORWARD_FAIL: decode steps fail like a failing forward */
    FAULT_STORE_FAIL,       /* UNMASK_FAULT_STORE_FAIL: job-store writes fail while a file exists */
    FAULT_CPU_TRIAL,        /* UNMASK_FAULT_CPU_TRIAL: a CPU kernel path's start-up trial faults */
    FAULT_NCCL_INIT_RANK,   /* UNMASK_FAULT_NCCL_INIT_RANK: one rank's NCCL init fails */
    FAULT_POINT_COUNT,
};

/* What a seam knows when it asks; each point reads its own fields and ignores the rest. */
typedef struct fault_at {
    uint64_t    seed;   /* FORWARD_FAIL: the sequence's decode seed */
    int         steps;  /* FORWARD_FAIL: decode steps the sequence has taken before this one */
    int         rank;   /* NCCL_INIT_RANK: the global rank being initialised */
    const char *path;   /* CPU_TRIAL: the kernel path being tried ("amx", "avx512bf16", ...) */
} fault_at;

/* fault_hit's answer. */
enum fault_hit_kind {
    FAULT_HIT_NONE = 0,   /* no failure here */
    FAULT_HIT_FAIL = 1,   /* fail (CPU_TRIAL: the trial dies of SIGILL) */
    FAULT_HIT_SEGV = 2,   /* CPU_TRIAL only: the trial dies of SIGSEGV */
};

/* Every point from its environment variable (unset or "" = off); FORWARD_FAIL and STORE_FAIL log a
 * TEST HOOK warning when on (the others' failures name their variable where they happen). 0, or
 * -1 + err (UM_ERR_INVALID_ARG, param = the variable) for the first malformed value; the points
 * parsed before it stay on. */
int  fault_init_env(um_err *err);
/* Point p from value (NULL or "" = off), replacing what it had. 0, or -1 + err as above (p keeps
 * its previous rules). */
int  fault_set(enum fault_point p, const char *value, um_err *err);
/* Every point off. */
void fault_reset(void);
/* Whether the seam described by at fails now (enum fault_hit_kind). A FORWARD_FAIL rule with
 * times=K counts this call as one of its K. */
int  fault_hit(enum fault_point p, const fault_at *at);
/* The point's environment variable ("UNMASK_FAULT_FORWARD_FAIL"), for messages. */
const char *fault_name(enum fault_point p);

#endif /* UM_FAULT_H */
