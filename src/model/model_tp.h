/*
 * model_tp.h — a tensor-parallel group that looks like ONE model_ctx to the engine, and the memory
 * sizing of a model on a backend.
 *
 * The leader (global rank 0) is an ordinary model_ctx whose `tp` field points at the group: every
 * model_forward / model_forward_dev on it first broadcasts the batch (a fixed header, then the
 * index arrays) over the comm, then runs rank 0's shard and returns the logits. Ranks 1..N-1 are
 * followers: each has its own backend and model_ctx_init_shard, and loops "receive a batch ->
 * embedding + layers (their all-reduces pair with the leader's)" until the leader's stop message.
 * The same follower loop serves threads of this process and ranks on other nodes.
 *   - CPU: N ranks = N threads of this process over comm_local (one node only).
 *   - CUDA: one rank per GPU over NCCL; several nodes agree on the NCCL id through
 *     comm_bootstrap_exchange (--dist-init-addr host:port --nnodes N --node-rank R). Global rank of
 *     local GPU j on node r = r * n_local + j; node 0's first GPU is the leader.
 * Not here: the engine loop (sched/), flag parsing (cli/, server/).
 * Threading: model_tp_create / model_tp_follow / model_tp_free on the loader or main thread; the
 * leader ctx afterwards on ONE engine thread; the followers on threads started here.
 */
#ifndef UM_MODEL_TP_H
#define UM_MODEL_TP_H

#include <stdint.h>

#include "backend/comm.h"
#include "model/model.h"

#define MODEL_TP_MAX_LOCAL 64

typedef struct model_tp model_tp;

typedef struct model_tp_opts {
    int            tp;                          /* ranks in the group (world), >= 2 */
    int            n_local;                     /* ranks on this node: tp / nnodes */
    const char    *devices[MODEL_TP_MAX_LOCAL]; /* [n_local] "cpu" or "cuda:N", not owned */
    int            n_threads;                   /* CPU compute threads per rank (0 = all cores) */
    comm_dist_opts dist;                        /* nnodes <= 1: one node */
    uint64_t       fit_tokens;                  /* canvas tokens of the largest forward (serve:
                                                   2 x max batch x max seq, CFG doubling a canvas):
                                                   CUDA checks the fit before uploading; 0 = no check */
    uint64_t       fit_kv_rows;                 /* KV cache positions the fit check reserves too
                                                   (model_kv_bytes; serve: as fit_tokens) */
    int            max_seq;                     /* serving settings every node must agree on (the
                                                   multi-node setup fingerprint): --max-seq (effective,
                                                   tokens) and --max-batch; 0 when not serving */
    int            max_batch;
} model_tp_opts;

/* Node 0: create the group; the leader ctx is model_tp_leader(g). Checks that tp divides the
 * model's heads / MLP width (UM_ERR_UNSUPPORTED), opens every local backend first (a bad device
 * fails before any thread starts), checks the fit (CUDA), then initialises all ranks; an error on
 * any rank (its message names the rank) fails the whole group. Several nodes: the rendezvous comes
 * before the backends, and a failed fit check is reported in the setup status round instead of
 * ending this node at once, so every node fails with that rank's message (a node failing earlier
 * closes its liveness link, which ends the others). */
model_tp  *model_tp_create(const model *m, const model_tp_opts *o, um_err *err);
model_ctx *model_tp_leader(model_tp *g);
/* Stops the followers (stop message), joins them and frees everything incl. the leader ctx. */
void       model_tp_free(model_tp *g);
/* Nodes 1..N-1: join the group with every local rank as a follower and serve until the leader
 * stops (0) or setup fails (-1 + err). Blocks. */
int        model_tp_follow(const model *m, const model_tp_opts *o, um_err *err);

/* Multi-node setup fingerprint (docs/parallel.md): bytes that must be equal on every node — the
 * fingerprint version, --tp, --nnodes, ranks per node, --max-seq, --max-batch, the config.json
 * fields the forward uses, a digest of the tensor table (names, dtypes, shapes) and a cheap digest
 * of the weights (each safetensors header and file size, plus 3 x 32 bytes sampled from every
 * tensor). Exchanged in the bootstrap hello; node 0 refuses a node whose bytes differ with the
 * line model_tp_fingerprint_describe writes. out: MODEL_TP_FP_BYTES. */
#define MODEL_TP_FP_BYTES (8 * 32)
void       model_tp_fingerprint(const model *m, const model_tp_opts *o, uint8_t out[MODEL_TP_FP_BYTES]);
/* "node 1 has --max-seq 512, node 0 has 1024" / "node 1's model differs (config.json n_layers: 3 here,
 * 2 on node 0)": every differing item (up to 3), joined by "; ". */
void       model_tp_fingerprint_describe(const void *node0, const void *theirs, size_t len, int their_node, char *msg,
                                         size_t cap);

/* Called by model_forward / model_forward_dev on the leader (engine thread). */
void       model_tp_send_batch(model_tp *g, const fwd_batch *b);


/* ---------------------------------------------------------------- memory sizing */

/* Device bytes of one rank's weights (bf16, as the CUDA backend uploads them) with `world` ranks. */
uint64_t model_weight_bytes(const model *m, int world);
/* What FP8 matrices save of that on a backend with BACKEND_CAP_FP8: one byte per element instead
 * of two, less their f32 scales — every matrix --quant fp8 converts (one scale per row), or the
 * matrices an FP8 checkpoint stores (its block scales). */
uint64_t model_weight_fp8_savings(const model *m, int world);
/* Activation bytes of one rank for a forward of `tokens` canvas tokens: the residual stream and
 * sublayer buffers (this rank's heads / MLP slice) plus one LM-head chunk (bf16 elements). */
uint64_t model_act_bytes(const model *m, int world, uint64_t tokens);
/* Backends with device memory (BACKEND_CAP_DEVICE_MEMORY): backend_check_fit(weights, activations)
 * before anything is uploaded (a clear UM_ERR_RESOURCE "does not fit" error with the numbers) and
 * the upload progress total. dev_rows: LM-head rows the device-resident decode loop keeps on the
 * device on top of the forward's own chunk (logits [V] + final hidden [d] each;
 * sched_opts.device_rows), 0 = none. kv_rows: KV cache positions (model_kv_bytes each) that may be
 * held at once, 0 = none. Host-memory backends: 0. */
int        model_fit_check(backend *be, const model *m, int world, uint64_t tokens, uint64_t dev_rows, uint64_t kv_rows,
                           um_err *err);

/* tp must divide m's n_heads, n_kv_heads and MLP width (model_config_check_tp on its config). */
int        model_tp_check(const model *m, int tp, um_err *err);

#endif /* UM_MODEL_TP_H */
