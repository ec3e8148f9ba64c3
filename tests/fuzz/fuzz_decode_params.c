/*
 * fuzz_decode_params.c — libFuzzer target: decode parameters from request JSON
 * (decode_params_apply_json), range checks against the model (decode_params_validate), the JSON
 * echo (decode_params_to_json), and for parameters that validate, decode_seq_create (block
 * layout, step plan) — every combination validate accepts must give a usable sequence; small ones
 * (gen_length <= 48, at most 48 steps) are then decoded to the end with the tiny model on the CPU
 * backend, so the decoders run on every accepted combination of their parameters.
 * Input: byte 0 = prompt length (0..255 tokens), byte 1 = with a suffix (infilling) when odd, rest
 * = a JSON object of fields.
 */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "decode/decode.h"
#include "decode/event_json.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const model *m = fuzz_model();
    if (size < 2) return 0;
    int n_prompt = data[0], n_suffix = data[1] & 1 ? 1 + data[1] / 16 : 0;
    json_error_t je;
    json_t *o = json_loadb((const char *)data + 2, size - 2, 0, &je);
    if (!o) return 0;
    decode_params p = decode_params_for_model(m);
    um_err err = {0};
    if (json_is_object(o) && decode_params_apply_json(&p, o, &err) == 0) {
        json_t *back = decode_params_to_json(&p);
        decode_params q = decode_params_for_model(m);
        if (!back || decode_params_apply_json(&q, back, &err) != 0) { /* the echo must parse back */
            fprintf(stderr, "decode_params_to_json does not round-trip: %s\n", err.msg);
            abort();
        }
        json_decref(back);
        if (decode_params_validate(&p, &m->cfg, n_prompt, &err) == 0) {
            int32_t ids[512];
            for (int i = 0; i < 512; i++) ids[i] = 1 + i % 100;
            decode_seq *s = decode_seq_create_infill(m, &p, ids, n_prompt, ids, n_suffix, &err);
            if (s && p.gen_length <= 48 && (p.steps ? p.steps : p.gen_length) <= 48) {
                static model_ctx ctx;
                static backend *be;
                if (!be) {
                    be = backend_cpu_init(1);
                    if (!be || model_ctx_init(&ctx, m, be, &err) != 0) abort();
                }
                decode_sink sink = {0};
                if (decode_generate(&ctx, s, &sink, &err) != 0 || !decode_seq_done(s)) {
                    fprintf(stderr, "decode_generate failed on validated params: %s\n", err.msg);
                    abort();
                }
            }
            if (s) decode_seq_free(s);
        }
    }
    json_decref(o);
    return 0;
}
