/*
 * gen_prep.h — the preparation job of a generation request, the same for every transport
 * (WebSocket `generate`, the HTTP generation endpoints, async jobs and their attempts): the request was parsed on the
 * service thread (api_gen: JSON checked, nothing tokenized); gen_prep_run builds it on a
 * preparation worker (server/prep.h: chat template, tokenizer, limits, decode_seqs — tens of ms for
 * a large prompt); the transport's done() then answers or submits on the service thread.
 *
 * A transport embeds gen_prep at the start of its own job struct, fills m / lim / g, calls
 * gen_prep_init with its done(), and submits &job. Not here: the pool (prep.h), answering (the
 * transports: server/ws.c, server/http_gen.c).
 * Threads: gen_prep_run on a preparation worker (it touches only its gen_prep); gen_prep_init and
 * gen_prep_release on the service thread.
 */
#ifndef UM_GEN_PREP_H
#define UM_GEN_PREP_H

#include "api/gen.h"
#include "jobs/webhook.h"
#include "server/prep.h"

typedef struct gen_prep {
    prep_job          job;    /* first member: run = gen_prep_run */
    const model      *m;      /* the served model (read-only) */
    const api_limits *lim;    /* the server's limits (read-only) */
    api_gen           g;      /* the parsed request (owned; the worker only reads it) */
    const webhook_sender *wh; /* with webhook: the sender whose rules check it (read-only) */
    const char       *webhook;/* a new job's webhook URL, resolved and checked after the build (DNS can
                                 take a while: on the worker); borrowed from the transport's job; NULL: none */
    /* worker results (read by done) */
    int               rc;     /* api_gen_build's */
    api_seq          *seqs;   /* [n] (owned; a submitted seq is taken out: seqs[i].seq = NULL) */
    int               n;
    api_error         e;      /* rc != 0: why */
} gen_prep;

void gen_prep_init(gen_prep *p, uint64_t owner_key, prep_fn done);
/* Worker: build p->g into p->seqs (or p->e); then check p->webhook, if any (a refused target is p->e). */
void gen_prep_run(prep_job *j);
/* What the job owns (request, sequences not submitted); not p itself. */
void gen_prep_release(gen_prep *p);

#endif /* UM_GEN_PREP_H */
