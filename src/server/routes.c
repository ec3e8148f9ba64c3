/*
 * routes.c — the server's own HTTP routes (GET /health, GET /health/live, GET /stats). Other route modules
 * (server/http_api.c: OpenAI, SGLang, llama.cpp, jobs, metrics) add theirs to the same server.
 *
 * Not here: OpenAI / SGLang / infill / jobs routes (their own files). Threads: handlers on the lws
 * service thread; routes_core_register on the main thread (server_create).
 */
#include <jansson.h>

#include "server/http.h"
#include "server/server_internal.h"

/* GET /health/live: 200 {"status":"live"} whenever the process serves HTTP (loading, draining too):
 * for liveness probes, which restart a process that stopped answering. */
static int h_live(http_conn *c, const http_req *rq) {
    (void)rq;
    static const char *const no_store[] = {"Cache-Control: no-store", NULL};
    return http_respond_json(c, 200, json_pack("{s:s}", "status", "live"), no_store);
}

/* GET /health (readiness, for load balancers): 200 {"status":"ok"} once the model is loaded, 503
 * {"status":"loading"} before (and {"status":"draining"} during a graceful shutdown: http_api.c). */
static int h_health(http_conn *c, const http_req *rq) {
    static const char *const no_store[] = {"Cache-Control: no-store", NULL};
    if (server_ready(rq->srv)) return http_respond_json(c, 200, json_pack("{s:s}", "status", "ok"), no_store);
    static const char *const retry[] = {"Cache-Control: no-store", "Retry-After: 1", NULL};
    return http_respond_json(c, 503, json_pack("{s:s}", "status", "loading"), retry);
}

/* GET /stats: scheduler, connection and event-latency counters (JSON). */
static int h_stats(http_conn *c, const http_req *rq) {
    server *s = rq->srv;
    json_t *o = json_object();
    json_object_set_new(o, "ready", json_boolean(server_ready(s)));
    server_conn_stats cs;
    server_get_conn_stats(s, &cs);
    json_t *conns = json_pack("{s:i,s:i,s:i,s:I}", "websocket", cs.ws_connections, "sessions", cs.sessions,
                              "sessions_detached", cs.sessions_detached, "session_bytes", (json_int_t)cs.session_bytes);
    /* connection limits (server/conn_guard.h) */
    json_object_set_new(conns, "open", json_integer(cs.open));
    json_object_set_new(conns, "addresses", json_integer(cs.addresses));
    json_object_set_new(conns, "refused_per_address", json_integer(cs.refused));
    json_object_set_new(conns, "request_timeouts", json_integer(cs.request_timeouts));
    json_object_set_new(conns, "idle_closed", json_integer(cs.idle_closed));
    json_object_set_new(o, "connections", conns);
    server_mem_stats ms;
    server_get_mem_stats(s, &ms);
    json_object_set_new(o, "memory", json_pack("{s:I,s:I,s:I}", "rss_bytes", (json_int_t)ms.rss_bytes, "trims",
                                               (json_int_t)ms.trims, "trimmed_bytes", (json_int_t)ms.trimmed_bytes));
    server_event_stats es;
    server_get_event_stats(s, &es);
    json_object_set_new(o, "events", json_pack("{s:I,s:f,s:f,s:f,s:f}", "written", (json_int_t)es.count, "mean_us",
                                               es.mean_us, "p50_us", es.p50_us, "p99_us", es.p99_us, "max_us",
                                               es.max_us));
    const server_config *cfg = server_cfg(s);
    json_object_set_new(o, "topology",
                        json_pack("{s:s,s:i,s:i,s:i,s:i}", "devices", cfg->devices ? cfg->devices : "cpu", "replicas",
                                  server_config_replicas(cfg), "tp", cfg->tp, "nnodes", cfg->nnodes, "max_seq",
                                  server_max_seq(s)));
    json_object_set_new(o, "settings", server_config_to_json(cfg)); /* every serve setting (secrets: set or not) */
    sched *sc = server_sched(s);
    if (sc) {
        sched_stats st;
        sched_get_stats(sc, &st);
        const sched_opts *so = sched_get_opts(sc);
        json_object_set_new(
            o, "scheduler",
            json_pack("{s:i,s:i,s:i,s:i,s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:i,s:f}", "engines", sched_n_engines(sc),
                      "max_batch", so->max_batch, "max_queue", so->max_queue, "queued", st.queued, "active", st.active,
                      "submitted", (json_int_t)st.submitted, "rejected", (json_int_t)st.rejected, "finished",
                      (json_int_t)st.finished, "cancelled", (json_int_t)st.cancelled, "failed", (json_int_t)st.failed,
                      "steps", (json_int_t)st.steps, "step_seqs", (json_int_t)st.step_seqs, "mean_batch",
                      st.steps ? (double)st.step_seqs / (double)st.steps : 0.0, "max_batch_seen", st.max_batch_seen,
                      "mean_step_ms", st.steps ? st.step_ms_total / (double)st.steps : 0.0));
        json_t *sj = json_object_get(o, "scheduler");
        json_object_set_new(sj, "max_paused", json_integer(so->max_paused));
        json_object_set_new(sj, "paused", json_integer(st.paused));
        json_object_set_new(sj, "preempted", json_integer((json_int_t)st.preempted));
        json_object_set_new(sj, "resumed", json_integer((json_int_t)st.resumed));
        json_t *dl = json_pack("{s:b,s:I,s:I,s:I,s:I}", "enabled", st.device_loop_engines > 0, "steps",
                               (json_int_t)st.device.steps, "rebuilds", (json_int_t)st.device.rebuilds,
                               "graph_captures", (json_int_t)st.device.graph_captures, "graph_replays",
                               (json_int_t)st.device.graph_replays);
        /* the details only where an engine runs the device loop (a host-loop server's object keeps
         * its five zero fields) */
        if (st.device_loop_engines > 0) {
            json_object_set_new(dl, "graph_stale", json_integer((json_int_t)st.device.graph_stale));
            json_object_set_new(dl, "steps_applied", json_integer((json_int_t)st.device.steps_applied));
            json_object_set_new(dl, "steps_overlapped", json_integer((json_int_t)st.device.steps_overlapped));
            const decode_device_stats *d = &st.device;
            json_object_set_new(dl, "mean_step_ms",
                                json_real(d->steps_applied ? d->step_ms_total / (double)d->steps_applied : 0.0));
            json_object_set_new(dl, "rebuild_causes",
                                json_pack("{s:I,s:I,s:I,s:I}", "join", (json_int_t)st.device.rebuild_join, "leave",
                                          (json_int_t)st.device.rebuild_leave, "cancel",
                                          (json_int_t)st.device.rebuild_cancel, "ineligible",
                                          (json_int_t)st.device.rebuild_ineligible));
            json_object_set_new(dl, "lm_head_rows", json_integer((json_int_t)st.device.lm_rows));
            json_object_set_new(dl, "lm_head_rows_masked", json_integer((json_int_t)st.device.lm_rows_masked));
            json_object_set_new(dl, "forward_rows", json_integer((json_int_t)st.device.fwd_rows));
        }
        json_object_set_new(o, "device_loop", dl);
        json_object_set_new(o, "kv_cache",
                            json_pack("{s:I,s:I,s:I,s:I,s:I}", "slots", (json_int_t)st.kv.slots, "bytes",
                                      (json_int_t)st.kv.bytes, "peak_bytes", (json_int_t)st.kv.peak_bytes, "opened",
                                      (json_int_t)st.kv.opened, "freed", (json_int_t)st.kv.closed));
        json_object_set_new(o, "host_loop",
                            json_pack("{s:I,s:f}", "steps", (json_int_t)st.host_steps, "mean_step_ms",
                                      st.host_steps ? st.host_step_ms_total / (double)st.host_steps : 0.0));
    }
    static const char *const no_store[] = {"Cache-Control: no-store", NULL};
    return http_respond_json(c, 200, o, no_store);
}

static const http_route k_core_routes[] = {
    {"GET", "/health/live", 0, h_live},
    {"GET", "/health", 0, h_health},
    {"GET", "/stats", 0, h_stats, HTTP_ROUTE_API}, /* API keys apply when configured */
    {NULL, NULL, 0, NULL},
};

void routes_core_register(server *s) {
    http_routes_add(server_router(s), k_core_routes, NULL);
}
