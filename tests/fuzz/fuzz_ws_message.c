/*
 * fuzz_ws_message.c — libFuzzer target: one client WebSocket text message through the path
 * server/ws.c runs it: api_msg_parse, then for "generate" api_gen_parse_ws + api_gen_build against a loaded
 * tiny model (prompt / messages via the chat template / prompt_ids, decode parameters, stream
 * options, the server's default limits, decode_seq creation), and the reply the server would send (accepted or error event),
 * which must serialize (valid UTF-8 even when it quotes client bytes).
 * Input: the message text.
 */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "api/ws_protocol.h"
#include "decode/decode.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void must_dump(json_t *ev) {
    if (!ev) abort();
    char *s = json_dumps(ev, JSON_COMPACT);
    if (!s) {
        fprintf(stderr, "server event does not serialize\n");
        abort();
    }
    free(s);
    json_decref(ev);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const model *m = fuzz_model();
    api_msg msg;
    api_error e = {0};
    if (api_msg_parse((const char *)data, size, &msg, &e) != 0) {
        if (msg.root || !e.code[0]) abort();
        must_dump(api_ev_error(&e, msg.event_id, NULL));
        return 0;
    }
    if (msg.type == API_MSG_GENERATE) {
        api_policy pol;
        api_policy_init(&pol);
        api_gen g;
        api_gen_opts o;
        api_seq *seqs = NULL;
        int n = 0;
        if (api_gen_parse_ws(m, msg.root, &pol, &g, &o, &e) == 0 && api_gen_build(&g, m, &pol.lim, &seqs, &n, &e) == 0) {
            if (n != 1 || !seqs[0].seq || o.stream_every < 1) abort();
            json_t *params = decode_params_to_json(&g.params);
            must_dump(api_ev_accepted(msg.id[0] ? msg.id : "g1", msg.event_id, 0, seqs[0].n_prompt, params, g.ignored));
            json_decref(params);
        } else {
            if (n || !e.code[0]) abort();
            must_dump(api_ev_error(&e, msg.event_id, msg.id[0] ? msg.id : NULL));
        }
        api_seqs_free(seqs, n);
        api_gen_free(&g);
    } else if (msg.type == API_MSG_PING) {
        must_dump(api_ev_pong(msg.event_id));
    }
    api_msg_free(&msg);
    return 0;
}
