/*
 * test_fault.c — util/fault, the one registry of test hooks: each point's grammar (a good value
 * switches it on, "" / NULL off), what fault_hit answers for it (seed / after / times of the
 * forward rules, a store flag file appearing and going, a CPU trial path with SIGILL or SIGSEGV, an
 * NCCL rank), malformed values refused with the variable named (and the point left as it was),
 * and fault_init_env reading the environment: a bad variable is an error, not a silent "off".
 * The seams that ask (decode, jobs, backends) are covered by the end-to-end tests that set the
 * variables (tests/http/faults, durable, restart_torture; cli/test_cpu_trial; parallel/emu_tp_robust).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "util/fault.h"

static int fwd(uint64_t seed, int steps) { return fault_hit(FAULT_FORWARD_FAIL, &(fault_at){.seed = seed, .steps = steps}); }

static void test_forward(void) {
    um_err err = {0};
    TEST_CHECK(fwd(9001, 0) == FAULT_HIT_NONE, "off before anything is set");
    TEST_CHECK(fault_set(FAULT_FORWARD_FAIL, "seed=9001;seed=9002,times=2;seed=9003,after=2", &err) == 0, "%s", err.msg);
    for (int k = 0; k < 5; k++) TEST_CHECK(fwd(9001, k) == FAULT_HIT_FAIL, "seed 9001 fails every step (step %d)", k);
    TEST_CHECK(fwd(9002, 0) == FAULT_HIT_FAIL && fwd(9002, 7) == FAULT_HIT_FAIL, "seed 9002: its first two");
    TEST_CHECK(fwd(9002, 8) == FAULT_HIT_NONE, "seed 9002: then spent");
    TEST_CHECK(fwd(9003, 0) == FAULT_HIT_NONE && fwd(9003, 1) == FAULT_HIT_NONE, "seed 9003: not before step 2");
    TEST_CHECK(fwd(9003, 2) == FAULT_HIT_FAIL && fwd(9003, 3) == FAULT_HIT_FAIL, "seed 9003: from step 2 on");
    TEST_CHECK(fwd(1, 0) == FAULT_HIT_NONE, "other seeds never");
    TEST_CHECK(fault_set(FAULT_FORWARD_FAIL, "seed=5,times=0", &err) == 0 && fwd(5, 0) == FAULT_HIT_NONE,
               "times=0: never; the new value replaced the old rules: %d", fwd(9001, 0));
    TEST_CHECK(fwd(9001, 0) == FAULT_HIT_NONE, "old rules gone");
    TEST_CHECK(fault_set(FAULT_FORWARD_FAIL, "seed=18446744073709551615", &err) == 0 && fwd(UINT64_MAX, 0),
               "the largest seed: %s", err.msg);

    const char *bad[] = {"seed=", "seed=x", "seed=-1", "seed=1,after=-1", "seed=1,after=2x", "seed=1,foo=2", "after=2",
                         "after=2,seed=1", "seed=1;", ";seed=1", "seed=1;;seed=2", "seed=1,", "seed=1,times",
                         "seed=1,seed=2", "seed=18446744073709551616", "seed=1 ", "garbage"};
    fault_set(FAULT_FORWARD_FAIL, "seed=77", &err);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&err, 0, sizeof err);
        TEST_CHECK(fault_set(FAULT_FORWARD_FAIL, bad[i], &err) == -1, "'%s' refused", bad[i]);
        TEST_CHECK(err.code == UM_ERR_INVALID_ARG && strcmp(err.param, "UNMASK_FAULT_FORWARD_FAIL") == 0 &&
                       strstr(err.msg, "UNMASK_FAULT_FORWARD_FAIL=") && strstr(err.msg, "seed=S"),
                   "'%s': the message names the variable and the grammar: %s", bad[i], err.msg);
    }
    TEST_CHECK(fwd(77, 0) == FAULT_HIT_FAIL, "a refused value leaves the rules as they were");
    TEST_CHECK(fault_set(FAULT_FORWARD_FAIL, "", &err) == 0 && fwd(77, 0) == FAULT_HIT_NONE, "\"\" switches it off");
}

static void test_store(void) {
    char flag[] = "/tmp/test_fault_flagXXXXXX";
    int fd = mkstemp(flag);
    TEST_CHECK(fd >= 0, "mkstemp");
    close(fd);
    unlink(flag);
    um_err err = {0};
    TEST_CHECK(fault_hit(FAULT_STORE_FAIL, &(fault_at){0}) == FAULT_HIT_NONE, "off");
    TEST_CHECK(fault_set(FAULT_STORE_FAIL, flag, &err) == 0, "%s", err.msg);
    TEST_CHECK(fault_hit(FAULT_STORE_FAIL, &(fault_at){0}) == FAULT_HIT_NONE, "no flag file: writes succeed");
    FILE *f = fopen(flag, "w");
    TEST_CHECK(f != NULL, "create %s", flag);
    if (f) fclose(f);
    TEST_CHECK(fault_hit(FAULT_STORE_FAIL, &(fault_at){0}) == FAULT_HIT_FAIL, "while the file exists: writes fail");
    unlink(flag);
    TEST_CHECK(fault_hit(FAULT_STORE_FAIL, &(fault_at){0}) == FAULT_HIT_NONE, "removed: writes succeed again");
    TEST_CHECK(fault_set(FAULT_STORE_FAIL, NULL, &err) == 0, "NULL switches it off");
}

static int trial(const char *path) { return fault_hit(FAULT_CPU_TRIAL, &(fault_at){.path = path}); }

static void test_cpu_trial(void) {
    um_err err = {0};
    TEST_CHECK(fault_set(FAULT_CPU_TRIAL, "amx", &err) == 0, "%s", err.msg);
    TEST_CHECK(trial("amx") == FAULT_HIT_FAIL && trial("avx512bf16") == FAULT_HIT_NONE, "amx: SIGILL, others run");
    TEST_CHECK(fault_set(FAULT_CPU_TRIAL, "avx512bf16:segv", &err) == 0, "%s", err.msg);
    TEST_CHECK(trial("avx512bf16") == FAULT_HIT_SEGV && trial("amx") == FAULT_HIT_NONE, "avx512bf16:segv: SIGSEGV");
    TEST_CHECK(fault_set(FAULT_CPU_TRIAL, "fp32", &err) == 0, "fp32 (no trial) is accepted: %s", err.msg);
    const char *bad[] = {"avx9", "amx:ill", "amx:", ":segv", "amxx", "AMX"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&err, 0, sizeof err);
        TEST_CHECK(fault_set(FAULT_CPU_TRIAL, bad[i], &err) == -1 && strcmp(err.param, "UNMASK_FAULT_CPU_TRIAL") == 0 &&
                       strstr(err.msg, "amx, avx512bf16"),
                   "'%s' refused, naming the paths: %s", bad[i], err.msg);
    }
    TEST_CHECK(fault_set(FAULT_CPU_TRIAL, "", &err) == 0 && trial("fp32") == FAULT_HIT_NONE, "off");
}

static int nccl(int rank) { return fault_hit(FAULT_NCCL_INIT_RANK, &(fault_at){.rank = rank}); }

static void test_nccl(void) {
    um_err err = {0};
    TEST_CHECK(nccl(0) == FAULT_HIT_NONE, "off: rank 0 is not hit");
    TEST_CHECK(fault_set(FAULT_NCCL_INIT_RANK, "1", &err) == 0, "%s", err.msg);
    TEST_CHECK(nccl(1) == FAULT_HIT_FAIL && nccl(0) == FAULT_HIT_NONE && nccl(2) == FAULT_HIT_NONE, "rank 1 only");
    TEST_CHECK(fault_set(FAULT_NCCL_INIT_RANK, "0", &err) == 0 && nccl(0) == FAULT_HIT_FAIL, "rank 0 can be chosen");
    const char *bad[] = {"-1", "one", "1x", "4096", " 1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&err, 0, sizeof err);
        TEST_CHECK(fault_set(FAULT_NCCL_INIT_RANK, bad[i], &err) == -1 &&
                       strstr(err.msg, "UNMASK_FAULT_NCCL_INIT_RANK=") && strstr(err.msg, "rank"),
                   "'%s' refused: %s", bad[i], err.msg);
    }
    TEST_CHECK(nccl(0) == FAULT_HIT_FAIL, "a refused value keeps the rank set before");
}

static void test_env(void) {
    um_err err = {0};
    fault_reset();
    setenv("UNMASK_FAULT_FORWARD_FAIL", "seed=42,after=1", 1);
    setenv("UNMASK_FAULT_NCCL_INIT_RANK", "3", 1);
    TEST_CHECK(fault_init_env(&err) == 0, "%s", err.msg);
    TEST_CHECK(fwd(42, 0) == FAULT_HIT_NONE && fwd(42, 1) == FAULT_HIT_FAIL && nccl(3) == FAULT_HIT_FAIL,
               "the variables were read");
    TEST_CHECK(trial("amx") == FAULT_HIT_NONE && fault_hit(FAULT_STORE_FAIL, &(fault_at){0}) == FAULT_HIT_NONE,
               "unset variables: off");
    setenv("UNMASK_FAULT_STORE_FAIL", "", 1);   /* empty: off, not an error */
    setenv("UNMASK_FAULT_CPU_TRIAL", "sse9", 1);
    memset(&err, 0, sizeof err);
    TEST_CHECK(fault_init_env(&err) == -1 && strcmp(err.param, "UNMASK_FAULT_CPU_TRIAL") == 0 &&
                   strstr(err.msg, "UNMASK_FAULT_CPU_TRIAL=sse9"),
               "a malformed variable is a start-up error naming it: %s", err.msg);
    fault_reset();
    TEST_CHECK(fwd(42, 5) == FAULT_HIT_NONE && nccl(3) == FAULT_HIT_NONE, "reset: every point off");
    TEST_CHECK(strcmp(fault_name(FAULT_STORE_FAIL), "UNMASK_FAULT_STORE_FAIL") == 0, "names");
}

int main(void) {
    test_forward();
    test_store();
    test_cpu_trial();
    test_nccl();
    test_env();
    fault_reset();
    return test_report();
}
