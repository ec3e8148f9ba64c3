/*
 * args.h — a tiny "--name value" / "--name=value" / "--flag" parser shared by the subcommands.
 * Main thread only. Errors print one line to stderr and return -1 (the command exits 2).
 */
#ifndef UM_ARGS_H
#define UM_ARGS_H

enum arg_type { ARG_STR, ARG_INT, ARG_FLOAT, ARG_FLAG };

typedef struct arg_spec {
    const char   *name;     /* without the leading "--" */
    enum arg_type type;
    void         *dst;      /* const char ** / int * / double * / int * */
    const char   *help;     /* one line, shown by --help */
} arg_spec;

/* Parses argv[1..argc). Returns 0, 1 if --help was printed, -1 on error (message printed).
 * usage: first line(s) of --help. specs end with a {NULL} entry. */
int args_parse(int argc, char **argv, const char *usage, const arg_spec *specs);
void args_print_help(const char *usage, const arg_spec *specs);

/* "1,2,3" -> malloc'd int array; returns count or -1 (message printed, names the flag). */
int args_parse_int_list(const char *flag, const char *s, int **out);

#endif /* UM_ARGS_H */
