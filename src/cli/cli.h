/*
 * cli.h — the unmask subcommands. Each takes (argc, argv) with argv[0] = the subcommand name and
 * returns the process exit code (0 ok, 1 runtime error, 2 usage error). Main thread.
 */
#ifndef UM_CLI_H
#define UM_CLI_H

/* What every subcommand needs done before the process starts a thread: the test hooks read from
 * the environment (util/fault.h), then the CPU feature probe, whose trials fork a child that starts
 * a thread (in a process whose other threads may hold an allocator lock at the fork, the child can
 * deadlock — seen under AddressSanitizer). 0, or 2 (the exit code) with the message printed when a
 * test hook's variable is malformed. */
int cli_process_init(void);

int cmd_make_model(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_serve(int argc, char **argv);

#endif /* UM_CLI_H */
