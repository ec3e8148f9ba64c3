/*
 * auth.h — API keys: loading the key file and checking the credentials a client presents.
 *
 * `--api-keys FILE`: one key per line; blank lines and lines starting with '#' are ignored,
 * surrounding whitespace is trimmed. No file = open access (every request is accepted and is
 * rate-limited under the key "anonymous" / the client's address, see ratelimit.h).
 * Credentials: `Authorization: Bearer <key>` (also `x-api-key: <key>`), and for browsers, which
 * cannot set WebSocket headers, a subprotocol `openai-insecure-api-key.<key>` (the OpenAI realtime
 * convention) or `unmask-key.<key>` — see auth_key_from_subprotocols().
 * Keys are compared in constant time.
 *
 * Not here: reading headers off a wsi (server/http_api.c), rate limits. A loaded auth_keys is
 * immutable and may be read from any thread.
 */
#ifndef UM_AUTH_H
#define UM_AUTH_H

#include <stddef.h>

#include "util/err.h"

/* The longest key: one a browser can still present. Browsers carry it as a WebSocket subprotocol,
 * `Sec-WebSocket-Protocol: unmask, unmask-key.<key>` (they join the entries with ", "), and
 * libwebsockets 4.1.6 refuses the upgrade when that header is over 126 characters (it copies it
 * into a 128-byte buffer, room for 126 plus its terminator); the 19 characters around the key leave
 * 107 for it. Keys may only use the characters a subprotocol may (RFC 7230 tchar: letters, digits
 * and !#$%&'*+-.^_`|~): browsers refuse anything else. A key outside these limits could never be
 * presented from a browser, so loading one fails. */
#define AUTH_KEY_MAX 107

typedef struct auth_keys {
    char **keys;     /* [n], owned */
    int    n;        /* 0 = open access */
} auth_keys;

/* Load keys from path. An unreadable file, one with no key, or a key over AUTH_KEY_MAX characters
 * or with a character outside tchar: -1 with err naming the path (and line). */
int  auth_keys_load(auth_keys *a, const char *path, um_err *err);
/* Parse keys from a buffer (same rules as the file). */
int  auth_keys_parse(auth_keys *a, const char *text, size_t len, const char *label, um_err *err);
void auth_keys_free(auth_keys *a);
static inline int auth_keys_required(const auth_keys *a) { return a->n > 0; }

enum auth_result {
    AUTH_OK,          /* open access, or a known key */
    AUTH_MISSING,     /* keys required and none presented -> 401 */
    AUTH_MALFORMED,   /* Authorization header present but not "Bearer <token>" -> 401 */
    AUTH_INVALID,     /* a key was presented and is not in the list -> 401 */
};

/* Extract the token of an Authorization header value ("Bearer  abc " -> "abc", scheme
 * case-insensitive) into out (cap bytes). 0, or -1 when the value is not a Bearer credential. */
int auth_bearer_token(const char *header_value, char *out, size_t cap);

/* The key carried in a Sec-WebSocket-Protocol list ("realtime, openai-insecure-api-key.K, x"):
 * copies K into out and returns 0, or -1 when no such entry exists. */
int auth_key_from_subprotocols(const char *protocols, char *out, size_t cap);

/* Check a presented token (NULL / "" = none presented; malformed = 1 when an Authorization header
 * was present but unparseable). */
enum auth_result auth_check(const auth_keys *a, const char *token, int malformed);

/* Human message for a result ("Missing API key: send 'Authorization: Bearer <key>'"). */
const char *auth_result_message(enum auth_result r);

#endif /* UM_AUTH_H */
