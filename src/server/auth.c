/*
 * auth.c — API key file + credential checks (see auth.h). Pure after loading; any thread.
 */
#include "server/auth.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util/fileio.h"
#include "util/log.h"

#define AUTH_MAX_FILE (16u << 20)

/* RFC 7230 tchar: what a header token (a WebSocket subprotocol) may hold. */
static int tchar(unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

int auth_keys_parse(auth_keys *a, const char *text, size_t len, const char *label, um_err *err) {
    memset(a, 0, sizeof *a);
    int cap = 0;
    size_t i = 0;
    int line = 0;
    while (i < len) {
        size_t j = i;
        while (j < len && text[j] != '\n') j++;
        line++;
        size_t s = i, e = j;
        while (s < e && isspace((unsigned char)text[s])) s++;
        while (e > s && isspace((unsigned char)text[e - 1])) e--;
        i = j + 1;
        if (s == e || text[s] == '#') continue;
        for (size_t k = s; k < e; k++) {
            if (!tchar((unsigned char)text[k])) {
                auth_keys_free(a);
                return um_err_set(err, UM_ERR_FORMAT,
                                  "%s:%d: an API key may only hold letters, digits and !#$%%&'*+-.^_`|~ (character %zu "
                                  "is not one): browsers send keys as a WebSocket subprotocol, where nothing else is "
                                  "allowed",
                                  label, line, k - s + 1);
            }
        }
        if (e - s > AUTH_KEY_MAX) {
            auth_keys_free(a);
            return um_err_set(err, UM_ERR_FORMAT,
                              "%s:%d: an API key may have at most %d characters, this one has %zu: browsers send it "
                              "in the WebSocket subprotocol header, which the server reads up to 126 characters "
                              "(\"unmask, unmask-key.<key>\")",
                              label, line, AUTH_KEY_MAX, e - s);
        }
        if (a->n == cap) {
            cap = cap ? cap * 2 : 8;
            a->keys = xrealloc(a->keys, (size_t)cap * sizeof *a->keys);
        }
        a->keys[a->n++] = xstrndup(text + s, e - s);
    }
    if (a->n == 0) return um_err_set(err, UM_ERR_FORMAT, "%s: no API key in the file", label);
    return 0;
}

int auth_keys_load(auth_keys *a, const char *path, um_err *err) {
    memset(a, 0, sizeof *a);
    char *buf = NULL;
    size_t len = 0;
    if (file_read_all(path, AUTH_MAX_FILE, &buf, &len, err) != 0) return -1;
    int r = auth_keys_parse(a, buf, len, path, err);
    free(buf);
    return r;
}

void auth_keys_free(auth_keys *a) {
    for (int i = 0; i < a->n; i++) free(a->keys[i]);
    free(a->keys);
    memset(a, 0, sizeof *a);
}

int auth_bearer_token(const char *v, char *out, size_t cap) {
    if (!v || cap == 0) return -1;
    while (*v == ' ' || *v == '\t') v++;
    if (strncasecmp(v, "bearer", 6) != 0 || (v[6] != ' ' && v[6] != '\t')) return -1;
    v += 6;
    while (*v == ' ' || *v == '\t') v++;
    size_t n = strlen(v);
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t')) n--;
    if (n == 0 || n >= cap) return -1;
    memcpy(out, v, n);
    out[n] = 0;
    return 0;
}

int auth_key_from_subprotocols(const char *p, char *out, size_t cap) {
    static const char *const prefixes[] = {"openai-insecure-api-key.", "unmask-key."};
    while (p && *p) {
        while (*p == ' ' || *p == ',' || *p == '\t') p++;
        size_t n = strcspn(p, ", \t");
        for (size_t k = 0; k < sizeof prefixes / sizeof prefixes[0]; k++) {
            size_t pl = strlen(prefixes[k]);
            if (n > pl && strncmp(p, prefixes[k], pl) == 0 && n - pl < cap) {
                memcpy(out, p + pl, n - pl);
                out[n - pl] = 0;
                return 0;
            }
        }
        p += n;
    }
    return -1;
}

/* Constant-time equality for the key's length (the length itself is not secret-worthy). */
static int key_equal(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned char d = (unsigned char)(la != lb);
    size_t n = la < lb ? la : lb;
    for (size_t i = 0; i < n; i++) d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

enum auth_result auth_check(const auth_keys *a, const char *token, int malformed) {
    if (a->n == 0) return AUTH_OK;
    if (malformed) return AUTH_MALFORMED;
    if (!token || !token[0]) return AUTH_MISSING;
    int ok = 0;
    for (int i = 0; i < a->n; i++) ok |= key_equal(a->keys[i], token);
    return ok ? AUTH_OK : AUTH_INVALID;
}

const char *auth_result_message(enum auth_result r) {
    switch (r) {
    case AUTH_OK: return "ok";
    case AUTH_MISSING: return "Missing API key: send 'Authorization: Bearer <key>'";
    case AUTH_MALFORMED: return "Malformed Authorization header: expected 'Bearer <key>'";
    case AUTH_INVALID: return "Incorrect API key provided";
    }
    return "unauthorized";
}
