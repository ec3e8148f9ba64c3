/*
 * gen_prep.c — a generation request's preparation job (gen_prep.h).
 * Threads: gen_prep_run on a preparation worker; the rest on the service thread.
 */
#include "server/gen_prep.h"

void gen_prep_init(gen_prep *p, uint64_t owner_key, prep_fn done) {
    p->job.owner_key = owner_key;
    p->job.run = gen_prep_run;
    p->job.done = done;
}

void gen_prep_run(prep_job *j) {
    gen_prep *p = (gen_prep *)j;
    p->rc = api_gen_build(&p->g, p->m, p->lim, &p->seqs, &p->n, &p->e);
    /* refused unless public or allowed (--webhook-allow); checked again before every delivery */
    um_err ue = {0};
    if (p->rc == 0 && p->webhook && webhook_check_target(p->wh, p->webhook, &ue) != 0) p->rc = oai_error_from_um(&p->e, &ue);
}

void gen_prep_release(gen_prep *p) {
    api_seqs_free(p->seqs, p->n);
    p->seqs = NULL;
    p->n = 0;
    api_gen_free(&p->g);
}
