/*
 * bench.h — `unmask bench` modes. cmd_bench.c dispatches on the first flag:
 *   (default) forward latency/GFLOP/s   --tokenizer   --decode   --serve   --device cuda:N
 * Each mode parses its own flags (argv[0] = "bench") and prints a table. Main thread.
 */
#ifndef UM_BENCH_H
#define UM_BENCH_H

int bench_tokenizer(int argc, char **argv);   /* cli/bench_tokenizer.c */
int bench_decode(int argc, char **argv);      /* cli/bench_decode.c */
int bench_serve(int argc, char **argv);       /* cli/bench_serve.c */
/* --device cuda[:N] anywhere in the flags: device-resident decode steps on an accelerator
 * (cli/bench_device.c) */
int bench_device(int argc, char **argv);

#endif /* UM_BENCH_H */
