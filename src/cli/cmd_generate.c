/*
 * cmd_generate.c — `unmask generate`: one prompt (text through the chat template, a messages file,
 * or token ids) decoded on the CPU backend with the decode loop (decode/decode.h). Output: the
 * final text; with --json one JSON event per line (decode/event_json.h, the server's fields); on a
 * terminal a live view where masked positions resolve into text step by step.
 * On --device cuda:N the device-resident loop (decode/decode_device.h) runs the sequence when it
 * supports its parameters (--device-loop off forces the host loop); else decode_step.
 * --suffix / --suffix-ids infill natively (canvas = prompt ++ masks ++ suffix, decode_seq_create_infill).
 * Does not: batch several prompts (bench --decode does). Main thread.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "api/request.h"
#include "backend/backend.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "cli/decode_flags.h"
#include "cli/tp_cli.h"
#include "decode/decode.h"
#include "decode/decode_device.h"
#include "decode/event_json.h"
#include "text/chat_template.h"
#include "model/model.h"
#include "text/tokenizer.h"
#include "util/json_util.h"
#include "util/log.h"
#include "util/strbuf.h"

/* ---------------------------------------------------------------- live view */

typedef struct live_view {
    int     n_prompt, G;
    int     has_tok;     /* 0: show committed positions as token ids */
    char  **piece;       /* [G] committed piece per generated position (owned), NULL = masked */
    int    *special;     /* [G] */
    int     rows;        /* terminal rows the last frame used */
    int     width;
    strbuf  frame;       /* scratch: the frame being drawn */
} live_view;

/* Terminal rows a text occupies (code points as one column each; escape sequences skipped). */
static int lv_count_rows(const char *s, int width) {
    int rows = 1, col = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == 0x1b) {
            while (*p && *p != 'm') p++;
            if (!*p) break;
            continue;
        }
        if (*p == '\n') {
            rows++, col = 0;
            continue;
        }
        if ((*p & 0xC0) == 0x80) continue;
        if (++col > width) rows++, col = 1;
    }
    return rows;
}

static void lv_draw(live_view *lv, const char *status, int final_text, const char *text) {
    strbuf_reset(&lv->frame);
    if (final_text) {
        strbuf_puts(&lv->frame, text);
    } else {
        for (int i = 0; i < lv->G; i++) {
            if (!lv->piece[i]) strbuf_put(&lv->frame, "\x1b[2m\xe2\x96\x91\x1b[0m", 11); /* dim ░ */
            else if (!lv->special[i] || !lv->has_tok) strbuf_puts(&lv->frame, lv->piece[i]);
        }
    }
    if (status) {
        strbuf_put(&lv->frame, "\n\x1b[2m", 5);
        strbuf_puts(&lv->frame, status);
        strbuf_put(&lv->frame, "\x1b[0m", 4);
    }
    /* back to the frame's first row, clear, redraw */
    if (lv->rows > 1) printf("\x1b[%dA", lv->rows - 1);
    printf("\r\x1b[J%s", lv->frame.p);
    fflush(stdout);
    lv->rows = lv_count_rows(lv->frame.p, lv->width);
}

/* ---------------------------------------------------------------- sink */

typedef struct gen_out {
    int        json;
    live_view *lv;          /* NULL = plain output */
    int        finish_code; /* enum decode_finish at DONE */
    int        quiet;
} gen_out;

static void on_event(void *user, const decode_event *ev) {
    gen_out *o = user;
    if (o->json) {
        json_t *j = decode_event_to_json(ev);
        char *s = json_dumps(j, UM_JSON_COMPACT);
        fputs(s, stdout);
        fputc('\n', stdout);
        fflush(stdout);
        free(s);
        json_decref(j);
    }
    live_view *lv = o->lv;
    if (ev->type == DECODE_EVENT_STEP && lv) {
        for (int i = 0; i < ev->n_commits; i++) {
            int k = ev->commits[i].index;
            free(lv->piece[k]);
            if (lv->has_tok) {
                lv->piece[k] = xstrdup(ev->commits[i].piece);
            } else {
                char id[24];
                snprintf(id, sizeof id, "%d ", ev->commits[i].token);
                lv->piece[k] = xstrdup(id);
            }
            lv->special[k] = ev->commits[i].special;
        }
        char st[160];
        snprintf(st, sizeof st, "step %d · block %d/%d · %d masked", ev->step + 1, ev->block + 1, ev->n_blocks,
                 ev->masks_left);
        lv_draw(lv, st, 0, NULL);
    }
    if (ev->type == DECODE_EVENT_DONE) {
        o->finish_code = ev->finish;
        if (lv) {
            lv_draw(lv, NULL, lv->has_tok, ev->text);
            printf("\n");
        } else if (!o->json) {
            fwrite(ev->text, 1, ev->text_len, stdout);
            printf("\n");
        }
        if (!o->json && !o->quiet)
            fprintf(stderr, "[%s · %d tokens · %d steps · %.1f ms · %.1f tokens/s]\n", decode_finish_name(ev->finish),
                    ev->usage.completion_tokens, ev->usage.steps, ev->timings.total_ms, ev->timings.tokens_per_s);
    }
}

/* ---------------------------------------------------------------- prompt */

/* --FLAG 1,2,3 -> token ids (*ids malloc'd, *n). 0, or 2 (usage error, printed). */
static int parse_ids_flag(const char *flag, const char *ids_s, int32_t **ids, int *n) {
    int *v = NULL;
    int k = args_parse_int_list(flag, ids_s, &v);
    if (k < 0) return 2;
    *ids = xmalloc((size_t)k * sizeof **ids);
    for (int i = 0; i < k; i++) (*ids)[i] = v[i];
    *n = k;
    free(v);
    return 0;
}

static int build_prompt(const model *m, const char *prompt, const char *messages_file, const char *ids_s, int raw,
                        int32_t **ids, int *n) {
    int given = (prompt != NULL) + (messages_file != NULL) + (ids_s != NULL);
    if (given != 1) {
        fprintf(stderr, "error: give exactly one of --prompt, --messages or --prompt-ids\n");
        return 2;
    }
    if (ids_s) return parse_ids_flag("prompt-ids", ids_s, ids, n);
    if (!m->tok) {
        fprintf(stderr, "error: the model at %s has no tokenizer; pass token ids with --prompt-ids\n", m->dir);
        return 2;
    }
    um_err err = {0};
    json_t *msgs = NULL;
    if (messages_file) {
        json_error_t jerr;
        msgs = json_load_file(messages_file, 0, &jerr);
        if (!msgs || !json_is_array(msgs)) {
            fprintf(stderr, "error: --messages %s: %s\n", messages_file,
                    msgs ? "expected a JSON array of {\"role\", \"content\"} objects" : jerr.text);
            json_decref(msgs);
            return 2;
        }
        api_error ae;
        json_t *checked = api_chat_messages(msgs, &ae); /* the APIs' check: roles, contents */
        json_decref(msgs);
        if (!checked) {
            fprintf(stderr, "error: --messages %s: %s\n", messages_file, ae.message);
            return 2;
        }
        msgs = checked;
        if (api_check_chat(m, &ae) != 0) { /* the servers' refusal, in their words */
            fprintf(stderr, "error: --messages %s: %s\n", messages_file, ae.message);
            json_decref(msgs);
            return 2;
        }
    } else if (m->chat && !raw) {
        msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", prompt);
    }
    size_t nn = 0;
    int rc;
    if (msgs) { /* message contents are never read as special tokens */
        rc = chat_template_encode(m->chat, m->tok, msgs, 1, ids, &nn, &err);
        json_decref(msgs);
        if (rc != 0) {
            fprintf(stderr, "error: chat template: %s\n", err.msg);
            return 2;
        }
    } else {
        rc = tokenizer_encode(m->tok, prompt, strlen(prompt), 1, ids, &nn, &err);
    }
    if (rc != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 2;
    }
    *n = (int)nn;
    return 0;
}

/* --suffix TEXT (raw code: special-token strings are plain text, as the infill APIs do) or
 * --suffix-ids 1,2,3: the fixed text after the generated hole. 0 or 2 (usage error, printed). */
static int build_suffix(const model *m, const char *text, const char *ids_s, int32_t **ids, int *n) {
    if (text && ids_s) {
        fprintf(stderr, "error: give only one of --suffix, --suffix-ids\n");
        return 2;
    }
    if (ids_s) return parse_ids_flag("suffix-ids", ids_s, ids, n);
    if (!m->tok) {
        fprintf(stderr, "error: the model at %s has no tokenizer; pass token ids with --suffix-ids\n", m->dir);
        return 2;
    }
    um_err err = {0};
    size_t nn = 0;
    if (tokenizer_encode(m->tok, text, strlen(text), 0, ids, &nn, &err) != 0) {
        fprintf(stderr, "error: --suffix: %s\n", err.msg);
        return 2;
    }
    *n = (int)nn;
    return 0;
}

/* ---------------------------------------------------------------- command */

/* Every flag of `unmask generate`, as parsed (NULL / 0 = not given); the decode parameters' flags
 * come from their table (cli/decode_flags.h). */
typedef struct gen_opts {
    const char  *model_dir, *prompt, *messages, *ids_s, *suffix_s, *suffix_ids_s;
    int          raw, json, threads, no_live, quiet, tp;
    const char  *device, *cpu_kernels, *cpu_pin, *cuda_fuse, *cuda_skinny, *device_loop, *quant_s;
    enum dtype   quant;   /* --quant, parsed */
    decode_flags decode;
} gen_opts;

/* Sets every option to its "not given" value (or the command's default). */
static void gen_opts_init(gen_opts *o) {
    memset(o, 0, sizeof *o);
    o->tp = 1;
    o->device = "cpu";
    o->device_loop = "on";
}

/* Parses argv into o. -1 to go on, else the exit code (0 after --help, 2 on a parse error). */
static int gen_opts_parse(gen_opts *o, int argc, char **argv) {
    const arg_spec head[] = {
        {"model", ARG_STR, &o->model_dir, "checkpoint directory or GGUF file [required]"},
        {"prompt", ARG_STR, &o->prompt,
         "prompt text, wrapped in the chat template when the model has one (the APIs' prompt is raw; see --raw)"},
        {"messages", ARG_STR, &o->messages, "JSON file: an array of {\"role\", \"content\"} messages"},
        {"prompt-ids", ARG_STR, &o->ids_s, "prompt as comma-separated token ids, e.g. 1,2,3"},
        {"raw", ARG_FLAG, &o->raw, "use --prompt as is, without the chat template"},
        {"suffix", ARG_STR, &o->suffix_s, "infill: text after the generated hole (canvas = prompt ++ masks ++ suffix)"},
        {"suffix-ids", ARG_STR, &o->suffix_ids_s, "infill: the suffix as comma-separated token ids"},
    };
    const arg_spec tail[] = {
        {"json", ARG_FLAG, &o->json, "print one JSON event per line"},
        {"no-live", ARG_FLAG, &o->no_live, "no live view even on a terminal"},
        {"quiet", ARG_FLAG, &o->quiet, "no summary line on stderr"},
        {"threads", ARG_INT, &o->threads, "CPU threads (0 = all cores) [0]"},
        {"device", ARG_STR, &o->device, "cpu | cuda | cuda:N, with --tp a GPU list cuda:0,cuda:1 [cpu]"},
        {"tp", ARG_INT, &o->tp, "tensor-parallel ranks (CPU threads or GPUs, docs/parallel.md) [1]"},
        {"cpu-kernels", ARG_STR, &o->cpu_kernels, CLI_CPU_KERNELS_HELP},
        {"cpu-pin", ARG_STR, &o->cpu_pin, CLI_CPU_PIN_HELP},
        {"cuda-fuse", ARG_STR, &o->cuda_fuse, CLI_CUDA_FUSE_HELP},
        {"cuda-skinny", ARG_STR, &o->cuda_skinny, CLI_CUDA_SKINNY_HELP},
        {"quant", ARG_STR, &o->quant_s, CLI_QUANT_HELP},
        {"device-loop", ARG_STR, &o->device_loop,
         "CUDA: on = device-resident decode loop where supported, off = host loop [on]"},
    };
    arg_spec specs[sizeof head / sizeof head[0] + DECODE_PARAMS_MAX + sizeof tail / sizeof tail[0] + 1];
    int n = 0;
    for (size_t i = 0; i < sizeof head / sizeof head[0]; i++) specs[n++] = head[i];
    decode_flags_specs(&o->decode, specs, &n);
    for (size_t i = 0; i < sizeof tail / sizeof tail[0]; i++) specs[n++] = tail[i];
    specs[n] = (arg_spec){NULL, 0, NULL, NULL};
    int r = args_parse(argc, argv,
                       "usage: unmask generate --model DIR (--prompt TEXT | --messages FILE | --prompt-ids 1,2,3)\n"
                       "                       [decode options] [--json] [--threads N]\n\n"
                       "Generates with a diffusion LM (CPU, or CUDA with --device). Defaults come from the checkpoint's\n"
                       "generation_config.json where present; the decode options are the request parameters of the\n"
                       "server's APIs (--gen-length = gen_length), with the same ranges. See docs/decode.md.",
                       specs);
    if (r != 0) return r > 0 ? 0 : 2;
    return -1;
}

/* Checks the flags that need no model (and applies --cpu-kernels). 0, or 2 with the message printed. */
static int gen_opts_validate(gen_opts *o) {
    if (cli_cpu_kernels_apply(o->cpu_kernels) != 0 ||
        cli_backend_options_apply(o->cpu_pin, o->cuda_fuse, o->cuda_skinny) != 0 ||
        cli_quant_parse(o->quant_s, &o->quant) != 0)
        return 2;
    if (!o->model_dir) {
        fprintf(stderr, "error: --model DIR is required (see --help)\n");
        return 2;
    }
    if (strcmp(o->device_loop, "on") != 0 && strcmp(o->device_loop, "off") != 0) {
        fprintf(stderr, "error: --device-loop must be on or off, got '%s'\n", o->device_loop);
        return 2;
    }
    if (o->threads < 0) {
        fprintf(stderr, "error: --threads must be >= 0, got %d\n", o->threads);
        return 2;
    }
    return 0;
}

/* Overrides the model's decode defaults in *p with the flags given, read like a request's fields
 * with the checks the servers apply, in their order and words: the request limits at their
 * defaults (api/limits.h: a length 1 ... 8192, steps 0 ... 1024), settle, the model-free ranges
 * (the model's own checks follow in decode_seq_create). 0, or 2 with the message printed. */
static int gen_params_apply(const gen_opts *o, decode_params *p) {
    json_t *j = decode_flags_to_json(&o->decode);
    if (!j) return 2;
    decode_params_src src = {0};
    um_err err = {0};
    api_limits lim = api_limits_default();
    int rc = decode_params_apply_json(p, j, &src, &err);
    json_decref(j);
    if (rc == 0) rc = api_limit_params(&lim, p, &src, &err);
    if (rc == 0) {
        decode_params_settle(p, &src);
        rc = decode_params_check(p, &err);
    }
    if (rc != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 2;
    }
    return 0;
}

/* Sets up the live view for G generated positions, sized to the terminal on stdout. */
static void lv_open(live_view *lv, int n_prompt, int G, int has_tok) {
    struct winsize ws;
    lv->width = ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : 80;
    lv->n_prompt = n_prompt;
    lv->has_tok = has_tok;
    lv->G = G;
    lv->piece = xcalloc((size_t)lv->G, sizeof *lv->piece);
    lv->special = xcalloc((size_t)lv->G, sizeof *lv->special);
    lv->rows = 1;
}

/* Frees what lv_open allocated (a zeroed, never-opened view too). */
static void lv_free(live_view *lv) {
    if (lv->piece)
        for (int i = 0; i < lv->G; i++) free(lv->piece[i]);
    free(lv->piece);
    free(lv->special);
    strbuf_free(&lv->frame);
}

/* Decodes s to the end: the device-resident loop when asked for and eligible, else the host loop.
 * 0, or -1 with err. */
static int gen_run(model_ctx *ctx, decode_seq *s, int device_loop, const decode_sink *sink, um_err *err) {
    if (!device_loop || !decode_device_eligible(ctx, s)) return decode_generate(ctx, s, sink, err);
    decode_device *dd = decode_device_create(ctx, 1);
    int gen_rc = 0;
    while (!decode_seq_done(s))
        if ((gen_rc = decode_device_step(dd, &s, 1, sink, err)) != 0) break;
    decode_device_stats ds;
    decode_device_get_stats(dd, &ds);
    log_debug("device loop: %llu steps, %llu graph captures, %llu replays", (unsigned long long)ds.steps,
              (unsigned long long)ds.graph_captures, (unsigned long long)ds.graph_replays);
    decode_device_free(dd);
    return gen_rc;
}

int cmd_generate(int argc, char **argv) {
    gen_opts o;
    gen_opts_init(&o);
    int r = gen_opts_parse(&o, argc, argv);
    if (r >= 0) return r;
    if (gen_opts_validate(&o) != 0) return 2;

    um_err err = {0};
    model m;
    if (model_load(o.model_dir, &m, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    m.quant = o.quant;
    int rc = 2;
    int32_t *ids = NULL, *sfx = NULL;
    int n_ids = 0, n_sfx = 0;
    decode_seq *s = NULL;
    cli_model_ctx mc;
    int mc_open = 0;
    live_view lv;
    memset(&lv, 0, sizeof lv);

    decode_params p = decode_params_for_model(&m);
    if (gen_params_apply(&o, &p) != 0) goto done;
    if ((rc = build_prompt(&m, o.prompt, o.messages, o.ids_s, o.raw, &ids, &n_ids)) != 0) goto done;
    if ((o.suffix_s || o.suffix_ids_s) && (rc = build_suffix(&m, o.suffix_s, o.suffix_ids_s, &sfx, &n_sfx)) != 0)
        goto done;
    rc = 2;
    if (n_ids == 0 && n_sfx == 0) { /* the servers' check, in their words */
        fprintf(stderr, "error: the prompt is empty\n");
        goto done;
    }
    s = n_sfx ? decode_seq_create_infill(&m, &p, ids, n_ids, sfx, n_sfx, &err) : decode_seq_create(&m, &p, ids, n_ids, &err);
    if (!s) {
        fprintf(stderr, "error: %s\n", err.msg);
        rc = err.code == UM_ERR_INVALID_ARG ? 2 : 1;
        goto done;
    }

    rc = 1;
    if (cli_model_ctx_open(&mc, &m, o.device, o.tp, o.threads, (uint64_t)decode_seq_max_forward_tokens(s),
                           (uint64_t)decode_seq_kv_rows(s), &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        rc = cli_model_ctx_exit_code(&err);
        goto done;
    }
    mc_open = 1;
    gen_out out = {.json = o.json, .quiet = o.quiet};
    if (!o.json && !o.no_live && isatty(STDOUT_FILENO)) {
        lv_open(&lv, n_ids, p.gen_length, m.tok != NULL);
        out.lv = &lv;
    }
    decode_sink sink = {on_event, &out};
    if (gen_run(mc.ctx, s, strcmp(o.device_loop, "on") == 0, &sink, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        decode_seq_finish(s, DECODE_FINISH_ERROR, err.msg, &sink);
    } else {
        rc = 0;
    }
done:
    decode_seq_free(s);   /* before its ctx: a sequence still holding KV slots closes them there */
    s = NULL;
    if (mc_open) cli_model_ctx_close(&mc);
    decode_thread_scratch_free();
    lv_free(&lv);
    decode_seq_free(s);
    free(ids);
    free(sfx);
    model_free(&m);
    return rc;
}
