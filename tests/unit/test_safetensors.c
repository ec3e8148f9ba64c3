/*
 * test_safetensors.c — safetensors / config / index parsers on in-memory buffers: valid files
 * round-trip through the writer, and every kind of corruption gives an error naming the problem.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/checkpoint.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "test.h"
#include "util/fileio.h"
#include "util/log.h"

/* Build a safetensors buffer from a header string and n data bytes. */
static uint8_t *make_buf(const char *hdr, size_t data_len, size_t *len) {
    size_t hl = strlen(hdr);
    *len = 8 + hl + data_len;
    uint8_t *b = xcalloc(*len, 1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, hdr, hl);
    for (size_t i = 0; i < data_len; i++) b[8 + hl + i] = (uint8_t)i;
    return b;
}

static void expect_error(const char *hdr, size_t data_len, const char *needle) {
    size_t len;
    uint8_t *b = make_buf(hdr, data_len, &len);
    st_file f;
    um_err err = {0};
    int rc = safetensors_parse(b, len, "t.safetensors", &f, &err);
    TEST_CHECK(rc == -1, "expected failure for header %s", hdr);
    TEST_CHECK(strstr(err.msg, needle) != NULL, "message '%s' lacks '%s'", err.msg, needle);
    TEST_CHECK(strstr(err.msg, "t.safetensors") != NULL, "message '%s' lacks the file name", err.msg);
    if (rc == 0) safetensors_free(&f);
    free(b);
}

static void test_valid(void) {
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[8,24]},"
                      "\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]},"
                      "\"e\":{\"dtype\":\"F16\",\"shape\":[0,3],\"data_offsets\":[24,24]}}";
    size_t len;
    uint8_t *b = make_buf(hdr, 24, &len);
    st_file f;
    um_err err = {0};
    TEST_CHECK(safetensors_parse(b, len, "ok", &f, &err) == 0, "valid file rejected: %s", err.msg);
    TEST_CHECK(f.n_tensors == 3, "n_tensors %d", f.n_tensors);
    const st_tensor *a = safetensors_find(&f, "a"), *bt = safetensors_find(&f, "b");
    TEST_CHECK(a && a->type == DTYPE_BF16 && a->n_elems == 4 && a->nbytes == 8, "tensor a");
    TEST_CHECK(bt && bt->type == DTYPE_F32 && bt->ndim == 2 && bt->data == b + 8 + strlen(hdr) + 8,
               "tensor b must point into the buffer (no copy)");
    TEST_CHECK(safetensors_find(&f, "zz") == NULL, "unknown name found");
    safetensors_free(&f);
    free(b);
}

static void test_corrupt(void) {
    size_t len;
    /* header length bigger than the file / absurd */
    uint8_t small[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0x03, 0, 0, '{', '}'};
    st_file f;
    um_err err = {0};
    TEST_CHECK(safetensors_parse(small, sizeof small, "big.safetensors", &f, &err) == -1, "1e15 header");
    TEST_CHECK(strstr(err.msg, "exceeds") != NULL, "msg: %s", err.msg);
    TEST_CHECK(safetensors_parse(small, 5, "short.safetensors", &f, &err) == -1, "5-byte file");
    TEST_CHECK(strstr(err.msg, "too short") != NULL, "msg: %s", err.msg);
    uint8_t *b = make_buf("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, &len);
    TEST_CHECK(safetensors_parse(b, len - 3, "trunc.safetensors", &f, &err) == -1, "truncated");
    TEST_CHECK(strstr(err.msg, "trunc") != NULL, "msg: %s", err.msg);
    b[8] = 'x';
    TEST_CHECK(safetensors_parse(b, len, "nobrace", &f, &err) == -1, "header not starting with {");
    free(b);

    expect_error("{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype 'Q4'");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "span");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[2,6]}}", 6, "overlaps");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "hole");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 9, "trailing");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "duplicate");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "shape[0]");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "data_offsets");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[100],\"data_offsets\":[0,400]}}", 4, "beyond");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,4]}}", 4,
                 "too large");
    expect_error("{\"a\":[1,2]}", 0, "not an object");
    expect_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4, "JSON");
    expect_error("{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2, "whole number");
}

/* Every prefix of a valid file and every single-byte corruption of its header: error or success,
 * never a crash (run under ASan/valgrind to make this a memory-safety check too). */
static void test_mutations(void) {
    const char *hdr = "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
                      "\"v\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[12,24]}}";
    size_t len;
    uint8_t *b = make_buf(hdr, 24, &len);
    int crashes_avoided = 0;
    for (size_t cut = 0; cut < len; cut++) {
        st_file f;
        if (safetensors_parse(b, cut, "p", &f, NULL) == 0) safetensors_free(&f);
        crashes_avoided++;
    }
    for (size_t i = 0; i < 8 + strlen(hdr); i++) {
        uint8_t save = b[i];
        static const uint8_t vals[] = {0, '"', '}', '9', 0xff, '-'};
        for (size_t k = 0; k < sizeof vals; k++) {
            b[i] = vals[k];
            st_file f;
            if (safetensors_parse(b, len, "m", &f, NULL) == 0) safetensors_free(&f);
        }
        b[i] = save;
    }
    TEST_CHECK(crashes_avoided == (int)len, "prefix loop");
    free(b);
}

static void test_writer_roundtrip(void) {
    const char *dir = getenv("UNMASK_TEST_TMP");
    char path[4096];
    path_join(path, sizeof path, dir ? dir : "/tmp", "roundtrip.safetensors");
    float w[6] = {1, 2, 3, 4, 5, 6};
    uint16_t h[3] = {0x3f80, 0x4000, 0xc040};
    st_write_tensor t[2] = {
        {"x.weight", "F32", 2, {2, 3}, w, sizeof w},
        {"y.weight", "BF16", 1, {3}, h, sizeof h},
    };
    um_err err = {0};
    TEST_CHECK(safetensors_write(path, t, 2, "{\"format\":\"pt\"}", &err) == 0, "write: %s", err.msg);
    st_file f;
    TEST_CHECK(safetensors_open(path, &f, &err) == 0, "open: %s", err.msg);
    const st_tensor *x = safetensors_find(&f, "x.weight"), *y = safetensors_find(&f, "y.weight");
    TEST_CHECK(x && memcmp(x->data, w, sizeof w) == 0, "x data");
    TEST_CHECK(y && bf16_to_f32(((const uint16_t *)y->data)[2]) == -3.0f, "y data");

    /* Rewriting a file that is mapped (a server serving the model while `make-model` or a
     * conversion writes the same path) must not touch the mapped bytes: the old file used to be
     * truncated in place, so reading the mapping past the new end raised SIGBUS. */
    float big[4096];
    for (int i = 0; i < 4096; i++) big[i] = (float)i;
    st_write_tensor tb = {"big.weight", "F32", 1, {4096}, big, sizeof big};
    TEST_CHECK(safetensors_write(path, &tb, 1, NULL, &err) == 0, "write big: %s", err.msg);
    st_file g;
    TEST_CHECK(safetensors_open(path, &g, &err) == 0, "open big: %s", err.msg);
    TEST_CHECK(safetensors_write(path, t, 2, "{\"format\":\"pt\"}", &err) == 0, "rewrite small: %s", err.msg);
    const st_tensor *gb = safetensors_find(&g, "big.weight");
    TEST_CHECK(gb && memcmp(gb->data, big, sizeof big) == 0, "mapped old file intact after a rewrite");
    safetensors_free(&g);
    st_file f2;
    TEST_CHECK(safetensors_open(path, &f2, &err) == 0, "reopen: %s", err.msg);
    TEST_CHECK(safetensors_find(&f2, "x.weight") && !safetensors_find(&f2, "big.weight"), "new contents");
    safetensors_free(&f2);
    char tmp[4096 + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    TEST_CHECK(!file_exists(tmp), "no temporary file left behind");

    /* A failed write leaves the previous file and no temporary. */
    char bad[4096];
    path_join(bad, sizeof bad, dir ? dir : "/tmp", "no-such-dir/x.safetensors");
    TEST_CHECK(safetensors_write(bad, t, 2, NULL, &err) != 0 && strstr(err.msg, "cannot create"), "%s", err.msg);
    safetensors_free(&f);
}

static void test_config(void) {
    const char *base = UNMASK_SOURCE_DIR "/tests/fixtures/llada-8b-instruct/config.json";
    char *text;
    size_t len;
    um_err err = {0};
    if (file_read_all(base, 1 << 20, &text, &len, &err) == 0) {
        model_config c;
        TEST_CHECK(model_config_parse(text, len, "config.json", &c, &err) == 0, "real config: %s", err.msg);
        TEST_CHECK(c.arch == MODEL_ARCH_LLADA && c.d_model == 4096 && c.n_layers == 32 && c.head_dim == 128 &&
                       c.ffn_hidden == 12288 && c.n_embd_rows == 126464 && c.mask_id == 126336 &&
                       c.eos_id == 126081 && c.rope_theta == 500000.0f && c.max_seq == 4096,
                   "real LLaDA-8B config fields");
        TEST_CHECK(model_config_n_params(&c) == 8015581184LL, "param count %lld", model_config_n_params(&c));
        free(text);
    } else {
        TEST_CHECK(0, "fixture missing: %s", err.msg);
    }
    const char *dream = UNMASK_SOURCE_DIR "/tests/fixtures/dream-7b-instruct/config.json";
    if (file_read_all(dream, 1 << 20, &text, &len, &err) == 0) {
        model_config c;
        TEST_CHECK(model_config_parse(text, len, "config.json", &c, &err) == 0, "real Dream config: %s", err.msg);
        TEST_CHECK(c.arch == MODEL_ARCH_DREAM && c.d_model == 3584 && c.n_layers == 28 && c.n_heads == 28 &&
                       c.n_kv_heads == 4 && c.head_dim == 128 && c.ffn_hidden == 18944 && c.n_embd_rows == 152064 &&
                       c.mask_id == 151666 && c.eos_id == 151643 && c.rope_theta == 1000000.0f &&
                       c.norm_eps == 1e-6f && c.max_seq == 131072 && !c.weight_tying && c.logits_shifted,
                   "real Dream-7B config fields");
        /* with the q/k/v biases: the index's total_size / 2 */
        TEST_CHECK(model_config_n_params(&c) == 7615616512LL, "Dream param count %lld", model_config_n_params(&c));
        free(text);
    } else {
        TEST_CHECK(0, "fixture missing: %s", err.msg);
    }
    static const struct { const char *json, *needle; } bad[] = {
        {"{\"architectures\":[\"LLaDAModelLM\"],\"d_model\":64,\"n_layers\":2,\"n_heads\":0,"
         "\"mlp_hidden_size\":8,\"vocab_size\":10}", "'n_heads' is 0"},
        {"{\"architectures\":[\"LLaDAModelLM\"],\"d_model\":64,\"n_layers\":2,\"n_heads\":5,"
         "\"mlp_hidden_size\":8,\"vocab_size\":10}", "not divisible by n_heads"},
        {"{\"architectures\":[\"LLaDAModelLM\"],\"d_model\":64,\"n_layers\":2,\"n_heads\":4,\"n_kv_heads\":3,"
         "\"mlp_hidden_size\":8,\"vocab_size\":10}", "not divisible by n_kv_heads"},
        {"{\"architectures\":[\"LLaDAModelLM\"],\"d_model\":64,\"n_layers\":2,\"n_heads\":4,"
         "\"mlp_hidden_size\":8}", "missing required key 'vocab_size'"},
        {"{\"architectures\":[\"LLaDAModelLM\"],\"d_model\":\"64\",\"n_layers\":2,\"n_heads\":4,"
         "\"mlp_hidden_size\":8,\"vocab_size\":10}", "'d_model' must be an integer"},
        {"{\"architectures\":[\"LLaDAModelLM\"],\"d_model\":64,\"n_layers\":2,\"n_heads\":4,"
         "\"mlp_hidden_size\":8,\"vocab_size\":100,\"mask_token_id\":126336}", "outside"},
        {"{\"architectures\":[\"GPT2LMHeadModel\"]}", "unknown architecture 'GPT2LMHeadModel'"},
        {"{\"architectures\":[\"DreamModel\"]}", "missing required key 'hidden_size'"},
        {"{\"architectures\":[\"LLaDA2MoeModelLM\"]}", "missing required key 'hidden_size'"},
        {"{\"architectures\":[\"LLaDAMoEModelLM\"],\"hidden_size\":64,\"num_hidden_layers\":2,"
         "\"num_attention_heads\":4,\"num_experts\":8,\"num_experts_per_tok\":2,\"expert_intermediate_size\":32,"
         "\"vocab_size\":100,\"rope_theta\":50000,\"partial_rotary_factor\":-1,"
         "\"shared_expert_intermediate_size\":null}", "partial_rotary_factor' is -1"},
        {"[1,2]", "not a JSON object"},
        {"{\"d_model\": ", "invalid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        model_config c;
        err.msg[0] = 0;
        int rc = model_config_parse(bad[i].json, strlen(bad[i].json), "cfg.json", &c, &err);
        TEST_CHECK(rc == -1 && strstr(err.msg, bad[i].needle) && strstr(err.msg, "cfg.json"),
                   "case %zu: got '%s', want '%s'", i, err.msg, bad[i].needle);
    }
    /* LLaDA-MoE: model_type llada without architectures and without d_model -> MoE */
    model_config c;
    const char *moe = "{\"model_type\":\"llada\",\"hidden_size\":2048}";
    model_config_parse(moe, strlen(moe), "moe.json", &c, &err);
    TEST_CHECK(c.arch == MODEL_ARCH_LLADA_MOE && strstr(err.msg, "num_hidden_layers") != NULL, "moe dispatch: %s",
               err.msg);
}

static void test_index(void) {
    char **shards;
    int n;
    um_err err = {0};
    const char *ok = "{\"metadata\":{\"total_size\":4},\"weight_map\":{\"a\":\"s1.safetensors\","
                     "\"b\":\"s2.safetensors\",\"c\":\"s1.safetensors\"}}";
    TEST_CHECK(checkpoint_index_parse(ok, strlen(ok), "idx", &shards, &n, &err) == 0 && n == 2 &&
                   strcmp(shards[0], "s1.safetensors") == 0 && strcmp(shards[1], "s2.safetensors") == 0,
               "index parse");
    for (int i = 0; i < n; i++) free(shards[i]);
    free(shards);
    static const char *bad[] = {"{}", "{\"weight_map\":{}}", "{\"weight_map\":{\"a\":1}}",
                                "{\"weight_map\":{\"a\":\"../etc/passwd\"}}", "nope"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        TEST_CHECK(checkpoint_index_parse(bad[i], strlen(bad[i]), "idx", &shards, &n, &err) == -1,
                   "bad index %zu accepted", i);
}

int main(void) {
    test_valid();
    test_corrupt();
    test_mutations();
    test_writer_roundtrip();
    test_config();
    test_index();
    return test_report();
}
