/*
 * event_json.c — decode events and parameters <-> JSON (event_json.h). Pure; any thread.
 */
#include "decode/event_json.h"

#include <ctype.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

static json_t *str_n(const char *s, size_t n) {
    json_t *j = json_stringn(s ? s : "", s ? n : 0);
    return j ? j : json_string("");   /* invalid UTF-8 cannot happen: pieces/text are sanitized */
}

static json_t *real_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *usage_json(const decode_usage *u) {
    return json_pack("{s:i, s:i, s:i, s:i, s:i}", "prompt_tokens", u->prompt_tokens, "completion_tokens",
                     u->completion_tokens, "total_tokens", u->prompt_tokens + u->completion_tokens, "steps", u->steps,
                     "committed", u->committed);
}

/* One committed or drafted token: {"pos","index","id","text","confidence","special"}. */
static json_t *token_json(int pos, int index, int token, const char *piece, float confidence, int special) {
    json_t *j = json_object();
    json_object_set_new(j, "pos", json_integer(pos));
    json_object_set_new(j, "index", json_integer(index));
    json_object_set_new(j, "id", json_integer(token));
    json_object_set_new(j, "text", str_n(piece, piece ? strlen(piece) : 0));
    json_object_set_new(j, "confidence", real_or_null(confidence));
    json_object_set_new(j, "special", json_boolean(special));
    return j;
}

json_t *decode_event_to_json(const decode_event *ev) {
    json_t *o = json_object();
    switch (ev->type) {
    case DECODE_EVENT_STEP: {
        json_object_set_new(o, "type", json_string("step"));
        json_object_set_new(o, "step", json_integer(ev->step));
        json_object_set_new(o, "block", json_integer(ev->block));
        json_object_set_new(o, "n_blocks", json_integer(ev->n_blocks));
        json_t *cs = json_array();
        for (int i = 0; i < ev->n_commits; i++) {
            const decode_commit *c = &ev->commits[i];
            json_t *j = token_json(c->pos, c->index, c->token, c->piece, c->confidence, c->special);
            if (c->revised) { /* an editing decoder rewrote a position written before */
                json_object_set_new(j, "revised", json_true());
                json_object_set_new(j, "previous", json_integer(c->previous));
            }
            json_array_append_new(cs, j);
        }
        json_object_set_new(o, "commits", cs);
        if (ev->n_drafts > 0) {
            json_t *ds = json_array();
            for (int i = 0; i < ev->n_drafts; i++) {
                const decode_draft *d = &ev->drafts[i];
                json_array_append_new(ds, token_json(d->pos, d->index, d->token, d->piece, d->confidence, d->special));
            }
            json_object_set_new(o, "drafts", ds);
        }
        json_object_set_new(o, "progress",
                            json_pack("{s:i, s:i, s:i, s:i}", "steps", ev->step + 1, "masks_left", ev->masks_left,
                                      "block_masks_left", ev->block_masks_left, "committed", ev->usage.committed));
        break;
    }
    case DECODE_EVENT_BLOCK:
        json_object_set_new(o, "type", json_string("block"));
        json_object_set_new(o, "block", json_integer(ev->block));
        json_object_set_new(o, "n_blocks", json_integer(ev->n_blocks));
        json_object_set_new(o, "start", json_integer(ev->block_start));
        json_object_set_new(o, "end", json_integer(ev->block_end));
        json_object_set_new(o, "text", str_n(ev->text, ev->text_len));
        json_object_set_new(o, "steps", json_integer(ev->step));
        json_object_set_new(o, "block_steps", json_integer(ev->block_steps));
        break;
    case DECODE_EVENT_DONE:
        json_object_set_new(o, "type", json_string("done"));
        json_object_set_new(o, "finish_reason", json_string(decode_finish_name(ev->finish)));
        json_object_set_new(o, "text", str_n(ev->text, ev->text_len));
        json_object_set_new(o, "error", ev->error ? json_string(ev->error) : json_null());
        json_object_set_new(o, "usage", usage_json(&ev->usage));
        json_object_set_new(o, "timings",
                            json_pack("{s:o, s:o, s:o, s:o}", "first_event_ms", real_or_null(ev->timings.first_event_ms),
                                      "total_ms", real_or_null(ev->timings.total_ms), "decode_ms",
                                      real_or_null(ev->timings.decode_ms), "tokens_per_s",
                                      real_or_null(ev->timings.tokens_per_s)));
        break;
    }
    return o;
}

/* ---------------------------------------------------------------- params */

/* The value v of field key (present, not null) into *dst; a message naming key when it does not fit. */
static int get_int(const json_t *v, const char *key, int *dst, um_err *err) {
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (x < -2147483647 || x > 2147483647)
            return um_err_param(err, key, "%s is out of range, got %lld", key, (long long)x);
        *dst = (int)x;
        return 0;
    }
    if (json_is_real(v)) {
        double x = json_real_value(v);
        if (x == floor(x) && fabs(x) < 2147483647.0) {
            *dst = (int)x;
            return 0;
        }
    }
    return um_err_param(err, key, "%s must be an integer", key);
}

static int get_num(const json_t *v, const char *key, double *dst, um_err *err) {
    if (!json_is_number(v)) return um_err_param(err, key, "%s must be a number", key);
    *dst = json_number_value(v);
    return 0;
}

static int get_bool(const json_t *v, const char *key, int *dst, um_err *err) {
    if (!json_is_boolean(v)) return um_err_param(err, key, "%s must be true or false", key);
    *dst = json_is_true(v);
    return 0;
}

/* ---------------------------------------------------------------- decode parameters as JSON */

/* How a decode parameter is written in JSON. */
enum dp_type { DP_INT, DP_NUM, DP_BOOL, DP_SEED, DP_DECODER, DP_LAYOUT, DP_CACHE };

/* One decode parameter: the one list of them. decode_params_apply_json reads the rows in order
 * (so type errors are reported in this order), decode_params_to_json writes them, the CLI makes
 * its flags from them (decode_param_at). Value ranges are decode_params_validate's, the same for
 * every transport. */
typedef struct dp_field {
    const char  *name;       /* canonical JSON name */
    enum dp_type type;
    size_t       off;        /* offsetof(decode_params, field) */
    const char  *flag;       /* CLI flag without "--" */
    int          flag_value; /* DP_BOOL: the value the (valueless) flag sets */
    const char  *help;       /* one line for --help, default in brackets */
} dp_field;

#define DPF(f) offsetof(decode_params, f)
static const dp_field k_fields[] = {
    {"gen_length", DP_INT, DPF(gen_length), "gen-length", 0, "generated positions (masks) [128]"},
    {"block_length", DP_INT, DPF(block_length), "block-length", 0,
     "block length B [32, at most the generation length]"},
    {"steps", DP_INT, DPF(steps), "steps", 0, "fixed-step decoders: total steps, 0 = gen-length [0]"},
    {"steps_per_block", DP_INT, DPF(steps_per_block), "steps-per-block", 0,
     "fixed-step decoders (LLaDA2: also threshold): steps of every block, overriding steps; 0 = unset [0]"},
    {"decoder", DP_DECODER, DPF(decoder), "decoder", 0,
     "low_confidence | random | threshold | factor | hierarchy | credit | origin | maskgit_plus | topk_margin | "
     "entropy | joint_threshold | hierarchy_block [low_confidence; Dream checkpoints: their alg]"},
    {"threshold", DP_NUM, DPF(threshold), "threshold", 0,
     "threshold/credit/hierarchy_block: tau, hierarchy: tau_high; in (0,1] [0.9]"},
    {"factor", DP_NUM, DPF(factor), "factor", 0, "factor decoder: f > 0 [1.0]"},
    {"low_threshold", DP_NUM, DPF(low_threshold), "low-threshold", 0, "hierarchy decoder: tau_low in [0,1], 0 = off [0]"},
    {"credit_alpha", DP_NUM, DPF(credit_alpha), "credit-alpha", 0, "credit decoder: alpha (logit boost) in [0,100] [0.7]"},
    {"credit_gamma", DP_NUM, DPF(credit_gamma), "credit-gamma", 0, "credit decoder: gamma (credit p^gamma) in [0,100] [0.2]"},
    {"credit_decay", DP_NUM, DPF(credit_decay), "credit-decay", 0, "credit decoder: beta (decay per step) in [0,1] [0.8]"},
    {"alg_temp", DP_NUM, DPF(alg_temp), "alg-temp", 0,
     "Dream decoders: sample positions from softmax(confidence / alg_temp), 0 = most confident; in [0,100] [0]"},
    {"eps", DP_NUM, DPF(eps), "eps", 0, "Dream decoders: last timestep of linspace(1, eps, steps+1), in (0,1) [0.001]"},
    {"edit_threshold", DP_NUM, DPF(edit_threshold), "edit-threshold", 0,
     "joint_threshold: confidence a rewrite of a written position needs, in [0,1] [0]"},
    {"max_post_steps", DP_INT, DPF(max_post_steps), "max-post-steps", 0,
     "joint_threshold: edit-only steps after a block's last mask, 0..1000 [16]"},
    {"sub_block_length", DP_INT, DPF(sub_block_length), "sub-block-length", 0,
     "hierarchy_block: positions per sub-block, decoded in order [8]"},
    {"token_shift", DP_INT, DPF(token_shift), "token-shift", 0,
     "hierarchy_block: 1 = position p predicted from logits row p-1 (first block position inherited), 0 = row p [1]"},
    {"temperature", DP_NUM, DPF(temperature), "temperature", 0, "sampling temperature in [0,2], 0 = greedy [0]"},
    {"top_k", DP_INT, DPF(top_k), "top-k", 0, "sample among the k best tokens, 0 or -1 = off [0]"},
    {"top_p", DP_NUM, DPF(top_p), "top-p", 0, "nucleus mass in (0,1], 1 = off [1]"},
    {"seed", DP_SEED, DPF(seed), "seed", 0, "random seed (non-negative 63-bit integer) [0]"},
    {"cfg_scale", DP_NUM, DPF(cfg_scale), "cfg-scale", 0, "classifier-free guidance scale in [0,100], 0 = off [0]"},
    {"logits_eos_inf", DP_BOOL, DPF(logits_eos_inf), "logits-eos-inf", 1, "never sample EOS (logits[eos] = -inf)"},
    {"confidence_eos_eot_inf", DP_BOOL, DPF(confidence_eos_eot_inf), "confidence-eos-eot-inf", 1,
     "reference quirk: confidence without <|eot_id|>"},
    {"block_layout", DP_LAYOUT, DPF(layout), "block-layout", 0, "llada (blocks after the prompt) | aligned [llada]"},
    {"stop_at_eos", DP_BOOL, DPF(stop_at_eos), "no-stop-at-eos", 0, "decode every block even after EOS"},
    {"stream_drafts", DP_BOOL, DPF(stream_drafts), "drafts", 1, "step events carry drafts for masked positions"},
    {"draft_every", DP_INT, DPF(draft_every), "draft-every", 0, "drafts every N steps [1]"},
    {"cache", DP_CACHE, DPF(cache), "cache", 0, "KV cache across steps: none | prefix | dual | vicinity [none]"},
    {"cache_refresh", DP_INT, DPF(cache_refresh), "cache-refresh", 0,
     "also refresh the cache every N steps inside a block, 0 = only at block start [0]"},
    {"prefix_look", DP_INT, DPF(prefix_look), "prefix-look", 0, "vicinity: positions before the block recomputed each step [0]"},
    {"after_look", DP_INT, DPF(after_look), "after-look", 0, "vicinity: positions after the block recomputed each step [0]"},
    {"warmup_steps", DP_INT, DPF(warmup_steps), "warmup-steps", 0, "with a cache: the first N steps run without it [0]"},
    {"prefill_chunk", DP_INT, DPF(prefill_chunk), "prefill-chunk", 0,
     "block-diffusion models with a cache: rows per prompt-prefill forward (whole blocks), 0 = one forward [256]"},
};
#undef DPF
#define N_FIELDS ((int)(sizeof k_fields / sizeof k_fields[0]))
_Static_assert(sizeof k_fields / sizeof k_fields[0] <= DECODE_PARAMS_MAX, "raise DECODE_PARAMS_MAX");

/* Other names the APIs accept for a parameter. An alias row is read before its parameter's own
 * name, so the canonical name wins when a body has both. */
enum { ALIAS_NEG_UNSET = 1 };   /* a negative value means "not given" (llama.cpp's n_predict -1) */
static const struct {
    const char *name, *canonical;
    int         flags;
} k_aliases[] = {
    {"max_tokens", "gen_length", 0},             /* OpenAI */
    {"max_completion_tokens", "gen_length", 0},  /* OpenAI, newer */
    {"max_new_tokens", "gen_length", 0},         /* Hugging Face, SGLang */
    {"n_predict", "gen_length", ALIAS_NEG_UNSET}, /* llama.cpp */
    {"block_size", "block_length", 0},           /* SGLang, Fast-dLLM */
    {"sub_block_size", "sub_block_length", 0},   /* SGLang HierarchyBlock */
    {"diffusion_steps", "steps", 0},             /* Inception / Mercury */
    {"alg", "decoder", 0},                       /* Dream's diffusion_generate */
    {"drafts", "stream_drafts", 0},              /* the WebSocket protocol's short name */
};

static int field_index(const char *name) {
    for (int i = 0; i < N_FIELDS; i++)
        if (strcmp(k_fields[i].name, name) == 0) return i;
    return -1;
}

/* Reads the value v of field f, under the JSON name `name`, into p. */
static int field_apply(const dp_field *f, const char *name, decode_params *p, const json_t *v, um_err *err) {
    void *dst = (char *)p + f->off;
    switch (f->type) {
    case DP_INT: return get_int(v, name, dst, err);
    case DP_NUM: return get_num(v, name, dst, err);
    case DP_BOOL: return get_bool(v, name, dst, err);
    case DP_SEED:
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return um_err_param(err, name, "%s must be a non-negative integer", name);
        *(uint64_t *)dst = (uint64_t)json_integer_value(v);
        return 0;
    case DP_DECODER: {
        const char *s = json_is_string(v) ? json_string_value(v) : "";
        if (strcmp(s, "LowConfidence") == 0) s = "threshold"; /* SGLang's name for the threshold decoder */
        if (strcmp(s, "JointThreshold") == 0) s = "joint_threshold"; /* SGLang's (LLaDA2.1 token editing) */
        if (strcmp(s, "HierarchyBlock") == 0) s = "hierarchy_block"; /* SGLang's (Fast-dLLM v2) */
        if (decode_decoder_parse(s, dst) != 0)
            return um_err_param(err, name,
                                "%s must be one of low_confidence, random, threshold, factor, hierarchy, credit, "
                                "origin, maskgit_plus, topk_margin, entropy, joint_threshold, hierarchy_block%s%.64s%s",
                                name, json_is_string(v) ? ", got '" : "", json_is_string(v) ? s : "",
                                json_is_string(v) ? "'" : "");
        return 0;
    }
    case DP_LAYOUT:
        if (!json_is_string(v) || decode_layout_parse(json_string_value(v), dst) != 0)
            return um_err_param(err, name, "%s must be llada or aligned", name);
        return 0;
    case DP_CACHE:
        if (!json_is_string(v) || decode_cache_parse(json_string_value(v), dst) != 0)
            return um_err_param(err, name, "%s must be one of none, prefix, dual, vicinity", name);
        return 0;
    }
    return 0;
}

/* One field of p as JSON. */
static json_t *field_json(const dp_field *f, const decode_params *p) {
    const void *src = (const char *)p + f->off;
    switch (f->type) {
    case DP_INT: return json_integer(*(const int *)src);
    case DP_NUM: return json_real(*(const double *)src);
    case DP_BOOL: return json_boolean(*(const int *)src);
    case DP_SEED: return json_integer((json_int_t)*(const uint64_t *)src);
    case DP_DECODER: return json_string(decode_decoder_name(*(const enum decode_decoder *)src));
    case DP_LAYOUT: return json_string(decode_layout_name(*(const enum decode_layout *)src));
    case DP_CACHE: return json_string(decode_cache_name(*(const enum decode_cache *)src));
    }
    return json_null();
}

/* The value under name in obj when it counts as given (present, not null, alias rules). */
static const json_t *given_value(const json_t *obj, const char *name, int alias_flags) {
    const json_t *v = json_object_get(obj, name);
    if (!v || json_is_null(v)) return NULL;
    if ((alias_flags & ALIAS_NEG_UNSET) && json_is_number(v) && json_number_value(v) < 0) return NULL;
    return v;
}

int decode_params_apply_json(decode_params *p, const json_t *obj, decode_params_src *src, um_err *err) {
    if (!json_is_object(obj)) return um_err_param(err, "params", "decode parameters must be a JSON object");
    for (int i = 0; i < N_FIELDS; i++) {
        const dp_field *f = &k_fields[i];
        for (size_t a = 0; a <= sizeof k_aliases / sizeof k_aliases[0]; a++) {
            int is_alias = a < sizeof k_aliases / sizeof k_aliases[0];
            if (is_alias && strcmp(k_aliases[a].canonical, f->name) != 0) continue;
            const char *name = is_alias ? k_aliases[a].name : f->name;
            const json_t *v = given_value(obj, name, is_alias ? k_aliases[a].flags : 0);
            if (!v) continue;
            if (field_apply(f, name, p, v, err) != 0) return -1;
            if (src) src->name[i] = name;
        }
    }
    if (p->top_k == -1) p->top_k = 0; /* -1 = off (the vLLM / SGLang convention) */
    return 0;
}

json_t *decode_params_to_json(const decode_params *p) {
    json_t *o = json_object();
    for (int i = 0; i < N_FIELDS; i++) json_object_set_new(o, k_fields[i].name, field_json(&k_fields[i], p));
    return o;
}

const char *decode_param_canonical(const char *name) {
    int i = field_index(name);
    if (i >= 0) return k_fields[i].name;
    for (size_t a = 0; a < sizeof k_aliases / sizeof k_aliases[0]; a++)
        if (strcmp(k_aliases[a].name, name) == 0) return k_aliases[a].canonical;
    return NULL;
}

int decode_param_count(void) { return N_FIELDS; }

void decode_param_at(int i, decode_param_desc *d) {
    const dp_field *f = &k_fields[i];
    d->name = f->name;
    d->type = f->type == DP_INT    ? DECODE_PARAM_INT
              : f->type == DP_NUM  ? DECODE_PARAM_NUM
              : f->type == DP_BOOL ? DECODE_PARAM_BOOL
              : f->type == DP_SEED ? DECODE_PARAM_SEED
                                   : DECODE_PARAM_NAME;
    d->flag = f->flag;
    d->flag_value = f->flag_value;
    d->help = f->help;
}

/* ---------------------------------------------------------------- where parameters came from */

const char *decode_params_src_get(const decode_params_src *src, const char *canonical) {
    int i = field_index(canonical);
    return src && i >= 0 ? src->name[i] : NULL;
}

void decode_params_src_set(decode_params_src *src, const char *canonical, const char *name) {
    int i = field_index(canonical);
    if (i >= 0) src->name[i] = name;
}

void decode_params_settle(decode_params *p, const decode_params_src *src) {
    /* a short generation with the default block length: one block of the whole length */
    if (!decode_params_src_get(src, "block_length") && p->layout == DECODE_LAYOUT_LLADA &&
        p->block_length > p->gen_length)
        p->block_length = p->gen_length;
    /* a default step count meant for a longer generation */
    if (!decode_params_src_get(src, "steps") && p->steps > p->gen_length) p->steps = 0;
}

/* Replaces whole-word occurrences of `from` in msg (at most cap bytes) with `to`. */
static void rename_word(char *msg, size_t cap, const char *from, const char *to) {
    char out[sizeof ((um_err *)0)->msg];
    size_t o = 0, fl = strlen(from), tl = strlen(to);
    const char *s = msg;
    while (*s && o + 1 < sizeof out) {
        int word = strncmp(s, from, fl) == 0 && (s == msg || !(isalnum((unsigned char)s[-1]) || s[-1] == '_')) &&
                   !(isalnum((unsigned char)s[fl]) || s[fl] == '_');
        if (word && o + tl + 1 < sizeof out) {
            memcpy(out + o, to, tl);
            o += tl;
            s += fl;
        } else {
            out[o++] = *s++;
        }
    }
    out[o] = 0;
    snprintf(msg, cap, "%s", out);
}

void decode_params_err_rename(um_err *err, const decode_params_src *src) {
    if (!src) return;
    for (int i = 0; i < N_FIELDS; i++) {
        const char *to = src->name[i], *from = k_fields[i].name;
        if (!to || strcmp(to, from) == 0) continue;
        rename_word(err->msg, sizeof err->msg, from, to);
        if (strcmp(err->param, from) == 0) snprintf(err->param, sizeof err->param, "%s", to);
    }
}
