/*
 * bench_tokenizer.c — `unmask bench --tokenizer`: load time, encode and decode throughput (MB/s of
 * UTF-8 text, tokens/s) of a model's tokenizer on one thread, over --file or a generated English-
 * like text (common words plus random words so the word cache also misses), and the streaming
 * decoder. Prints a table. Does not: check correctness (tests do). Main thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cli/args.h"
#include "cli/bench.h"
#include "model/model.h"
#include "text/tokenizer.h"
#include "util/fileio.h"
#include "util/log.h"
#include "util/rng.h"
#include "util/timeutil.h"

/* CPU time of this thread: the benchmark is "one core", and the machine may be shared. */
static uint64_t cpu_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static double cpu_ms_since(uint64_t t0) { return (double)(cpu_now_ns() - t0) * 1e-6; }

static const char *const WORDS[] = {
    "the", "of", "and", "to", "a", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are", "with", "as",
    "I", "his", "they", "be", "at", "one", "have", "this", "from", "or", "had", "by", "not", "word", "but", "what",
    "some", "we", "can", "out", "other", "were", "all", "there", "when", "up", "use", "your", "how", "said", "an",
    "each", "she", "which", "do", "their", "time", "if", "will", "way", "about", "many", "then", "them", "write",
    "would", "like", "so", "these", "her", "long", "make", "thing", "see", "him", "two", "has", "look", "more",
    "day", "could", "go", "come", "did", "number", "sound", "no", "most", "people", "my", "over", "know", "water",
    "than", "call", "first", "who", "may", "down", "side", "been", "now", "find", "model", "diffusion", "token",
    "server", "stream", "language", "masked", "decoder", "block", "answer", "question", "because", "through",
    "between", "important", "without", "government", "understand", "information", "development", "experience",
};

static char *generate_text(size_t target, size_t *len) {
    char *buf = xmalloc(target + 64);
    size_t n = 0;
    uint64_t i = 0;
    int sentence_start = 1;
    while (n < target) {
        uint64_t r = rng_u64(99, i, 0);
        i++;
        char word[32];
        int wl;
        if (r % 10 < 8) {
            wl = snprintf(word, sizeof word, "%s", WORDS[(r >> 8) % (sizeof WORDS / sizeof WORDS[0])]);
        } else if (r % 10 == 8) { /* a random word: the cache cannot help */
            wl = 3 + (int)((r >> 8) % 8);
            for (int k = 0; k < wl; k++) word[k] = (char)('a' + (rng_u64(98, i, (uint64_t)k) % 26));
            word[wl] = 0;
        } else {
            wl = snprintf(word, sizeof word, "%u", (unsigned)((r >> 8) % 10000));
        }
        if (sentence_start && word[0] >= 'a' && word[0] <= 'z') word[0] = (char)(word[0] - 32);
        memcpy(buf + n, word, (size_t)wl);
        n += (size_t)wl;
        sentence_start = 0;
        uint64_t p = (r >> 20) % 40;
        if (p == 0) buf[n++] = '.', buf[n++] = '\n', sentence_start = 1;
        else if (p < 3) buf[n++] = '.', buf[n++] = ' ', sentence_start = 1;
        else if (p < 6) buf[n++] = ',', buf[n++] = ' ';
        else buf[n++] = ' ';
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* Best times (ms of thread CPU time) of the timed phases. */
typedef struct bt_times {
    double enc, enc_cold, dec, stream;
} bt_times;

/* Encodes text reps times: the ids (*ids, *n) of the last pass, t->enc_cold (first pass) and t->enc (best).
 * 0, or -1 with err. */
static int bt_time_encode(tokenizer *tok, const char *text, size_t len, int reps, int32_t **ids, size_t *n,
                          bt_times *t, um_err *err) {
    t->enc = 1e30;
    for (int it = 0; it < reps; it++) {
        free(*ids);
        *ids = NULL;
        uint64_t t0 = cpu_now_ns();
        if (tokenizer_encode(tok, text, len, 1, ids, n, err) != 0) return -1;
        double ms = cpu_ms_since(t0);
        if (it == 0) t->enc_cold = ms;
        if (ms < t->enc) t->enc = ms;
    }
    return 0;
}

/* Decodes ids reps times (t->dec: best), then streams them reps times (t->stream: best; checked
 * against the decoded length). Returns the decoded length in bytes. */
static size_t bt_time_decode(tokenizer *tok, const int32_t *ids, size_t n, int reps, bt_times *t) {
    size_t out_len = 0;
    t->dec = t->stream = 1e30;
    for (int it = 0; it < reps; it++) {
        char *out;
        uint64_t t0 = cpu_now_ns();
        tokenizer_decode(tok, ids, n, 0, &out, &out_len);
        double ms = cpu_ms_since(t0);
        free(out);
        if (ms < t->dec) t->dec = ms;
    }
    for (int it = 0; it < reps; it++) {
        tok_stream s;
        tok_stream_init(&s, tok, 0);
        size_t total = 0;
        uint64_t t0 = cpu_now_ns();
        for (size_t i = 0; i < n; i++) {
            const char *p;
            size_t l;
            tok_stream_push(&s, ids[i], &p, &l);
            total += l;
        }
        const char *p;
        size_t l;
        tok_stream_flush(&s, &p, &l);
        double ms = cpu_ms_since(t0);
        tok_stream_free(&s);
        CHECK(total + l == out_len);
        if (ms < t->stream) t->stream = ms;
    }
    return out_len;
}

/* Prints the table rows of the four phases and the summary line. */
static void bt_print(const bt_times *t, size_t len, size_t n, size_t out_len) {
    double mbytes = (double)len / 1e6, mtok = (double)n / 1e6;
    printf("%-22s %10.1f %12.1f %14.2f %12.2f\n", "encode (first pass)", t->enc_cold, mbytes / (t->enc_cold * 1e-3),
           mtok / (t->enc_cold * 1e-3), (double)len / (double)(n ? n : 1));
    printf("%-22s %10.1f %12.1f %14.2f %12.2f\n", "encode (warm cache)", t->enc, mbytes / (t->enc * 1e-3),
           mtok / (t->enc * 1e-3), (double)len / (double)(n ? n : 1));
    printf("%-22s %10.1f %12.1f %14.2f\n", "decode", t->dec, (double)out_len / 1e6 / (t->dec * 1e-3),
           mtok / (t->dec * 1e-3));
    printf("%-22s %10.1f %12.1f %14.2f\n", "decode (streaming)", t->stream, (double)out_len / 1e6 / (t->stream * 1e-3),
           mtok / (t->stream * 1e-3));
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("\n%zu tokens; peak RSS %.0f MiB\n", n, (double)ru.ru_maxrss / 1024.0);
}

int bench_tokenizer(int argc, char **argv) {
    const char *dir = NULL, *file = NULL;
    int reps = 3, mb = 4;
    arg_spec specs[] = {
        {"model", ARG_STR, &dir, "checkpoint directory (tokenizer.json or vocab.json + merges.txt) or GGUF file [required]"},
        {"file", ARG_STR, &file, "text to encode (default: generated English-like text)"},
        {"mb", ARG_INT, &mb, "size of the generated text in MB [4]"},
        {"reps", ARG_INT, &reps, "timed repetitions (best is reported) [3]"},
        {NULL, 0, NULL, NULL},
    };
    int r = args_parse(argc, argv, "usage: unmask bench --tokenizer --model DIR [--file F] [--reps N]\n\n"
                                   "Tokenizer throughput on one thread: load, encode, decode, streaming decode.",
                       specs);
    if (r != 0) return r > 0 ? 0 : 2;
    if (!dir) {
        fprintf(stderr, "error: --model DIR is required (see --help)\n");
        return 2;
    }
    if (reps < 1 || mb < 1 || mb > 1024) {
        fprintf(stderr, "error: --reps must be >= 1 and --mb between 1 and 1024\n");
        return 2;
    }
    um_err err = {0};
    char *text;
    size_t len;
    if (file) {
        if (file_read_all(file, (size_t)1 << 31, &text, &len, &err) != 0) {
            fprintf(stderr, "error: %s\n", err.msg);
            return 1;
        }
    } else {
        text = generate_text((size_t)mb << 20, &len);
    }
    uint64_t t0 = time_now_ns();
    tokenizer *tok;
    const int lrc = model_tokenizer_load(dir, &tok, NULL, &err);
    if (lrc != 0 || !tok) {
        fprintf(stderr, "error: %s\n", lrc != 0 ? err.msg : "the model has no tokenizer");
        free(text);
        return 1;
    }
    double load_ms = time_ms_since(t0);
    printf("unmask bench (tokenizer): %s — %d ids; text: %s, %.2f MB; load %.0f ms; best of %d, thread CPU time\n\n", dir,
           tokenizer_n_vocab(tok), file ? file : "generated English-like", (double)len / 1e6, load_ms, reps);
    printf("%-22s %10s %12s %14s %12s\n", "phase", "ms", "MB/s", "Mtokens/s", "bytes/token");

    bt_times t = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 0;
    if (bt_time_encode(tok, text, len, reps, &ids, &n, &t, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        rc = 1;
    } else {
        size_t out_len = bt_time_decode(tok, ids, n, reps, &t);
        bt_print(&t, len, n, out_len);
    }
    free(ids);
    free(text);
    tokenizer_free(tok);
    return rc;
}
