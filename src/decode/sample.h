/*
 * sample.h — per-position sampling for the decode loop: effective logits (CFG, eos flags), the
 * sampled token x0 (argmax at temperature 0, else Gumbel-max in double precision over the top-k /
 * top-p filtered distribution, noise from the counter-based rng keyed by (seed, step,
 * pos * vocab + token)) and its confidence softmax(noise-free logits)[x0] in double.
 * Not here: which positions to commit (decoders). Pure; any thread (rows run in parallel).
 */
#ifndef UM_SAMPLE_H
#define UM_SAMPLE_H

#include <stdint.h>

typedef struct sample_cfg {
    int      vocab;                  /* logits per row */
    int      mask_id;                /* never sampled (-1: none) */
    int      eos_id, eot_id;         /* -1 when unknown */
    double   cfg_scale;              /* > 0: l = u + (cfg+1)(c - u) */
    int      logits_eos_inf;         /* l[eos] = -inf */
    int      confidence_eos_eot_inf; /* confidence from l with l[eot] = -inf (x0 == eot -> 0) */
    double   temperature;
    int      top_k;                  /* 0 = off */
    double   top_p;                  /* 1 = off */
    uint64_t seed;
} sample_cfg;

/* l: the conditional logits row [vocab], rewritten in place into the effective logits. u: the
 * unconditional row (CFG) or NULL. step: the sequence's step index; pos: absolute position. */
void sample_row(const sample_cfg *c, float *l, const float *u, int step, int pos, int32_t *x0, double *conf);

/* Gumbel noise term for (seed, step, pos, token): -log(-log(u)), u in (0, 1). Exposed for tests. */
double sample_gumbel(uint64_t seed, int step, int pos, int vocab, int token);

#endif /* UM_SAMPLE_H */
