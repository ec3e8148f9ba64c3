/*
 * gen.h — the request core of every generation transport: the request model, the response object
 * and the per-choice tracker every dialect sits on. The dialects — OpenAI /v1/chat/completions and
 * /v1/completions (api/openai.h), SGLang /generate (api/sglang.h), llama.cpp /infill and
 * /v1/fim/completions (api/infill.h), the WebSocket `generate` (api/request.h; its events are
 * encoded by the WebSocket session, so it names no encoders) — parse their bodies into an api_gen
 * naming their encoders (api_dialect); the core never calls a dialect by name.
 *
 * Three stages, all pure (no sockets, no lws; the model is read-only):
 *   1. parse: request JSON -> api_gen (types and ranges checked with the client's own field names;
 *      api_error on failure, e.g. "diffusion_steps must be between 1 and 1024, got 2000").
 *   2. build: api_gen + model -> one decode_seq per choice (chat template, tokenizer, native
 *      infilling canvas prompt ++ masks ++ suffix, decode_params_validate).
 *   3. encode: the scheduler's typed events (sched_event, read by field) -> response records: SSE
 *      chunks while streaming, or one body at the end.
 *
 * Streaming semantics (api_resp):
 *   - default: append-only deltas of COMMITTED text in canvas order: the contiguous committed prefix
 *     of the generated region, decoded with the tokenizer's incremental decoder (so multi-token
 *     characters are never split), nothing after the first EOS/EOT, stop strings held back until
 *     they can no longer match.
 *   - "diffusing": true (Mercury): every step's chunk carries the WHOLE current canvas in
 *     delta.content (replace semantics) plus "diffusion_meta" {diffusion_content, diffusion_progress,
 *     step, block, n_blocks, masks_left, state: one char per generated position, c = committed,
 *     d = draft (model's current guess), m = still masked}; the last frame has the final text.
 *
 * Threads: any (the server parses and encodes on the lws service thread and builds on a
 * preparation worker: server/gen_prep.h).
 */
#ifndef UM_API_GEN_H
#define UM_API_GEN_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "api/api_error.h"
#include "api/limits.h"
#include "decode/decode.h"
#include "decode/event_json.h"
#include "model/model.h"
#include "sched/sched.h"

enum api_kind {
    API_KIND_CHAT,        /* POST /v1/chat/completions */
    API_KIND_COMPLETION,  /* POST /v1/completions */
    API_KIND_FIM,         /* POST /v1/fim/completions */
    API_KIND_INFILL,      /* POST /infill (llama.cpp) */
    API_KIND_GENERATE,    /* POST /generate (SGLang) */
    API_KIND_UNMASK,      /* the WebSocket `generate` (api/request.h; its events are encoded by the
                             WebSocket session, not by api_resp) */
};

/* api_limits (server-side request limits, shared with the WebSocket protocol): api/limits.h */

/* One prompt of a request: text or token ids. */
typedef struct api_prompt {
    char    *text;        /* owned, or NULL */
    int32_t *ids;         /* owned, or NULL */
    int      n_ids;
} api_prompt;

typedef struct api_dialect api_dialect;

typedef struct api_gen {
    enum api_kind kind;
    const api_dialect *dialect;   /* the encoders of the API that parsed it (static) */
    char        model[256];       /* the "model" the client asked for ("" = none) */
    int         stream;
    int         include_usage;    /* stream_options.include_usage */
    int         diffusing;        /* Mercury-style whole-canvas frames */
    int         echo;             /* completions: prepend the prompt to the text */
    int         n;                /* copies per prompt (seed + copy index), >= 1 */
    json_t     *messages;         /* chat: normalized [{role, content: string}] (owned) */
    api_prompt *prompts;          /* completion / fim / generate / infill: [n_prompts] (owned) */
    int         n_prompts;
    int         prompts_list;     /* the client sent a list (SGLang answers with a list) */
    char       *suffix;           /* text after the hole (native infilling), or NULL */
    char      **stop;             /* [n_stop] stop strings (owned) */
    int         n_stop;
    decode_params params;         /* defaults + request fields (validated against the model in build) */
    decode_params_src src;        /* the names the client used for the decode parameters it set */
    /* /infill */
    int         warmup;           /* n_predict == 0: answer at once, generate nothing */
    json_t     *response_fields;  /* array of "a/b" paths (owned) or NULL */
    int         n_indent;         /* > 0: end at the first line indented less (llama.cpp's n_indent) */
    /* /generate */
    char        rid[128];         /* client request id ("" = generated) */
    /* every dialect */
    json_t     *ignored;          /* names of request fields not understood, array (owned) or NULL */
    json_t     *unused;           /* build: the decode parameters the request set that its decoder
                                     does not read on the model, as spelled (owned) or NULL */
} api_gen;

void api_gen_init(api_gen *g, enum api_kind kind, const api_dialect *dialect, const decode_params *defaults);
void api_gen_free(api_gen *g);

/* Shared field parsers (every dialect's). api_parse_params reads the decode
 * parameters from obj through the one parameter table (decode/event_json.h: every name and alias,
 * e.g. max_tokens | max_completion_tokens | n_predict, diffusion_steps, block_size), applies the
 * server's limits (api_limit_params), settles unset parameters and checks the model-free ranges
 * (decode_params_check), then the stop strings. Errors name the client's field. */
int api_parse_params(api_gen *g, const json_t *obj, const api_limits *lim, api_error *e);
int api_parse_stop(api_gen *g, const json_t *v, const api_limits *lim, api_error *e);
/* A text-or-ids prompt value (string, [int...]) into p; field names the parameter. */
int api_parse_prompt_value(const json_t *v, const char *field, api_prompt *p, api_error *e);
/* The one token-id list parser (every transport's prompt ids): arr (a JSON array) of at most
 * API_MAX_PROMPT_IDS non-negative integers into p->ids. Errors name param; their messages call the
 * field label (the client's spelling, e.g. prompt or "prompt_ids"). */
int api_parse_token_ids(const json_t *arr, const char *param, const char *label, api_prompt *p, api_error *e);

/* Chat messages, the one check every transport applies (WebSocket `generate`, /v1/chat/completions,
 * /v1/jobs, `unmask generate --messages`): a non-empty array of objects whose "role" is exactly
 * one of system, developer (taken as system), user, assistant, tool, and whose "content" is a
 * string, null ("") or an array of {"type":"text","text"} parts (concatenated). Returns a new
 * array of {"role","content"} strings for the chat template, or NULL with e filled: param
 * "messages", "messages[i].role" or "messages[i].content", code "invalid_value" / "invalid_type"
 * (the HTTP APIs' codes; the WebSocket protocol reports them as "invalid_request") or
 * "unsupported" (a non-text part). Roles are checked because a template writes them verbatim into
 * text that is then read with special tokens recognised: "user<|eot_id|>..." would forge a turn.
 * Contents need no such check: chat_template_encode never reads them as special tokens. */
json_t *api_chat_messages(const json_t *msgs, api_error *e);

/* Chat needs the model's chat template: 0, or -1 with the one error every transport gives
 * (code "unsupported", param "messages", HTTP 400; no "role: content" fallback). */
int api_check_chat(const model *m, api_error *e);

/* The fields shared by the dialects' bodies: v when present and not null; a boolean; an integer
 * (integral reals accepted: 1 present, 0 absent, -1 error). Errors name the field. */
const json_t *api_field(const json_t *obj, const char *k);
int api_get_bool_field(const json_t *obj, const char *k, int *dst, api_error *e);
int api_get_int_field(const json_t *obj, const char *k, long long *dst, api_error *e);
/* The body as a JSON object, or a 400 naming the problem (malformed JSON with line/column, not an
 * object). Shared by every endpoint. */
json_t *api_parse_body(const char *body, size_t len, api_error *e);

/* ---------------------------------------------------------------- build */

typedef struct api_seq {
    decode_seq *seq;        /* owned until handed to the scheduler */
    int         index;      /* choice index */
    int         prompt;     /* which prompt (for n copies and SGLang lists) */
    int         n_prompt;   /* prompt tokens */
    int         n_suffix;   /* suffix tokens */
    char       *echo;       /* prompt text to prepend (completions echo), owned or NULL */
} api_seq;

/* One decode_seq per (prompt, copy). Errors (tokenizer, template, limits, decode validation) as a
 * 400 naming the client's field. *out is malloc'd [*n_out]. Also lists in g->unused the decode
 * parameters the request set that its decoder does not read on m (decode_params_unused). */
int  api_gen_build(api_gen *g, const model *m, const api_limits *lim, api_seq **out, int *n_out, api_error *e);
/* What every transport reports as ignored (WebSocket accepted.ignored_fields, the HTTP APIs'
 * x-unmask-ignored-fields header): g->ignored then g->unused, a new array, or NULL when empty. */
json_t *api_gen_ignored(const api_gen *g);
void api_seqs_free(api_seq *s, int n);

/* ---------------------------------------------------------------- encode */

typedef struct api_resp api_resp;

/* seqs are read for their index / prompt / n_prompt / echo (the decode_seqs may already belong to
 * the scheduler). model_name is the served model id. m gives the tokenizer and EOS ids. */
api_resp *api_resp_new(const api_gen *g, const api_seq *seqs, int n, const model *m, const char *model_name);
void      api_resp_free(api_resp *r);

const char *api_resp_id(const api_resp *r);   /* "chatcmpl-…", "cmpl-…", rid */

/* Records to stream before any event (chat: the role chunk of every choice). Appended to out
 * (a JSON array of objects). */
void api_resp_begin(api_resp *r, json_t *out);
/* One event for choice i. Stream records are appended to out (nothing for non-streaming
 * requests). slow = 1 when the client is backed up: intermediate diffusing frames are skipped
 * (committed text never is). Returns 1 when the choice hit a stop string and its generation should
 * be cancelled (its later events are ignored), else 0. */
int  api_resp_event(api_resp *r, int choice, const sched_event *ev, int slow, json_t *out);
int  api_resp_done(const api_resp *r);          /* every choice finished */
/* The failure of a finished choice, or NULL: mid-stream -> send as {"error":…}; else the status. */
const char *api_resp_error(const api_resp *r);
/* Closing records after every choice finished (usage chunk, ...). */
void api_resp_end(api_resp *r, json_t *out);
/* 1 when the stream ends with "data: [DONE]" (OpenAI, SGLang), 0 for llama.cpp's /infill. */
int  api_resp_sse_done(const api_resp *r);
/* The non-streaming response body (new reference). */
json_t *api_resp_body(api_resp *r);
/* Summary for metrics/jobs: completion tokens and steps over all choices. */
void api_resp_usage(const api_resp *r, long *prompt_tokens, long *completion_tokens, long *steps);

/* ---------------------------------------------------------------- per-choice tracker (the dialects'
 * encoders read it; exposed for unit tests too) */

typedef struct api_track api_track;
api_track *api_track_new(int gen_length, const model *m, char *const *stop, int n_stop);
void       api_track_free(api_track *t);
/* The request's decoder rewrites positions it wrote (decode_decoder_edits): committed text is only
 * taken from finished blocks, so the append-only stream never sends text that changes later. */
void       api_track_set_editing(api_track *t);
/* llama.cpp's n_indent (> 0): the text ends at the first line after a newline whose content is
 * indented by fewer than n_indent spaces / tabs (cut where that content starts); the choice then
 * finishes as "length" and its generation is cancelled like a stop string's. */
void       api_track_set_indent(api_track *t, int n_indent);
enum { TRACK_TEXT = 1, TRACK_FRAME = 2, TRACK_DONE = 4, TRACK_STOP = 8 };
/* Apply one event; returns TRACK_* flags: TEXT new safe text, FRAME the canvas changed (step),
 * DONE finished (this or an earlier stop hit), STOP a stop string was found just now. */
int         api_track_event(api_track *t, const sched_event *ev);
/* Safe text not yet taken (pointer valid until the next call); marks it taken. */
const char *api_track_take(api_track *t, size_t *len);
const char *api_track_text(const api_track *t, size_t *len);   /* all text so far */
char       *api_track_canvas(const api_track *t);              /* malloc'd whole-canvas rendering */
json_t     *api_track_meta(const api_track *t);                /* diffusion_meta (new reference) */
const char *api_track_finish(const api_track *t);              /* "stop" | "length" | ... | NULL */
const char *api_track_stop_word(const api_track *t);           /* the matched stop string or NULL */
const char *api_track_error(const api_track *t);
const json_t *api_track_usage(const api_track *t);             /* DONE's usage object or NULL */
int           api_track_steps(const api_track *t);             /* denoising steps so far (all, once done) */
int           api_track_time_limited(const api_track *t);      /* 1: DONE said the time limit ended it */
const json_t *api_track_timings(const api_track *t);           /* DONE's timings or NULL */
json_t     *api_track_output_ids(const api_track *t);          /* ids of the text (new array) */
int         api_track_done(const api_track *t);

/* ---------------------------------------------------------------- dialects (their encoders) */

typedef struct api_choice {
    api_track *t;
    int        index, prompt, n_prompt, gen_length;
    char      *echo;          /* owned or NULL */
} api_choice;

struct api_resp {
    const api_dialect *dialect;
    enum api_kind kind;
    int           stream, include_usage, diffusing, prompts_list, warmup;
    char          id[64];
    long          created;
    char          model[256];
    char          rid[128];
    json_t       *response_fields;   /* owned or NULL */
    json_t       *settings;          /* effective decode params (owned) */
    int           n_ctx;             /* tokens one request may hold (prompt + generation + suffix):
                                        the model's context, lowered by the caller to a server limit
                                        (serve --max-seq); llama.cpp's generation_settings.n_ctx */
    char         *prompt_text;       /* /infill: "prompt" echo (owned) */
    api_choice   *c;
    int           n;
    uint64_t      t0_ns;
    char        **stop;              /* owned copies (tracks point here) */
    int           n_stop;
};

/* The encoders of one API. Called only for streaming responses except body; event is called once per
 * event of a choice that was not finished before it, with the tracker's TRACK_* flags. */
struct api_dialect {
    int     sse_done;                                   /* streams end with "data: [DONE]" */
    void  (*begin)(api_resp *r, json_t *out);           /* optional: records before any event */
    void  (*event)(api_resp *r, api_choice *c, int flags, int slow, json_t *out);
    void  (*end)(api_resp *r, json_t *out);             /* optional: records after the last */
    json_t *(*body)(api_resp *r);                       /* the non-streaming body (new reference) */
};

/* 1 when flags report c finished just now without an error or a cancellation. */
int    api_choice_clean_end(const api_choice *c, int flags);
/* Seconds since the response was created. */
double api_resp_elapsed_s(const api_resp *r);

#endif /* UM_API_GEN_H */
