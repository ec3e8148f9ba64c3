/*
 * params.c — the decode parameters' one table and every loop over it (params.h): built-in
 * defaults, own ranges, JSON in and out, generation_config.json, the CLI's flags and help (the
 * pattern of redis's config.c: one row per setting, code that walks the rows). Checks across
 * parameters or against the model are decode.c's. Pure; any thread.
 */
#include "decode/params.h"

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>


/* ---------------------------------------------------------------- names of enum values */

/* The one list of decoder names (enum order: help, messages and parsing walk it). */
static const char *const k_decoder_names[DECODER_COUNT_] = {
    [DECODER_LOW_CONFIDENCE] = "low_confidence", [DECODER_RANDOM] = "random",
    [DECODER_THRESHOLD] = "threshold",           [DECODER_FACTOR] = "factor",
    [DECODER_HIERARCHY] = "hierarchy",           [DECODER_CREDIT] = "credit",
    [DECODER_ORIGIN] = "origin",                 [DECODER_MASKGIT_PLUS] = "maskgit_plus",
    [DECODER_TOPK_MARGIN] = "topk_margin",       [DECODER_ENTROPY] = "entropy",
    [DECODER_JOINT_THRESHOLD] = "joint_threshold", [DECODER_HIERARCHY_BLOCK] = "hierarchy_block",
};
static const char *const k_layout_names[DECODE_LAYOUT_COUNT_] = {"llada", "aligned"};
static const char *const k_cache_names[DECODE_CACHE_COUNT_] = {"none", "prefix", "dual", "vicinity"};

/* Index of name in names[0..n), or -1 (the enum <-> name tables above). */
static int name_index(const char *const *names, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(name, names[i]) == 0) return i;
    return -1;
}

const char *decode_decoder_name(enum decode_decoder d) {
    return (int)d >= 0 && d < DECODER_COUNT_ ? k_decoder_names[d] : "unknown";
}

int decode_decoder_parse(const char *name, enum decode_decoder *out) {
    const int i = name_index(k_decoder_names, DECODER_COUNT_, name);
    if (i >= 0) *out = (enum decode_decoder)i;
    return i >= 0 ? 0 : -1;
}

const char *decode_layout_name(enum decode_layout l) {
    return (int)l >= 0 && l < DECODE_LAYOUT_COUNT_ ? k_layout_names[l] : "unknown";
}

int decode_layout_parse(const char *name, enum decode_layout *out) {
    const int i = name_index(k_layout_names, DECODE_LAYOUT_COUNT_, name);
    if (i >= 0) *out = (enum decode_layout)i;
    return i >= 0 ? 0 : -1;
}

const char *decode_cache_name(enum decode_cache c) {
    return (int)c >= 0 && c < DECODE_CACHE_COUNT_ ? k_cache_names[c] : "unknown";
}

int decode_cache_parse(const char *name, enum decode_cache *out) {
    const int i = name_index(k_cache_names, DECODE_CACHE_COUNT_, name);
    if (i >= 0) *out = (enum decode_cache)i;
    return i >= 0 ? 0 : -1;
}

/* ---------------------------------------------------------------- JSON values */

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

/* ---------------------------------------------------------------- the table */

/* How a decode parameter is written in JSON. */
enum dp_type { DP_INT, DP_NUM, DP_BOOL, DP_SEED, DP_DECODER, DP_LAYOUT, DP_CACHE };

/* How a row's own range is checked and said ("X must be <range>, got V"). */
enum dp_range {
    DR_NONE,    /* any value of the type, or a range that depends on the model / other parameters
                   (decode.c checks it) */
    DR_BETWEEN, /* [lo, hi]: "between lo<lo_note> and hi<hi_note>" */
    DR_IN,      /* an interval: "in [lo, hi]<lo_note>", ( ) for open ends */
    DR_MIN,     /* >= lo (> lo with DR_LO_OPEN; finite with DR_FINITE): ">= lo", "a finite number > lo" */
    DR_PAIR,    /* lo or hi: "lo or hi" */
};
enum { DR_LO_OPEN = 1, DR_HI_OPEN = 2, DR_FINITE = 4 };

/* One decode parameter. */
typedef struct dp_field {
    const char   *name;       /* canonical JSON name */
    enum dp_type  type;
    size_t        off;        /* offsetof(decode_params, field) */
    const char   *flag;       /* CLI flag without "--" */
    int           flag_value; /* DP_BOOL: the value the (valueless) flag sets */
    double        def;        /* built-in default (enums: the enum value) */
    enum dp_range range;
    double        lo, hi;     /* DR_*: the bounds */
    unsigned      rflags;     /* DR_LO_OPEN | DR_HI_OPEN | DR_FINITE */
    const char   *lo_note;    /* words after the lower bound (DR_IN: after the interval), or NULL */
    const char   *hi_note;    /* words after the upper bound, or NULL */
    int           gen_config; /* 1: a checkpoint's generation_config.json may set it */
    const char   *help;       /* one line for --help; the default follows in brackets (not DP_BOOL) */
    const char   *def_note;   /* words after the default inside the brackets, or NULL */
    unsigned      decoders;   /* DEC() set of the decoders that read it; 0 = every decoder (lengths,
                                 sampling, caches, streaming: not a decoder's own) */
    unsigned      bd_decoders; /* more decoders that read it under the block-diffusion rules
                                  (a block-causal model, aligned layout: LLaDA2; decode.c) */
} dp_field;

/* Sets of decoders, for the table's decoders columns (the truth is decoders.c's k_decoders flags
 * and what each choose() reads). */
#define DEC(d) (1u << (d))
#define DEC_DREAM (DEC(DECODER_ORIGIN) | DEC(DECODER_MASKGIT_PLUS) | DEC(DECODER_TOPK_MARGIN) | DEC(DECODER_ENTROPY))
#define DEC_FIXED (DEC(DECODER_LOW_CONFIDENCE) | DEC(DECODER_RANDOM) | DEC_DREAM) /* DECODER_F_FIXED_STEPS */
#define DEC_TAU (DEC(DECODER_THRESHOLD) | DEC(DECODER_HIERARCHY) | DEC(DECODER_CREDIT) | DEC(DECODER_JOINT_THRESHOLD) | \
                 DEC(DECODER_HIERARCHY_BLOCK))

#define DPF(f) offsetof(decode_params, f)
#define NOTES(l, h) l, h
static const dp_field k_fields[] = {
    {"gen_length", DP_INT, DPF(gen_length), "gen-length", 0, 128, DR_NONE, 0, 0, 0, NOTES(NULL, NULL), 1,
     "generated positions (masks)", NULL},
    {"block_length", DP_INT, DPF(block_length), "block-length", 0, 32, DR_NONE, 0, 0, 0, NOTES(NULL, NULL), 1,
     "block length B", ", at most the generation length"},
    {"steps", DP_INT, DPF(steps), "steps", 0, 0, DR_NONE, 0, 0, 0, NOTES(NULL, NULL), 1,
     "fixed-step decoders: total steps, 0 = gen-length", NULL, DEC_FIXED, DEC(DECODER_THRESHOLD)},
    {"steps_per_block", DP_INT, DPF(steps_per_block), "steps-per-block", 0, 0, DR_BETWEEN, 0, 1000000, 0,
     NOTES(" (unset: steps decides)", NULL), 0,
     "fixed-step decoders (LLaDA2: also threshold): steps of every block, overriding steps; 0 = unset", NULL,
     DEC_FIXED, DEC(DECODER_THRESHOLD)},
    {"decoder", DP_DECODER, DPF(decoder), "decoder", 0, DECODER_LOW_CONFIDENCE, DR_NONE, 0, 0, 0, NOTES(NULL, NULL),
     1, NULL /* the decoders' names, made from their table */, "; Dream checkpoints: their alg"},
    {"threshold", DP_NUM, DPF(threshold), "threshold", 0, 0.9, DR_IN, 0, 1, DR_LO_OPEN, NOTES(NULL, NULL), 1,
     "threshold/credit/hierarchy_block: tau, hierarchy: tau_high; in (0,1]", NULL, DEC_TAU},
    {"factor", DP_NUM, DPF(factor), "factor", 0, 1.0, DR_MIN, 0, 0, DR_LO_OPEN | DR_FINITE, NOTES(NULL, NULL), 0,
     "factor decoder: f > 0", NULL, DEC(DECODER_FACTOR)},
    {"low_threshold", DP_NUM, DPF(low_threshold), "low-threshold", 0, 0.0, DR_IN, 0, 1, 0,
     NOTES(" (0 = off)", NULL), 0, "hierarchy decoder: tau_low in [0,1], 0 = off", NULL,
     DEC(DECODER_HIERARCHY)},
    {"credit_alpha", DP_NUM, DPF(credit_alpha), "credit-alpha", 0, 0.7, DR_BETWEEN, 0, 100, 0, NOTES(NULL, NULL),
     0, "credit decoder: alpha (logit boost) in [0,100]", NULL, DEC(DECODER_CREDIT)},
    {"credit_gamma", DP_NUM, DPF(credit_gamma), "credit-gamma", 0, 0.2, DR_BETWEEN, 0, 100, 0, NOTES(NULL, NULL),
     0, "credit decoder: gamma (credit p^gamma) in [0,100]", NULL, DEC(DECODER_CREDIT)},
    {"credit_decay", DP_NUM, DPF(credit_decay), "credit-decay", 0, 0.8, DR_IN, 0, 1, 0, NOTES(NULL, NULL), 0,
     "credit decoder: beta (decay per step) in [0,1]", NULL, DEC(DECODER_CREDIT)},
    {"alg_temp", DP_NUM, DPF(alg_temp), "alg-temp", 0, 0.0, DR_BETWEEN, 0, 100, 0, NOTES(" (off)", NULL), 1,
     "Dream decoders: sample positions from softmax(confidence / alg_temp), 0 = most confident; in [0,100]", NULL,
     DEC_DREAM & ~DEC(DECODER_ORIGIN)},
    {"eps", DP_NUM, DPF(eps), "eps", 0, 1e-3, DR_IN, 0, 1, DR_LO_OPEN | DR_HI_OPEN, NOTES(NULL, NULL), 1,
     "Dream decoders: last timestep of linspace(1, eps, steps+1), in (0,1)", NULL, DEC_DREAM},
    {"edit_threshold", DP_NUM, DPF(edit_threshold), "edit-threshold", 0, 0.0, DR_IN, 0, 1, 0, NOTES(NULL, NULL), 0,
     "joint_threshold: confidence a rewrite of a written position needs, in [0,1]", NULL,
     DEC(DECODER_JOINT_THRESHOLD)},
    {"max_post_steps", DP_INT, DPF(max_post_steps), "max-post-steps", 0, 16, DR_BETWEEN, 0, 1000, 0,
     NOTES(NULL, NULL), 0, "joint_threshold: edit-only steps after a block's last mask, 0..1000", NULL,
     DEC(DECODER_JOINT_THRESHOLD)},
    {"sub_block_length", DP_INT, DPF(sub_block_length), "sub-block-length", 0, 8, DR_NONE, 0, 0, 0,
     NOTES(NULL, NULL), 0, "hierarchy_block: positions per sub-block, decoded in order", NULL,
     DEC(DECODER_HIERARCHY_BLOCK)},
    {"token_shift", DP_INT, DPF(token_shift), "token-shift", 0, 1, DR_PAIR, 0, 1, 0, NOTES(NULL, NULL), 0,
     "hierarchy_block: 1 = position p predicted from logits row p-1 (first block position inherited), 0 = row p",
     NULL, DEC(DECODER_HIERARCHY_BLOCK)},
    {"temperature", DP_NUM, DPF(temperature), "temperature", 0, 0.0, DR_BETWEEN, 0, DECODE_MAX_TEMPERATURE, 0,
     NOTES(NULL, NULL), 1, "sampling temperature in [0,2], 0 = greedy", NULL},
    {"top_k", DP_INT, DPF(top_k), "top-k", 0, 0, DR_NONE, 0, 0, 0, NOTES(NULL, NULL), 1,
     "sample among the k best tokens, 0 or -1 = off", NULL},
    {"top_p", DP_NUM, DPF(top_p), "top-p", 0, 1.0, DR_IN, 0, 1, DR_LO_OPEN, NOTES(NULL, NULL), 1,
     "nucleus mass in (0,1], 1 = off", NULL},
    {"seed", DP_SEED, DPF(seed), "seed", 0, 0, DR_NONE, 0, 0, 0, NOTES(NULL, NULL), 0,
     "random seed (non-negative 63-bit integer)", NULL},
    {"cfg_scale", DP_NUM, DPF(cfg_scale), "cfg-scale", 0, 0.0, DR_BETWEEN, 0, 100, 0, NOTES(" (off)", NULL), 1,
     "classifier-free guidance scale in [0,100], 0 = off", NULL},
    {"logits_eos_inf", DP_BOOL, DPF(logits_eos_inf), "logits-eos-inf", 1, 0, DR_NONE, 0, 0, 0, NOTES(NULL, NULL), 0,
     "never sample EOS (logits[eos] = -inf)", NULL},
    {"confidence_eos_eot_inf", DP_BOOL, DPF(confidence_eos_eot_inf), "confidence-eos-eot-inf", 1, 0, DR_NONE, 0, 0,
     0, NOTES(NULL, NULL), 0, "reference quirk: confidence without <|eot_id|>", NULL},
    {"block_layout", DP_LAYOUT, DPF(layout), "block-layout", 0, DECODE_LAYOUT_LLADA, DR_NONE, 0, 0, 0,
     NOTES(NULL, NULL), 0, "llada (blocks after the prompt) | aligned", NULL},
    {"stop_at_eos", DP_BOOL, DPF(stop_at_eos), "no-stop-at-eos", 0, 1, DR_NONE, 0, 0, 0, NOTES(NULL, NULL), 0,
     "decode every block even after EOS", NULL},
    {"stream_drafts", DP_BOOL, DPF(stream_drafts), "drafts", 1, 0, DR_NONE, 0, 0, 0, NOTES(NULL, NULL), 0,
     "step events carry drafts for masked positions", NULL},
    {"draft_every", DP_INT, DPF(draft_every), "draft-every", 0, 1, DR_MIN, 1, 0, 0, NOTES(NULL, NULL), 0,
     "drafts every N steps", NULL},
    {"cache", DP_CACHE, DPF(cache), "cache", 0, DECODE_CACHE_NONE, DR_NONE, 0, 0, 0, NOTES(NULL, NULL), 1,
     "KV cache across steps: none | prefix | dual | vicinity", NULL},
    {"cache_refresh", DP_INT, DPF(cache_refresh), "cache-refresh", 0, 0, DR_BETWEEN, 0, 1000000, 0,
     NOTES(" (refresh only when a block begins)", " steps"), 1,
     "also refresh the cache every N steps inside a block, 0 = only at block start", NULL},
    {"prefix_look", DP_INT, DPF(prefix_look), "prefix-look", 0, 0, DR_NONE, 0, 0, 0, NOTES(NULL, NULL), 1,
     "vicinity: positions before the block recomputed each step", NULL},
    {"after_look", DP_INT, DPF(after_look), "after-look", 0, 0, DR_NONE, 0, 0, 0, NOTES(NULL, NULL), 1,
     "vicinity: positions after the block recomputed each step", NULL},
    {"warmup_steps", DP_INT, DPF(warmup_steps), "warmup-steps", 0, 0, DR_BETWEEN, 0, 1000000, 0, NOTES(NULL, NULL),
     1, "with a cache: the first N steps run without it", NULL},
    {"prefill_chunk", DP_INT, DPF(prefill_chunk), "prefill-chunk", 0, 256, DR_BETWEEN, 0, 1000000, 0,
     NOTES(" (one forward)", NULL), 0,
     "block-diffusion models with a cache: rows per prompt-prefill forward (whole blocks), 0 = one forward", NULL},
    {"time_limit_ms", DP_INT, DPF(time_limit_ms), "time-limit-ms", 0, 0, DR_BETWEEN, 0, 86400000, 0,
     NOTES(" (off)", NULL), 0,
     "time budget of the denoising in ms from its first step: then the block in progress is finished in one "
     "last step and the generation ends; 0 = off",
     NULL},
};
#undef NOTES
#undef DPF
#define N_FIELDS ((int)(sizeof k_fields / sizeof k_fields[0]))
_Static_assert(sizeof k_fields / sizeof k_fields[0] <= DECODE_PARAMS_MAX, "raise DECODE_PARAMS_MAX");


/* ---------------------------------------------------------------- defaults and own ranges */

decode_params decode_params_default(void) {
    decode_params p;
    memset(&p, 0, sizeof p);
    for (int i = 0; i < N_FIELDS; i++) {
        const dp_field *f = &k_fields[i];
        void *dst = (char *)&p + f->off;
        switch (f->type) {
        case DP_INT:
        case DP_BOOL: *(int *)dst = (int)f->def; break;
        case DP_NUM: *(double *)dst = f->def; break;
        case DP_SEED: *(uint64_t *)dst = (uint64_t)f->def; break;
        case DP_DECODER: *(enum decode_decoder *)dst = (enum decode_decoder)f->def; break;
        case DP_LAYOUT: *(enum decode_layout *)dst = (enum decode_layout)f->def; break;
        case DP_CACHE: *(enum decode_cache *)dst = (enum decode_cache)f->def; break;
        }
    }
    return p;
}

/* A bound or value as the messages write it (integers of DP_INT rows without an exponent). */
static void num_text(const dp_field *f, double v, char *buf, size_t cap) {
    if (f->type == DP_INT) snprintf(buf, cap, "%.0f", v);
    else snprintf(buf, cap, "%g", v);
}

/* "X must be <range>, got V" for row f. */
static int range_error(const dp_field *f, double v, um_err *err) {
    char lo[32], hi[32], got[32], range[200];
    num_text(f, f->lo, lo, sizeof lo);
    num_text(f, f->hi, hi, sizeof hi);
    num_text(f, v, got, sizeof got);
    const char *ln = f->lo_note ? f->lo_note : "", *hn = f->hi_note ? f->hi_note : "";
    switch (f->range) {
    case DR_BETWEEN: snprintf(range, sizeof range, "between %s%s and %s%s", lo, ln, hi, hn); break;
    case DR_IN:
        snprintf(range, sizeof range, "in %c%s, %s%c%s", f->rflags & DR_LO_OPEN ? '(' : '[', lo, hi,
                 f->rflags & DR_HI_OPEN ? ')' : ']', ln);
        break;
    case DR_MIN:
        snprintf(range, sizeof range, "%s%s %s%s", f->rflags & DR_FINITE ? "a finite number " : "",
                 f->rflags & DR_LO_OPEN ? ">" : ">=", lo, ln);
        break;
    case DR_PAIR: snprintf(range, sizeof range, "%s or %s", lo, hi); break;
    case DR_NONE: range[0] = 0; break;
    }
    return um_err_param(err, f->name, "%s must be %s, got %s", f->name, range, got);
}

/* 1 when v is inside row f's own range. */
static int in_range(const dp_field *f, double v) {
    const int lo_ok = f->rflags & DR_LO_OPEN ? v > f->lo : v >= f->lo;
    const int hi_ok = f->rflags & DR_HI_OPEN ? v < f->hi : v <= f->hi;
    switch (f->range) {
    case DR_BETWEEN:
    case DR_IN: return lo_ok && hi_ok;
    case DR_MIN: return lo_ok && (!(f->rflags & DR_FINITE) || isfinite(v));
    case DR_PAIR: return v == f->lo || v == f->hi;
    case DR_NONE: return 1;
    }
    return 1;
}

int decode_params_check_rows(const decode_params *p, um_err *err) {
    for (int i = 0; i < N_FIELDS; i++) {
        const dp_field *f = &k_fields[i];
        if (f->range == DR_NONE) continue;
        const void *src = (const char *)p + f->off;
        const double v = f->type == DP_NUM ? *(const double *)src : (double)*(const int *)src;
        if (!in_range(f, v)) return range_error(f, v, err);
    }
    return 0;
}

/* ---------------------------------------------------------------- decoder names */

/* SGLang's algorithm class names for our decoders. */
static const struct {
    const char         *name;
    enum decode_decoder decoder;
} k_decoder_aliases[] = {
    {"LowConfidence", DECODER_THRESHOLD},        /* its LowConfidence thresholds (tau), like ours */
    {"JointThreshold", DECODER_JOINT_THRESHOLD}, /* LLaDA2.1 token editing */
    {"HierarchyBlock", DECODER_HIERARCHY_BLOCK}, /* Fast-dLLM v2 sub-block decoding */
};

int decode_decoder_parse_any(const char *name, enum decode_decoder *out) {
    for (size_t i = 0; i < sizeof k_decoder_aliases / sizeof k_decoder_aliases[0]; i++)
        if (strcmp(name, k_decoder_aliases[i].name) == 0) {
            *out = k_decoder_aliases[i].decoder;
            return 0;
        }
    return decode_decoder_parse(name, out);
}

void decode_decoder_list(char *buf, size_t cap, const char *sep, const char *last_sep) {
    size_t o = 0;
    buf[0] = 0;
    for (int d = 0; d < DECODER_COUNT_ && o < cap; d++) {
        const char *s = d == 0 ? "" : d == DECODER_COUNT_ - 1 ? last_sep : sep;
        int n = snprintf(buf + o, cap - o, "%s%s", s, decode_decoder_name((enum decode_decoder)d));
        if (n < 0) break;
        o += (size_t)n;
    }
}

/* Other names the APIs accept for a parameter. An alias row is read before its parameter's own
 * name, so the canonical name wins when a body has both. */
enum {
    ALIAS_NEG_UNSET = 1,  /* a negative value means "not given" (llama.cpp's n_predict -1) */
    ALIAS_GEN_CONFIG = 2, /* generation_config.json may use it too */
};
static const struct {
    const char *name, *canonical;
    int         flags;
} k_aliases[] = {
    {"max_tokens", "gen_length", 0},             /* OpenAI */
    {"max_completion_tokens", "gen_length", 0},  /* OpenAI, newer */
    {"max_new_tokens", "gen_length", ALIAS_GEN_CONFIG}, /* Hugging Face, SGLang */
    {"n_predict", "gen_length", ALIAS_NEG_UNSET}, /* llama.cpp */
    {"block_size", "block_length", 0},           /* SGLang, Fast-dLLM */
    {"sub_block_size", "sub_block_length", 0},   /* SGLang HierarchyBlock */
    {"diffusion_steps", "steps", 0},             /* Inception / Mercury */
    {"alg", "decoder", ALIAS_GEN_CONFIG},        /* Dream's diffusion_generate */
    {"drafts", "stream_drafts", 0},              /* the WebSocket protocol's short name */
    {"t_max_predict_ms", "time_limit_ms", ALIAS_NEG_UNSET}, /* llama.cpp (-1 / 0 = off) */
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
        if (decode_decoder_parse_any(s, dst) != 0) {
            char names[256];
            decode_decoder_list(names, sizeof names, ", ", ", ");
            return um_err_param(err, name, "%s must be one of %s%s%.64s%s", name, names,
                                json_is_string(v) ? ", got '" : "", json_is_string(v) ? s : "",
                                json_is_string(v) ? "'" : "");
        }
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

int decode_param_read_by(int i, enum decode_decoder d, int bd) {
    if (i < 0 || i >= N_FIELDS) return 0;
    const dp_field *f = &k_fields[i];
    if (!f->decoders) return 1;
    return ((f->decoders | (bd ? f->bd_decoders : 0u)) & DEC(d)) != 0;
}

/* Each row's help line with its default in brackets, made once. */
static char g_help[N_FIELDS][320];
static pthread_once_t g_help_once = PTHREAD_ONCE_INIT;

static void help_make(void) {
    for (int i = 0; i < N_FIELDS; i++) {
        const dp_field *f = &k_fields[i];
        char def[64], names[256];
        const char *help = f->help;
        if (f->type == DP_DECODER) {
            decode_decoder_list(names, sizeof names, " | ", " | ");
            help = names;
        }
        if (f->type == DP_BOOL) {
            snprintf(g_help[i], sizeof g_help[i], "%s", help);
            continue;
        }
        switch (f->type) {
        case DP_DECODER: snprintf(def, sizeof def, "%s", decode_decoder_name((enum decode_decoder)f->def)); break;
        case DP_LAYOUT: snprintf(def, sizeof def, "%s", decode_layout_name((enum decode_layout)f->def)); break;
        case DP_CACHE: snprintf(def, sizeof def, "%s", decode_cache_name((enum decode_cache)f->def)); break;
        default: num_text(f, f->def, def, sizeof def); break;
        }
        snprintf(g_help[i], sizeof g_help[i], "%s [%s%s]", help, def, f->def_note ? f->def_note : "");
    }
}

void decode_param_at(int i, decode_param_desc *d) {
    pthread_once(&g_help_once, help_make);
    const dp_field *f = &k_fields[i];
    d->name = f->name;
    d->type = f->type == DP_INT    ? DECODE_PARAM_INT
              : f->type == DP_NUM  ? DECODE_PARAM_NUM
              : f->type == DP_BOOL ? DECODE_PARAM_BOOL
              : f->type == DP_SEED ? DECODE_PARAM_SEED
                                   : DECODE_PARAM_NAME;
    d->flag = f->flag;
    d->flag_value = f->flag_value;
    d->help = g_help[i];
}

/* ---------------------------------------------------------------- generation_config.json */

/* One generation_config.json value for row f (lenient: wrong types and unknown names ignored). */
static void gen_apply(const dp_field *f, decode_params *p, const json_t *v, int *cache_set) {
    void *dst = (char *)p + f->off;
    switch (f->type) {
    case DP_INT:
        if (json_is_number(v)) *(int *)dst = (int)json_number_value(v);
        break;
    case DP_NUM:
        if (json_is_number(v)) *(double *)dst = json_number_value(v);
        break;
    case DP_DECODER:
        if (json_is_string(v)) decode_decoder_parse(json_string_value(v), dst);
        break;
    case DP_CACHE:
        if (json_is_string(v) && decode_cache_parse(json_string_value(v), dst) == 0) *cache_set = 1;
        break;
    case DP_BOOL:
    case DP_SEED:
    case DP_LAYOUT: break; /* no row of these types is gen_config */
    }
}

void decode_params_apply_generation(decode_params *p, const json_t *g, int *cache_set) {
    *cache_set = 0;
    if (!json_is_object(g)) return;
    for (int i = 0; i < N_FIELDS; i++) {
        const dp_field *f = &k_fields[i];
        if (!f->gen_config) continue;
        for (size_t a = 0; a < sizeof k_aliases / sizeof k_aliases[0]; a++) /* aliases first: the name wins */
            if ((k_aliases[a].flags & ALIAS_GEN_CONFIG) && strcmp(k_aliases[a].canonical, f->name) == 0) {
                const json_t *v = json_object_get(g, k_aliases[a].name);
                if (v) gen_apply(f, p, v, cache_set);
            }
        const json_t *v = json_object_get(g, f->name);
        if (v) gen_apply(f, p, v, cache_set);
    }
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
