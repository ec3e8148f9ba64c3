/*
 * comm.h — collective communication between the ranks of a tensor-parallel group, behind a small
 * interface so the sharded forward is written once and tested on the CPU:
 *   - local (comm_local.c): N ranks = N threads of one process, shared buffers + barriers, a fixed
 *     reduction order (rank 0 + rank 1 + ...), so results are bit-reproducible. Host buffers.
 *   - NCCL (backend/cuda/comm_nccl.c, built when nccl.h is found): one GPU per rank, device buffers,
 *     collectives enqueued on the rank's CUDA stream. Ranks on several nodes agree on the NCCL
 *     unique id through comm_bootstrap_* (TCP; node 0 listens on --dist-init-addr host:port).
 *
 * Every rank calls every collective in the same order with the same sizes (a mismatch is a bug and
 * aborts where it can be detected). Threading: a comm handle belongs to its rank's thread.
 */
#ifndef UM_COMM_H
#define UM_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "util/dtype.h"
#include "util/err.h"

typedef struct comm comm;

typedef struct comm_ops {
    const char *name;
    /* buf[i] = sum over ranks of buf[i], in place; t = F32 or BF16 */
    void (*all_reduce_sum)(comm *c, void *buf, size_t n, enum dtype t);
    /* recv[r * bytes .. (r+1) * bytes) = rank r's send, for every rank r */
    void (*all_gather)(comm *c, const void *send, size_t bytes, void *recv);
    /* buf[0 .. bytes) of rank `root` copied into buf of every other rank. HOST buffers on every
     * implementation (NCCL stages through a device buffer and synchronises the rank's stream), so
     * it carries control messages (tensor-parallel batches, model_tp.c), not activations. */
    void (*broadcast)(comm *c, void *buf, size_t bytes, int root);
    void (*barrier)(comm *c);
    void (*free)(comm *c);
} comm_ops;

struct comm {
    const comm_ops *ops;
    int             rank, world;
    enum dtype      act_dtype;   /* dtype of the backend's activations (comm_all_reduce_act) */
    void           *impl;
};

static inline int comm_rank(const comm *c) { return c ? c->rank : 0; }
static inline int comm_world(const comm *c) { return c ? c->world : 1; }

void comm_all_reduce_sum(comm *c, void *buf, size_t n, enum dtype t);
void comm_all_reduce_sum_f32(comm *c, float *buf, size_t n);
/* all-reduce of an activation buffer of the rank's backend (F32 on CPU, BF16 on CUDA) */
void comm_all_reduce_act(comm *c, void *buf, size_t n);
void comm_all_gather(comm *c, const void *send, size_t bytes, void *recv);
/* host-buffer broadcast from `root` (comm_ops.broadcast); a no-op for world 1 */
void comm_broadcast(comm *c, void *buf, size_t bytes, int root);
void comm_barrier(comm *c);
void comm_free(comm *c);

/* ---------------------------------------------------------------- local (threads) */

typedef struct comm_local_group comm_local_group;

/* A group of `world` ranks; comm_local_get(g, r) is rank r's handle (owned by the group; each rank's
 * thread uses its own). Activation dtype F32 (the CPU backend). */
comm_local_group *comm_local_group_create(int world);
comm             *comm_local_get(comm_local_group *g, int rank);
void              comm_local_group_free(comm_local_group *g);

/* ---------------------------------------------------------------- NCCL */

#define COMM_NCCL_ID_BYTES 128
#define COMM_ID_BYTES      COMM_NCCL_ID_BYTES   /* a device group id (backend_device_comm_id) */

/* 1 when built with NCCL. */
int   comm_nccl_available(void);
/* A fresh NCCL unique id (rank 0 / node 0 only). */
int   comm_nccl_unique_id(uint8_t id[COMM_NCCL_ID_BYTES], um_err *err);
/* Join the group as `rank` of `world` on CUDA device `device`, collectives on `stream` (a
 * cudaStream_t). Activation dtype BF16. The communicator is non-blocking (ncclConfig_t.blocking =
 * 0): the init is polled (ncclCommGetAsyncError) and aborted (ncclCommAbort) -> NULL + err when
 * cancelled(user) becomes true (another rank failed before joining: the group can never form), or
 * after timeout_ms (<= 0: 600000), so one failed rank cannot leave the others blocked in
 * ncclCommInitRank. cancelled may be NULL. Test hook FAULT_NCCL_INIT_RANK (util/fault.h; off by
 * default; UNMASK_FAULT_NCCL_INIT_RANK=R) makes global rank R fail here before it joins, as a rank
 * whose device or NCCL init fails would. */
comm *comm_nccl_init(const uint8_t id[COMM_NCCL_ID_BYTES], int rank, int world, int device, void *stream,
                     int (*cancelled)(void *user), void *user, int timeout_ms, um_err *err);

/* ---------------------------------------------------------------- multi-node bootstrap (TCP) */

/* Setup fingerprint (model_tp.c builds it): every other node sends its bytes with its hello;
 * node 0 compares them with its own and refuses a node whose bytes differ. describe (node 0's
 * side) writes one line naming what differs ("node 1 has --max-seq 512, node 0 has 1024"). */
typedef struct comm_fingerprint {
    const void *data;        /* not owned; NULL = nothing to check */
    size_t      len;         /* bytes, < 64 KiB */
    void      (*describe)(const void *node0, const void *theirs, size_t len, int their_node, char *msg, size_t cap);
} comm_fingerprint;

/* --dist-init-addr host:port --nnodes N --node-rank R (SGLang style). */
typedef struct comm_dist_opts {
    const char      *init_addr;   /* "host:port" of node 0 */
    int              nnodes;      /* >= 1 */
    int              node_rank;   /* 0..nnodes-1 */
    int              timeout_ms;  /* for the whole rendezvous; <= 0: 120000 */
    comm_fingerprint fp;          /* setup that must agree on every node (zeroed: none) */
} comm_dist_opts;

/* Stop requests (SIGINT / SIGTERM). comm_stop_init() once, on the main thread, before the signal
 * handlers are installed; comm_stop_request(sig) from a signal handler (async-signal-safe: an
 * atomic and a write to a self-pipe). Afterwards every bootstrap wait (connect, accept, reads)
 * returns at once with "interrupted by SIGTERM ...", and a follower's link watcher tells node 0
 * (comm_link_watch's on_stop). comm_stop_signal(): the first signal requested, or 0.
 * comm_stop_reset(): tests only (no handler may run concurrently). */
void comm_stop_init(void);
void comm_stop_request(int sig);
int  comm_stop_signal(void);
void comm_stop_reset(void);

/* Validate the options (host:port syntax, ranges). */
int comm_dist_opts_check(const comm_dist_opts *o, um_err *err);
/* "host:port" / "[v6]:port" -> host, port. */
int comm_parse_addr(const char *s, char *host, size_t host_len, int *port, um_err *err);
/* Node 0 sends `len` bytes (blob) to every other node: node 0 listens on the port of init_addr,
 * waits until all nnodes-1 nodes have connected and identified themselves, then sends. Other nodes
 * connect (retrying until node 0 is up) and receive into blob. Errors (timeouts, refused or
 * dropped connections, duplicate node ranks, nnodes mismatch) name the peer and the address. */
int comm_bootstrap_exchange(const comm_dist_opts *o, void *blob, size_t len, um_err *err);
/* The two halves of node 0's side (tests bind port 0 and read the port back). */
int comm_bootstrap_listen(int port, int *fd, int *bound_port, um_err *err);
int comm_bootstrap_serve(int fd, int nnodes, const void *blob, size_t len, int timeout_ms, um_err *err);
/* The other nodes' side. */
int comm_bootstrap_join(const char *host, int port, int nnodes, int node_rank, void *blob, size_t len,
                        int timeout_ms, um_err *err);

/* Liveness link: comm_bootstrap_exchange, but the bootstrap connections stay open afterwards
 * (*link; NULL for one node). Node 0 holds one per other node, the others one to node 0; nothing
 * is sent on them, so a connection that closes means that node's process is gone (or it closed
 * its link while stopping). */
typedef struct comm_link comm_link;
int  comm_bootstrap_exchange_link(const comm_dist_opts *o, void *blob, size_t len, comm_link **link, um_err *err);
/* Its two halves (tests bind port 0): node 0 on a listening fd (closed here), the others. */
int  comm_bootstrap_serve_link(int lfd, int nnodes, const void *blob, size_t len, int timeout_ms, comm_link **link,
                               um_err *err);
int  comm_bootstrap_join_link(const char *host, int port, int nnodes, int node_rank, void *blob, size_t len,
                              int timeout_ms, comm_link **link, um_err *err);
/* The same with a setup fingerprint (fp->data NULL: none); the plain forms check nothing. */
int  comm_bootstrap_serve_link_fp(int lfd, int nnodes, const void *blob, size_t len, int timeout_ms,
                                  const comm_fingerprint *fp, comm_link **link, um_err *err);
int  comm_bootstrap_join_link_fp(const char *host, int port, int nnodes, int node_rank, void *blob, size_t len,
                                 int timeout_ms, const comm_fingerprint *fp, comm_link **link, um_err *err);
/* Start a watcher thread (signals blocked) that calls on_lost(user, node) once for every peer
 * whose connection closes, until comm_link_close. On the other nodes it also forwards a stop
 * request (comm_stop_request) to node 0 over the link, once; node 0's watcher then calls
 * on_stop(user, node, sig) (may be NULL). Both run on the watcher thread. */
void comm_link_watch(comm_link *l, void (*on_lost)(void *user, int node), void (*on_stop)(void *user, int node, int sig),
                     void *user);
/* Setup failures over the link: comm_link_send_error sends one line to every peer of l (any thread;
 * a node whose setup failed before the status round, so its peers stop waiting for it); the peers'
 * watchers call on_error(user, node, msg) (set it before comm_link_watch). NULL l: no-op. */
void comm_link_send_error(comm_link *l, const char *msg);
void comm_link_on_error(comm_link *l, void (*on_error)(void *user, int node, const char *msg));
/* Stop watching (no on_lost after this returns), close the connections, free. NULL is a no-op. */
void comm_link_close(comm_link *l);

#endif /* UM_COMM_H */
