/*
 * http_wire.h — complete HTTP answers as raw bytes (http_wire.c), below the HTTP layer.
 */
#ifndef UM_HTTP_WIRE_H
#define UM_HTTP_WIRE_H

#include <stddef.h>

/* The bytes of a complete JSON error answer that closes the connection
 * ("HTTP/1.1 status ... Connection: close", extra_headers: NULL or "Name: value\r\n" lines) into
 * buf (cap >= 512); returns their length. */
size_t http_error_bytes(char *buf, size_t cap, int status, const char *code, const char *msg,
                        const char *extra_headers);

#endif /* UM_HTTP_WIRE_H */
