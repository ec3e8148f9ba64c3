/*
 * fuzz_config.c — libFuzzer target: the server's configuration parsers of operator-supplied bytes
 * (a typo or a hostile file must be an error naming the place, never a crash):
 *   0: --algorithm-config (JSON or flat YAML), then applied to the model's decode defaults as
 *      cmd_serve.c does (decode_params_apply_json + decode_params_validate);
 *   1: config/unmask.json (server_config_apply_json + server_config_check + engine devices);
 *   2: --api-keys file (auth_keys_parse) and credential header values (auth_bearer_token,
 *      auth_key_from_subprotocols, auth_check);
 *   3: job webhook URLs (webhook_url_parse).
 * Input: byte 0 picks the parser, the rest is the text.
 */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/algo_config.h"
#include "decode/event_json.h"
#include "fuzz_common.h"
#include "jobs/webhook.h"
#include "server/auth.h"
#include "server/server_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *cstr(const uint8_t *d, size_t n) {
    char *s = malloc(n + 1);
    memcpy(s, d, n);
    s[n] = 0;
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const model *m = fuzz_model();
    if (size < 1) return 0;
    int which = data[0] % 4;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    um_err err = {0};
    if (which == 0) {
        json_t *o = NULL;
        if (algo_config_parse(text, len, "fuzz.yaml", &o, &err) == 0) {
            if (!json_is_object(o)) abort();
            decode_params p = decode_params_for_model(m);
            if (decode_params_apply_json(&p, o, &err) == 0 && decode_params_validate(&p, &m->cfg, 8, &err) == 0) {
                api_policy pol;
                api_policy_init(&pol);
                pol.algo = json_incref(o);
                decode_params q = api_policy_params(&pol, m);
                (void)q;
                api_policy_free(&pol);
            }
            json_decref(o);
        } else if (o || !err.msg[0]) {
            abort();
        }
    } else if (which == 1) {
        server_config c;
        server_config_defaults(&c);
        if (server_config_apply_json(&c, text, len, "fuzz.json", &err) == 0 && server_config_check(&c, &err) == 0) {
            int n = server_config_engine_count(&c);
            char dev[64];
            for (int i = 0; i < n && i < 64; i++)
                if (!server_config_engine_device(&c, i, dev, sizeof dev)) abort();
        }
        server_config_free(&c);
    } else if (which == 2) {
        auth_keys a;
        if (auth_keys_parse(&a, text, len, "keys", &err) == 0) {
            if (a.n < 1) abort();
            for (int i = 0; i < a.n; i++)
                if (auth_check(&a, a.keys[i], 0) != AUTH_OK) abort();
        } else if (a.n != 0 || a.keys) {
            abort();
        }
        char *s = cstr((const uint8_t *)text, len);
        char tokb[256];
        if (auth_bearer_token(s, tokb, sizeof tokb) == 0) (void)auth_check(&a, tokb, 0);
        if (auth_key_from_subprotocols(s, tokb, sizeof tokb) == 0) (void)auth_check(&a, tokb, 0);
        (void)auth_check(&a, s, 1);
        (void)auth_result_message(auth_check(&a, NULL, 0));
        free(s);
        auth_keys_free(&a);
    } else {
        char *s = cstr((const uint8_t *)text, len);
        webhook_url u;
        if (webhook_url_parse(s, &u, &err) == 0) {
            if (!memchr(u.host, 0, sizeof u.host) || !memchr(u.port, 0, sizeof u.port) || !memchr(u.path, 0, sizeof u.path))
                abort();
        }
        free(s);
    }
    return 0;
}
