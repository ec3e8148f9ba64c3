/*
 * model_tp.c — tensor-parallel groups behind one model_ctx (model_tp.h) and memory sizing.
 *
 * Wire format of one leader -> followers message (two comm_broadcast calls from rank 0):
 *   header int32[8]: TP_MAGIC, kind (TP_MSG_FORWARD | TP_MSG_STOP), n_seqs, n_tokens, n_out,
 *                    flags (TP_HAS_POS | TP_HAS_VALID | TP_HAS_ROWS | TP_HAS_KV | TP_HAS_REL |
 *                    TP_HAS_BLEN), payload
 *                    bytes, sequence no.
 *   payload: seq_start[n_seqs+1], tokens[n_tokens], pos[n_tokens]?, out_rows[n_out]?,
 *            {kv[n_seqs], kv_rows[n_seqs]}? (the batch's KV slots and their sizes: a follower opens
 *            a slot it does not hold yet), {n_rel, rel[n_rel]}? (slots the leader closed since the
 *            previous message: the followers close them before this forward), block_len[n_seqs]?
 *            (per-sequence block-causal attention, TP_HAS_BLEN),
 *            key_valid[n_tokens]? (bytes last, so the int32 arrays stay aligned)
 * A setup status round follows initialisation: every rank broadcasts {ok, message} in rank order,
 * so a failure on any rank fails every rank with the same message instead of leaving some inside
 * a collective. A rank that cannot even start its NCCL init (or whose init fails) cannot take part
 * in that round: it records its message (init_err), the other local ranks abort their pending
 * non-blocking init (backend_comm_join's cancelled), and the message goes to the other nodes over the
 * liveness link (their ranks abort too). Multi-node: the setup fingerprint
 * (model_tp_fingerprint) rides in the bootstrap hello, so mismatched nodes never form a group.
 * Does not: run the forward math (llada.c), parse flags. Threads: see model_tp.h.
 */
#include "model/model_tp.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model/llada.h"
#include "model/model_kv.h"
#include "util/log.h"

#define TP_MAGIC      0x55544d50 /* "PMTU" */
#define TP_MSG_FORWARD 1
#define TP_MSG_STOP    2
#define TP_HAS_POS     1
#define TP_HAS_VALID   2
#define TP_HAS_ROWS    4
#define TP_HAS_KV      8
#define TP_HAS_REL     16
#define TP_HAS_BLEN    32

typedef struct tp_rank {
    struct model_tp *g;
    int              rank;       /* global rank */
    int              local;      /* index among this node's ranks */
    const char      *device;     /* "cpu" / "cuda:N", not owned */
    backend         *be;         /* owned; opened by the creating thread */
    comm            *c;          /* local: owned by the comm_local group; NCCL: owned here */
    model_ctx        ctx;        /* this rank's shard */
    int              ctx_ok;     /* ctx initialised */
    int              fit_failed; /* multi-node: the fit check failed (err holds it); the rank still joins
                                    the comm and reports it in the status round, so every node fails
                                    with this message instead of waiting for this node */
    pthread_t        th;
    int              started;    /* follower thread running */
    int              rc;         /* follower: 0 stopped cleanly, -1 setup failed */
    um_err           err;
} tp_rank;

struct model_tp {
    const model      *m;
    int               world;         /* ranks in the group, all nodes */
    int               n_local;       /* ranks of this node (threads of this process) */
    int               node_rank;     /* this node, 0 = the leader's */
    int               nccl;          /* 1: accelerator ranks over the backend's collectives (NCCL); 0: CPU threads over comm_local */
    comm_local_group *lg;            /* CPU only */
    uint8_t           id[COMM_ID_BYTES]; /* NCCL unique id (same on every rank) */
    tp_rank          *r;             /* [n_local] */
    comm_link        *link;          /* multi-node: the bootstrap connections kept as a liveness link */
    /* --- stop lock { */
    pthread_mutex_t   stop_lock;
    pthread_cond_t    stop_cv;
    int               leader_ok;     /* node 0: the leader ctx is up and the followers serve (written
                                        under the lock; read without it by the leader's own thread) */
    int               stopping;      /* node 0: model_tp_free began; followers: the stop arrived */
    um_err            init_err;      /* the first local rank whose comm init failed (its message) */
    /* } stop lock --- */
    atomic_int        init_failed;   /* 1 once a local rank's comm init failed: the other local ranks
                                        abort their pending NCCL init (backend_comm_join's cancelled) */
    uint8_t          *msg;           /* leader: payload being sent, grown on demand */
    size_t            msg_cap;
    int32_t           seq;           /* leader: messages sent */
};

/* ---------------------------------------------------------------- sizing */

int model_tp_check(const model *m, int tp, um_err *err) { return model_config_check_tp(&m->cfg, m->dir, tp, err); }

uint64_t model_weight_bytes(const model *m, int world) {
    const model_config *c = &m->cfg;
    const uint64_t W = world > 1 ? (uint64_t)world : 1, d = (uint64_t)c->d_model;
    const uint64_t qd = (uint64_t)c->n_heads * (uint64_t)c->head_dim, kvd = (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim;
    const uint64_t F = (uint64_t)c->ffn_hidden;
    /* llada_ctx_init uploads wte and lm_head separately even when they are tied */
    uint64_t n = 2u * (uint64_t)c->n_embd_rows * d + d;
    uint64_t per_layer = 2u * d + (qd + 2u * kvd) * d / W + d * qd / W;
    if (c->arch == MODEL_ARCH_DREAM) per_layer += (qd + 2u * kvd) / W;   /* q/k/v biases */
    if (c->qk_norm) per_layer += 2u * (uint64_t)c->head_dim;
    n += (uint64_t)c->n_layers * per_layer;
    const uint64_t n_moe = c->n_experts > 0 ? (uint64_t)(c->n_layers - c->first_dense) : 0;
    n += ((uint64_t)c->n_layers - n_moe) * 3u * F * d / W;   /* dense MLPs */
    if (n_moe) {   /* router whole, the most experts one rank holds (moe.c ranges), the shared slice */
        const uint64_t E = (uint64_t)c->n_experts, e_rank = (E + W - 1) / W;
        n += n_moe * (E * d + e_rank * 3u * d * (uint64_t)c->moe_ffn + 3u * d * (uint64_t)c->shared_ffn / W);
    }
    return 2u * n;
}

/* One matrix's saving (see model_weight_fp8_savings), split over W ranks. */
static uint64_t fp8_saving(const model *m, const st_tensor *t, uint64_t W) {
    if (!t || t->ndim != 2) return 0;
    if (t->type == DTYPE_F8_E4M3) {   /* stored: its block scales */
        const int64_t br = m->cfg.fp8_block[0] > 0 ? m->cfg.fp8_block[0] : 128;
        const int64_t bc = m->cfg.fp8_block[1] > 0 ? m->cfg.fp8_block[1] : 128;
        const uint64_t scales = 4u * (uint64_t)(((t->shape[0] + br - 1) / br) * ((t->shape[1] + bc - 1) / bc));
        return ((uint64_t)t->n_elems - scales) / W;
    }
    if (m->quant != DTYPE_F8_E4M3 || dtype_is_quant(t->type)) return 0;
    return ((uint64_t)t->n_elems - 4u * (uint64_t)t->shape[0]) / W;   /* --quant fp8: a scale per row */
}

uint64_t model_weight_fp8_savings(const model *m, int world) {
    const model_config *c = &m->cfg;
    const llada_tensors *t = &m->llada;
    const uint64_t W = world > 1 ? (uint64_t)world : 1;
    if (!t->layers) return 0;
    uint64_t n = fp8_saving(m, t->lm_head, 1);
    for (int l = 0; l < c->n_layers; l++) {
        const llada_layer_tensors *L = &t->layers[l];
        const st_tensor *mats[] = {L->qkv, L->q_proj, L->k_proj, L->v_proj, L->attn_out, L->ff_proj, L->up_proj, L->ff_out};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) n += fp8_saving(m, mats[i], W);
        const moe_layer_tensors *M = L->moe;
        if (!M) continue;
        for (int e = 0; e < c->n_experts; e++)
            n += fp8_saving(m, M->gate[e], W) + fp8_saving(m, M->up[e], W) + fp8_saving(m, M->down[e], W);
        n += fp8_saving(m, M->sh_gate, W) + fp8_saving(m, M->sh_up, W) + fp8_saving(m, M->sh_down, W);
    }
    return n;
}

uint64_t model_act_bytes(const model *m, int world, uint64_t tokens) {
    const model_config *c = &m->cfg;
    const uint64_t W = world > 1 ? (uint64_t)world : 1, d = (uint64_t)c->d_model;
    const uint64_t qd = (uint64_t)c->n_heads * (uint64_t)c->head_dim / W;
    const uint64_t kvd = (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim / W, F = (uint64_t)c->ffn_hidden / W;
    /* x, h [d]; q, att [qd]; k, v [kvd]; gate, up [F] per token (llada.c scratch_reserve) */
    uint64_t per_tok = 2u * d + 2u * qd + 2u * kvd + 2u * F;
    if (c->n_experts > 0)   /* moe.c scratch: router logits, routed rows in / out, expert and shared widths
                               (the host dispatch's; the device dispatch's workspace is smaller) */
        per_tok += (uint64_t)c->n_experts + (uint64_t)c->moe_top_k * (2u * d + 2u * (uint64_t)c->moe_ffn) +
                   2u * (uint64_t)c->shared_ffn + d;
    /* LM head: rows of xo [d] + logits [V] per output row, at most one 16M-element chunk's worth
     * of rows (llada.c lm_chunk_rows) or every token */
    uint64_t chunk = (16u << 20) / (uint64_t)c->n_embd_rows;
    if (chunk < 16) chunk = 16;
    const uint64_t out_rows = tokens < chunk ? tokens : chunk;
    return 2u * (tokens * per_tok + out_rows * (d + (uint64_t)c->n_embd_rows));
}

/* What joined weights (backend_packs) add to model_act_bytes: gate|up's product is twice the MLP width
 * (llada.c scratch_reserve: up [2F]), and a q|k|v product wider than up has its own buffer. An upper
 * bound: a layer the loader keeps separate (quantized, biases, QK-norm) needs less. */
static uint64_t joined_act_bytes(backend *be, const model *m, int world, uint64_t tokens) {
    const unsigned p = backend_packs(be);
    const model_config *c = &m->cfg;
    const uint64_t W = world > 1 ? (uint64_t)world : 1, F = (uint64_t)c->ffn_hidden / W;
    const uint64_t qkv = (uint64_t)(c->n_heads + 2 * c->n_kv_heads) * (uint64_t)c->head_dim / W;
    const uint64_t up = p & BACKEND_PACK_GATE_UP ? 2 * F : F;
    uint64_t per_tok = up - F;
    if ((p & BACKEND_PACK_QKV) && up < qkv) per_tok += qkv;
    return 2u * tokens * per_tok;
}

int model_fit_check(backend *be, const model *m, int world, uint64_t tokens, uint64_t dev_rows, uint64_t kv_rows,
                    um_err *err) {
    if (!backend_has(be, BACKEND_CAP_DEVICE_MEMORY)) return 0;   /* host memory: nothing to check */
    const uint64_t kb = model_kv_bytes(&m->cfg, world, kv_rows, (int)dtype_size(backend_act_dtype(be)));
    const uint64_t wb = model_weight_bytes(m, world) -
                        (backend_has(be, BACKEND_CAP_FP8) ? model_weight_fp8_savings(m, world) : 0),
                   ab = model_act_bytes(m, world, tokens) + joined_act_bytes(be, m, world, tokens) +
                        2u * dev_rows * ((uint64_t)m->cfg.d_model + (uint64_t)m->cfg.n_embd_rows) + kb;
    if (backend_check_fit(be, wb, ab, err) != 0) {
        if (kv_rows) {   /* say how much of it the caches take (--cache none does not lower it: requests choose) */
            const size_t n = strlen(err->msg);
            snprintf(err->msg + n, sizeof err->msg - n, "; the activations include %.2f GiB of KV caches for %llu positions",
                     (double)kb / (double)(1ull << 30), (unsigned long long)kv_rows);
        }
        return -1;
    }
    log_info("%s: %.2f GiB weights%s + %.2f GiB activations (%llu tokens per forward; %.2f GiB of it KV caches for "
             "%llu positions) fit",
             backend_name(be), (double)wb / (double)(1ull << 30), world > 1 ? " (this rank's shard)" : "",
             (double)ab / (double)(1ull << 30), (unsigned long long)tokens, (double)kb / (double)(1ull << 30),
             (unsigned long long)kv_rows);
    backend_set_upload_total(be, wb, "weights");
    return 0;
}

/* ---------------------------------------------------------------- setup fingerprint */

enum { FP_FLAG, FP_CFG, FP_CFG_F32, FP_TENSORS, FP_WEIGHTS, FP_VERSION };

/* One u64 (little-endian) per entry, in this order. */
static const struct {
    const char *name;
    int         kind;
} k_fp[] = {
    {"fingerprint version", FP_VERSION}, {"--tp", FP_FLAG}, {"--nnodes", FP_FLAG},
    {"GPUs per node (--gpus/--device)", FP_FLAG}, {"--max-seq", FP_FLAG}, {"--max-batch", FP_FLAG},
    {"architecture", FP_CFG}, {"d_model", FP_CFG}, {"n_layers", FP_CFG}, {"n_heads", FP_CFG}, {"n_kv_heads", FP_CFG},
    {"head_dim", FP_CFG}, {"mlp_hidden_size", FP_CFG}, {"vocab_size", FP_CFG}, {"embedding_size", FP_CFG},
    {"max_sequence_length", FP_CFG}, {"rope_theta", FP_CFG_F32}, {"rotary dims", FP_CFG},
    {"norm eps", FP_CFG_F32}, {"weight_tying", FP_CFG}, {"logits shifted", FP_CFG}, {"block_causal", FP_CFG},
    {"mask_token_id", FP_CFG}, {"tensor count", FP_TENSORS}, {"tensor names, dtypes or shapes", FP_TENSORS},
    {"weights (safetensors headers, file sizes or sampled bytes)", FP_WEIGHTS},
};
#define FP_N ((int)(sizeof k_fp / sizeof k_fp[0]))
_Static_assert(FP_N * 8 <= MODEL_TP_FP_BYTES, "fingerprint size");

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

void model_tp_fingerprint(const model *m, const model_tp_opts *o, uint8_t out[MODEL_TP_FP_BYTES]) {
    const model_config *c = &m->cfg;
    uint64_t v[FP_N];
    int k = 0;
    v[k++] = 1;
    v[k++] = (uint64_t)o->tp;
    v[k++] = (uint64_t)(o->dist.nnodes > 1 ? o->dist.nnodes : 1);
    v[k++] = (uint64_t)o->n_local;
    v[k++] = (uint64_t)o->max_seq;
    v[k++] = (uint64_t)o->max_batch;
    v[k++] = (uint64_t)c->arch, v[k++] = (uint64_t)c->d_model, v[k++] = (uint64_t)c->n_layers;
    v[k++] = (uint64_t)c->n_heads, v[k++] = (uint64_t)c->n_kv_heads, v[k++] = (uint64_t)c->head_dim;
    v[k++] = (uint64_t)c->ffn_hidden, v[k++] = (uint64_t)(int64_t)c->vocab_size, v[k++] = (uint64_t)c->n_embd_rows;
    v[k++] = (uint64_t)c->max_seq, v[k++] = f32_bits(c->rope_theta), v[k++] = (uint64_t)c->rot_dim;
    v[k++] = f32_bits(c->norm_eps), v[k++] = (uint64_t)c->weight_tying, v[k++] = (uint64_t)c->logits_shifted;
    v[k++] = (uint64_t)c->block_causal, v[k++] = (uint64_t)(int64_t)c->mask_id;
    uint64_t nt = 0, ht = 0xcbf29ce484222325ull, hw = 0xcbf29ce484222325ull;
    for (int f = 0; f < m->ck.n_files; f++) {
        const st_file *sf = &m->ck.files[f];
        const unsigned char *base = sf->map.data;
        uint64_t flen = sf->map.len;
        hw = fnv(hw, &flen, sizeof flen);
        if (base && sf->header_len <= flen)   /* the header: names, dtypes, shapes, offsets (and GGUF metadata) */
            hw = fnv(hw, base, sf->header_len);
        for (int t = 0; t < sf->n_tensors; t++) {
            const st_tensor *st = &sf->tensors[t];
            nt++;
            ht = fnv(ht, st->name, strlen(st->name) + 1);
            ht = fnv(ht, st->type_name, strlen(st->type_name) + 1);
            ht = fnv(ht, &st->ndim, sizeof st->ndim);
            ht = fnv(ht, st->shape, (size_t)st->ndim * sizeof st->shape[0]);
            /* 3 x 32 bytes of data (start, middle, end): different checkpoints of one shape differ here */
            const unsigned char *d = st->data;
            const size_t n = st->nbytes, w = n < 32 ? n : 32;
            if (d && n) {
                hw = fnv(hw, d, w);
                hw = fnv(hw, d + (n - w) / 2, w);
                hw = fnv(hw, d + n - w, w);
            }
        }
    }
    v[k++] = nt, v[k++] = ht, v[k++] = hw;
    CHECK(k == FP_N);
    memset(out, 0, MODEL_TP_FP_BYTES);
    for (int i = 0; i < FP_N; i++)
        for (int b = 0; b < 8; b++) out[8 * i + b] = (uint8_t)(v[i] >> (8 * b));
}

static uint64_t fp_get(const uint8_t *p, int i) {
    uint64_t v = 0;
    for (int b = 7; b >= 0; b--) v = v << 8 | p[8 * i + b];
    return v;
}

static double fp_f32(uint64_t bits) {
    uint32_t u = (uint32_t)bits;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

void model_tp_fingerprint_describe(const void *node0, const void *theirs, size_t len, int their_node, char *msg,
                                   size_t cap) {
    const uint8_t *a = node0, *b = theirs;
    size_t o = 0;
    int n = 0, more = 0;
    msg[0] = '\0';
    if (len != MODEL_TP_FP_BYTES || fp_get(a, 0) != fp_get(b, 0)) {
        snprintf(msg, cap, "node %d runs a different unmask version (setup fingerprint v%llu, node 0 has v%llu)",
                 their_node, len == MODEL_TP_FP_BYTES ? (unsigned long long)fp_get(b, 0) : 0ull,
                 (unsigned long long)fp_get(a, 0));
        return;
    }
    for (int i = 1; i < FP_N && o + 1 < cap; i++) {
        const uint64_t x = fp_get(a, i), y = fp_get(b, i);
        if (x == y) continue;
        if (n == 3) {
            more++;
            continue;
        }
        const char *sep = n++ ? "; " : "";
        int w;
        switch (k_fp[i].kind) {
        case FP_FLAG:
            w = snprintf(msg + o, cap - o, "%snode %d has %s %llu, node 0 has %llu", sep, their_node, k_fp[i].name,
                         (unsigned long long)y, (unsigned long long)x);
            break;
        case FP_CFG:
            w = snprintf(msg + o, cap - o, "%snode %d's model differs (config.json %s %lld vs %lld on node 0)", sep,
                         their_node, k_fp[i].name, (long long)y, (long long)x);
            break;
        case FP_CFG_F32:
            w = snprintf(msg + o, cap - o, "%snode %d's model differs (config.json %s %.9g vs %.9g on node 0)", sep,
                         their_node, k_fp[i].name, fp_f32(y), fp_f32(x));
            break;
        case FP_TENSORS:
            if (i == FP_N - 3)
                w = snprintf(msg + o, cap - o, "%snode %d's model differs (%llu tensors vs %llu on node 0)", sep,
                             their_node, (unsigned long long)y, (unsigned long long)x);
            else
                w = snprintf(msg + o, cap - o, "%snode %d's model differs (%s)", sep, their_node, k_fp[i].name);
            break;
        default:
            w = snprintf(msg + o, cap - o, "%snode %d's model differs (%s)", sep, their_node, k_fp[i].name);
            break;
        }
        if (w < 0) break;
        o += (size_t)w;
        if (o >= cap) o = cap - 1;
    }
    if (more && o + 1 < cap) snprintf(msg + o, cap - o, " (and %d more)", more);
    if (!n) snprintf(msg, cap, "node %d's setup differs from node 0's", their_node);
}

/* ---------------------------------------------------------------- setup */

/* Every rank says whether its setup worked; all ranks learn the first failure. */
typedef struct tp_status {
    int32_t ok;
    char    msg[508];
} tp_status;

static int status_round(comm *c, int ok, const um_err *mine, um_err *err) {
    int bad = -1;
    tp_status first = {0};
    for (int r = 0; r < c->world; r++) {
        tp_status st;
        memset(&st, 0, sizeof st);
        if (r == c->rank) {
            st.ok = ok;
            if (!ok) snprintf(st.msg, sizeof st.msg, "%s", mine->msg);
        }
        comm_broadcast(c, &st, sizeof st, r);
        if (!st.ok && bad < 0) {
            bad = r;
            first = st;
        }
    }
    if (bad < 0) return 0;
    if (bad == c->rank) return -1;   /* err already holds it */
    return um_err_set(err, UM_ERR_RESOURCE, "tensor-parallel rank %d: %s", bad, first.msg);
}

static void set_stopping(model_tp *g);

/* backend_comm_join's cancelled: another local rank's init failed, so this group can never form */
static int init_cancelled(void *user) { return atomic_load(&((model_tp *)user)->init_failed); }

/* Rank setup on the rank's own thread: comm (NCCL), shard ctx, status round. */
static int rank_setup(tp_rank *t) {
    model_tp *g = t->g;
    if (g->nccl) {
        t->c = backend_has(t->be, BACKEND_CAP_COMM)
                   ? backend_comm_join(t->be, g->id, t->rank, g->world, init_cancelled, g, 0, &t->err)
                   : NULL;
        if (!t->c && t->err.code == UM_ERR_NONE)
            um_err_set(&t->err, UM_ERR_UNSUPPORTED, "%s offers no device collectives", backend_name(t->be));
        if (!t->c) {
            um_err_prefix(&t->err, "rank %d (%s)", t->rank, t->device);
            /* cannot take part in the status round: the first failure (not an abort it caused) is the
             * group's message, and the other local ranks abort their pending init instead of waiting.
             * Ranks on other nodes: this node exits, its link closes and they end (on_node_lost). */
            /* --- stop lock { */
            pthread_mutex_lock(&g->stop_lock);
            if (!g->init_err.msg[0] && t->err.code != UM_ERR_CANCELLED) g->init_err = t->err;
            pthread_mutex_unlock(&g->stop_lock);
            /* } stop lock --- */
            atomic_store(&g->init_failed, 1);
            /* the other nodes' ranks are waiting in their init too: tell them why (on_peer_error) */
            if (t->err.code != UM_ERR_CANCELLED) comm_link_send_error(g->link, t->err.msg);
            return -1;
        }
    } else {
        t->c = comm_local_get(g->lg, t->rank);
    }
    model_shard sh = {.rank = t->rank, .world = g->world, .comm = t->c};
    int ok = !t->fit_failed && model_ctx_init_shard(&t->ctx, g->m, t->be, &sh, &t->err) == 0;
    if (ok) t->ctx_ok = 1;
    else if (!t->fit_failed) um_err_prefix(&t->err, "rank %d (%s)", t->rank, t->device);
    um_err other = {0};
    if (status_round(t->c, ok, &t->err, &other) != 0) {
        if (ok) t->err = other;
        set_stopping(g);   /* every rank of every node saw the failure: peers leaving is expected now */
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- liveness (multi-node) */

static void set_stopping(model_tp *g) {
    /* --- stop lock { */
    pthread_mutex_lock(&g->stop_lock);
    g->stopping = 1;
    pthread_cond_broadcast(&g->stop_cv);
    pthread_mutex_unlock(&g->stop_lock);
    /* } stop lock --- */
}

/* The link watcher saw a peer node's connection close. While the group is not stopping, the
 * ranks are (or will be) blocked inside NCCL collectives that can never complete, so the process
 * ends with a clear message. A follower gets a grace period: node 0 closes its links right after
 * the stop message, which may overtake that message's arrival. So does node 0 while the group is
 * still being set up: a follower that failed the setup status round closes its link as soon as the
 * round is over, possibly before node 0's ranks have returned from it with that failure's message.
 * Runs on the watcher thread. */
#define TP_LOST_GRACE_S 10

static void on_node_lost(void *user, int node) {
    model_tp *g = user;
    int stopping;
    /* --- stop lock { */
    pthread_mutex_lock(&g->stop_lock);
    if (g->node_rank != 0 || !g->leader_ok) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += TP_LOST_GRACE_S;
        while (!g->stopping && pthread_cond_timedwait(&g->stop_cv, &g->stop_lock, &ts) == 0) {}
    }
    stopping = g->stopping;
    pthread_mutex_unlock(&g->stop_lock);
    /* } stop lock --- */
    if (stopping) return;
    if (g->node_rank == 0)
        fprintf(stderr, "error: tensor parallel: node %d disconnected (its process ended or the network failed); the "
                        "group cannot run forwards any more: exiting\n", node);
    else
        fprintf(stderr, "error: tensor parallel: node 0 disconnected without stopping the group (its process ended or "
                        "the network failed): exiting\n");
    fflush(stderr);
    _exit(1);
}

/* Node 0: a follower node asked to stop the group (it received SIGINT/SIGTERM: comm_stop_request
 * on that node). Node 0 stops as if it got the signal itself: the server drains, stops the group
 * (the follower then exits 0) and exits 0. Runs on the watcher thread. */
static void on_node_stop(void *user, int node, int sig) {
    model_tp *g = user;
    /* --- stop lock { */
    pthread_mutex_lock(&g->stop_lock);
    const int stopping = g->stopping;
    pthread_mutex_unlock(&g->stop_lock);
    /* } stop lock --- */
    if (stopping) return;   /* the group is being stopped already */
    fprintf(stderr, "unmask: tensor parallel: node %d received %s and asked to stop the group: stopping\n", node,
            sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a stop signal");
    fflush(stderr);
    kill(getpid(), SIGTERM);
}

/* Another node's setup failed before the status round (its message came over the link): this
 * node's ranks stop waiting in their NCCL init and fail with that message. Watcher thread. */
static void on_peer_error(void *user, int node, const char *msg) {
    model_tp *g = user;
    /* --- stop lock { */
    pthread_mutex_lock(&g->stop_lock);
    if (!g->init_err.msg[0]) um_err_set(&g->init_err, UM_ERR_RESOURCE, "node %d: %s", node, msg);
    pthread_mutex_unlock(&g->stop_lock);
    /* } stop lock --- */
    atomic_store(&g->init_failed, 1);
}

/* ---------------------------------------------------------------- follower loop */

static void follower_serve(tp_rank *t) {
    uint8_t *buf = NULL;
    size_t cap = 0;
    for (;;) {
        int32_t h[8];
        comm_broadcast(t->c, h, sizeof h, 0);
        CHECK(h[0] == TP_MAGIC);
        if (h[1] == TP_MSG_STOP) {
            set_stopping(t->g);
            break;
        }
        CHECK(h[1] == TP_MSG_FORWARD);
        const int n_seqs = h[2], n_tok = h[3], n_out = h[4], flags = h[5];
        const size_t bytes = (size_t)(uint32_t)h[6];
        if (bytes > cap) {
            cap = bytes + bytes / 2;
            free(buf);
            buf = xmalloc(cap);
        }
        comm_broadcast(t->c, buf, bytes, 0);
        int32_t *p = (int32_t *)buf;
        fwd_batch b = {.n_seqs = n_seqs, .n_out = n_out};
        b.seq_start = p, p += n_seqs + 1;
        b.tokens = p, p += n_tok;
        if (flags & TP_HAS_POS) b.pos = p, p += n_tok;
        if (flags & TP_HAS_ROWS) b.out_rows = p, p += n_out;
        if (flags & TP_HAS_KV) {
            b.kv = p;
            for (int q = 0; q < n_seqs; q++)
                if (b.kv[q]) model_kv_ensure(&t->ctx, b.kv[q], p[n_seqs + q]);
            p += 2 * n_seqs;
        }
        if (flags & TP_HAS_REL) {
            for (int i = 0; i < p[0]; i++) model_kv_close(&t->ctx, p[1 + i]);
            p += 1 + p[0];
        }
        if (flags & TP_HAS_BLEN) b.block_len = p, p += n_seqs;
        if (flags & TP_HAS_VALID) b.key_valid = (const uint8_t *)p;
        CHECK(b.seq_start[n_seqs] == n_tok);
        llada_forward_shard(&t->ctx, &b);
    }
    free(buf);
}

static void *follower_main(void *arg) {
    tp_rank *t = arg;
    if (rank_setup(t) == 0) {
        if (t->g->node_rank > 0 && t->local == 0)   /* the status round passed on every rank */
            log_info("tensor parallel: node %d joined the group: ranks %d..%d of %d ready, serving node 0's batches",
                     t->g->node_rank, t->rank, t->rank + t->g->n_local - 1, t->g->world);
        follower_serve(t);
        t->rc = 0;
    } else {
        t->rc = -1;
    }
    if (t->ctx_ok) model_ctx_free(&t->ctx);
    t->ctx_ok = 0;
    if (t->g->nccl && t->c) comm_free(t->c);
    t->c = NULL;
    return NULL;
}

/* ---------------------------------------------------------------- group */

static void group_free(model_tp *g) {
    set_stopping(g);   /* a setup failure or a stop: peers closing their links is expected now */
    for (int i = 0; i < g->n_local; i++) {
        tp_rank *t = &g->r[i];
        if (t->started) pthread_join(t->th, NULL);
        if (t->ctx_ok) model_ctx_free(&t->ctx);
        if (g->nccl && t->c) comm_free(t->c);
        if (t->be) backend_free(t->be);
    }
    comm_link_close(g->link);
    comm_local_group_free(g->lg);
    pthread_cond_destroy(&g->stop_cv);
    pthread_mutex_destroy(&g->stop_lock);
    free(g->r);
    free(g->msg);
    free(g);
}

/* Validate, open the backends, check the fit, get the comm ready; no thread started yet. */
static model_tp *group_prepare(const model *m, const model_tp_opts *o, um_err *err) {
    const int nnodes = o->dist.nnodes > 1 ? o->dist.nnodes : 1, node = nnodes > 1 ? o->dist.node_rank : 0;
    if (o->tp < 2) {
        um_err_param(err, "tp", "a tensor-parallel group needs --tp >= 2, got %d", o->tp);
        return NULL;
    }
    if (o->n_local < 1 || o->n_local > MODEL_TP_MAX_LOCAL || o->n_local * nnodes != o->tp) {
        um_err_param(err, "tp", "--tp %d over %d node%s needs %d rank(s) per node, this node has %d", o->tp, nnodes,
                     nnodes > 1 ? "s" : "", o->tp / nnodes, o->n_local);
        return NULL;
    }
    if (model_tp_check(m, o->tp, err) != 0) return NULL;
    /* accelerator ranks (one device each) use the backend's collectives, CPU ranks comm_local */
    const int accel = backend_device_parse(o->devices[0], NULL) == 1;
    for (int i = 1; i < o->n_local; i++)
        if ((backend_device_parse(o->devices[i], NULL) == 1) != accel) {
            um_err_param(err, "device", "a tensor-parallel group cannot mix cpu and cuda devices");
            return NULL;
        }
    if (!accel && nnodes > 1) {
        um_err_param(err, "nnodes",
                     "multi-node tensor parallelism needs CUDA + NCCL (--device cuda:N); on the CPU --tp runs threads "
                     "of one process");
        if (err) err->code = UM_ERR_UNSUPPORTED;
        return NULL;
    }
    if (accel && !backend_device_comm_available(o->devices[0])) {
        um_err_set(err, UM_ERR_UNSUPPORTED,
                   "tensor parallelism on GPUs needs NCCL (this unmask was built without it, or libnccl cannot be "
                   "opened)");
        return NULL;
    }
    model_tp *g = xcalloc(1, sizeof *g);
    g->m = m;
    g->world = o->tp;
    g->n_local = o->n_local;
    g->node_rank = node;
    g->nccl = accel;
    pthread_mutex_init(&g->stop_lock, NULL);
    pthread_cond_init(&g->stop_cv, NULL);
    g->r = xcalloc((size_t)o->n_local, sizeof *g->r);
    /* Multi-node: rendezvous first, so a node whose setup fails still reaches the others: a fit
     * failure is reported in the status round (fit_failed), any earlier failure closes this node's
     * link and the peers' watchers end their processes (on_node_lost) instead of waiting for the
     * bootstrap or a collective to time out. */
    if (accel && nnodes > 1) {
        if (node == 0 && backend_device_comm_id(o->devices[0], g->id, err) != 0) goto fail;
        if (node == 0) log_info("tensor parallel: waiting for %d other node(s) on %s", nnodes - 1, o->dist.init_addr);
        uint8_t fp[MODEL_TP_FP_BYTES];
        model_tp_fingerprint(m, o, fp);
        comm_dist_opts dist = o->dist;
        dist.fp = (comm_fingerprint){.data = fp, .len = sizeof fp, .describe = model_tp_fingerprint_describe};
        if (comm_bootstrap_exchange_link(&dist, g->id, sizeof g->id, &g->link, err) != 0) goto fail;
        comm_link_on_error(g->link, on_peer_error);
        comm_link_watch(g->link, on_node_lost, node == 0 ? on_node_stop : NULL, g);
    }
    for (int i = 0; i < o->n_local; i++) {
        tp_rank *t = &g->r[i];
        t->g = g;
        t->local = i;
        t->rank = node * o->n_local + i;
        t->device = o->devices[i];
        t->be = backend_init_device(t->device, o->n_threads, err);
        if (!t->be) {
            um_err_prefix(err, "tensor-parallel rank %d (%s)", t->rank, t->device);
            goto fail;
        }
        if (o->fit_tokens && model_fit_check(t->be, m, o->tp, o->fit_tokens, 0, o->fit_kv_rows, err) != 0) {
            if (nnodes > 1) {   /* tell the other nodes in the status round */
                t->err = *err;
                um_err_prefix(&t->err, "rank %d (%s)", t->rank, t->device);
                t->fit_failed = 1;
                *err = (um_err){0};
                continue;
            }
            um_err_prefix(err, "tensor-parallel rank %d", t->rank);
            goto fail;
        }
    }
    if (accel) {
        if (nnodes == 1 && backend_device_comm_id(o->devices[0], g->id, err) != 0) goto fail;
    } else {
        g->lg = comm_local_group_create(o->tp);
    }
    return g;
fail:
    if (g->link) comm_link_send_error(g->link, err ? err->msg : "setup failed");   /* the peers stop waiting */
    group_free(g);
    return NULL;
}

/* Start follower threads for local ranks [first, n_local), signals blocked (house rule). */
static void start_followers(model_tp *g, int first) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int i = first; i < g->n_local; i++) {
        if (pthread_create(&g->r[i].th, NULL, follower_main, &g->r[i]) != 0) UM_FATAL("cannot start a TP follower thread");
        g->r[i].started = 1;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

model_tp *model_tp_create(const model *m, const model_tp_opts *o, um_err *err) {
    if (o->dist.nnodes > 1 && o->dist.node_rank != 0) {
        um_err_set(err, UM_ERR_INTERNAL, "model_tp_create on node %d (use model_tp_follow)", o->dist.node_rank);
        return NULL;
    }
    model_tp *g = group_prepare(m, o, err);
    if (!g) return NULL;
    start_followers(g, 1);
    tp_rank *t = &g->r[0];
    if (rank_setup(t) != 0) {
        *err = t->err;
        for (int i = 1; i < g->n_local; i++) {   /* the followers saw the failed round or init; they return */
            pthread_join(g->r[i].th, NULL);
            g->r[i].started = 0;
        }
        /* --- stop lock { */
        pthread_mutex_lock(&g->stop_lock);
        if (g->init_err.msg[0]) *err = g->init_err;   /* the rank whose init failed, not the ones that aborted */
        pthread_mutex_unlock(&g->stop_lock);
        /* } stop lock --- */
        group_free(g);
        return NULL;
    }
    t->ctx.tp = g;
    t->ctx.tp_send = model_tp_send_batch;
    /* --- stop lock { */
    pthread_mutex_lock(&g->stop_lock);
    g->leader_ok = 1;
    pthread_mutex_unlock(&g->stop_lock);
    /* } stop lock --- */
    log_info("tensor parallel: %d ranks (%s%s), leader on %s", g->world, g->nccl ? "NCCL" : "CPU threads",
             o->dist.nnodes > 1 ? ", several nodes" : "", t->device);
    return g;
}

model_ctx *model_tp_leader(model_tp *g) { return &g->r[0].ctx; }

void model_tp_free(model_tp *g) {
    if (!g) return;
    set_stopping(g);   /* from here on, peers closing their links is expected */
    if (g->leader_ok) {
        comm *c = g->r[0].c;
        int32_t h[8] = {TP_MAGIC, TP_MSG_STOP, 0, 0, 0, 0, 0, g->seq};
        comm_broadcast(c, h, sizeof h, 0);
        g->r[0].ctx.tp = NULL;
    }
    group_free(g);
}

int model_tp_follow(const model *m, const model_tp_opts *o, um_err *err) {
    if (o->dist.nnodes < 2 || o->dist.node_rank < 1)
        return um_err_set(err, UM_ERR_INTERNAL, "model_tp_follow needs a node rank >= 1");
    model_tp *g = group_prepare(m, o, err);
    if (!g) return -1;
    start_followers(g, 0);
    int rc = 0;
    for (int i = 0; i < g->n_local; i++) {
        pthread_join(g->r[i].th, NULL);
        g->r[i].started = 0;
        if (g->r[i].rc != 0 && rc == 0) {
            *err = g->r[i].err;
            rc = -1;
        }
    }
    /* --- stop lock { */
    pthread_mutex_lock(&g->stop_lock);
    if (rc != 0 && g->init_err.msg[0]) *err = g->init_err;   /* the failing rank's message (this node's or a peer's) */
    pthread_mutex_unlock(&g->stop_lock);
    /* } stop lock --- */
    group_free(g);
    return rc;
}

/* ---------------------------------------------------------------- leader */

void model_tp_send_batch(model_tp *g, const fwd_batch *b) {
    CHECK(g->leader_ok);
    const int n_seqs = b->n_seqs, n_tok = b->seq_start[b->n_seqs];
    const int n_out = b->out_rows ? b->n_out : n_tok;
    const int32_t *rel = NULL;
    const int n_rel = model_kv_take_released(model_tp_leader(g), &rel);
    const int flags = (b->pos ? TP_HAS_POS : 0) | (b->key_valid ? TP_HAS_VALID : 0) | (b->out_rows ? TP_HAS_ROWS : 0) |
                      (b->kv ? TP_HAS_KV : 0) | (n_rel ? TP_HAS_REL : 0) | (b->block_len ? TP_HAS_BLEN : 0);
    size_t ints = (size_t)(n_seqs + 1) + (size_t)n_tok + (b->pos ? (size_t)n_tok : 0) + (b->out_rows ? (size_t)n_out : 0) +
                  (b->kv ? 2u * (size_t)n_seqs : 0) + (n_rel ? 1u + (size_t)n_rel : 0) + (b->block_len ? (size_t)n_seqs : 0);
    size_t bytes = ints * sizeof(int32_t) + (b->key_valid ? (size_t)n_tok : 0);
    CHECK(bytes < 0x7fffffffu);
    if (bytes > g->msg_cap) {
        g->msg_cap = bytes + bytes / 2;
        free(g->msg);
        g->msg = xmalloc(g->msg_cap);
    }
    int32_t *p = (int32_t *)g->msg;
    memcpy(p, b->seq_start, (size_t)(n_seqs + 1) * sizeof *p), p += n_seqs + 1;
    memcpy(p, b->tokens, (size_t)n_tok * sizeof *p), p += n_tok;
    if (b->pos) memcpy(p, b->pos, (size_t)n_tok * sizeof *p), p += n_tok;
    if (b->out_rows) memcpy(p, b->out_rows, (size_t)n_out * sizeof *p), p += n_out;
    if (b->kv) {
        memcpy(p, b->kv, (size_t)n_seqs * sizeof *p);
        for (int q = 0; q < n_seqs; q++) p[n_seqs + q] = b->kv[q] ? model_kv_rows(model_tp_leader(g), b->kv[q]) : 0;
        p += 2 * n_seqs;
    }
    if (n_rel) {
        *p++ = n_rel;
        memcpy(p, rel, (size_t)n_rel * sizeof *p), p += n_rel;
    }
    if (b->block_len) memcpy(p, b->block_len, (size_t)n_seqs * sizeof *p), p += n_seqs;
    if (b->key_valid) memcpy(p, b->key_valid, (size_t)n_tok);
    int32_t h[8] = {TP_MAGIC, TP_MSG_FORWARD, n_seqs, n_tok, n_out, flags, (int32_t)bytes, ++g->seq};
    comm *c = g->r[0].c;
    comm_broadcast(c, h, sizeof h, 0);
    comm_broadcast(c, g->msg, bytes, 0);
}
