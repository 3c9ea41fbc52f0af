/*
 * libFuzzer harness: the socket transport's handshake and frame parsers (transports/socket/
 * wire.c): challenges, authenticated hellos, accepts and frame headers. The first input byte
 * picks the parser.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "socket/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t key[WEFT_AUTH_KEY_BYTES] = {5};
    struct weft_auth_nonces n = {{1}, {2}};
    struct weft_sock_hello h;
    struct weft_sock_frame f;
    char why[256];
    if (size < 1)
        return 0;
    const uint8_t *p = data + 1;
    size_t len = size - 1;
    switch (data[0] % 4) {
    case 0:
        (void)weft_sock_challenge_parse(p, len, 0x77, &n);
        break;
    case 1:
        if (weft_sock_hello_parse(p, len, key, &n, &h) == NULL && h.type != WEFT_SOCK_HELLO)
            __builtin_trap();
        break;
    case 2:
        memset(&h, 0, sizeof(h));
        (void)weft_sock_accept_parse(p, len, key, &n, &h);
        break;
    default: {
        int nthreads = 1 + data[0] / 4 % 4;
        if (weft_sock_frame_parse(p, len, 6, nthreads, data[0] / 16 % nthreads, &f, why,
                                  sizeof(why)) == NULL &&
            f.type != WEFT_SOCK_BYE &&
            (f.channel >= 6 || f.channel % nthreads != data[0] / 16 % nthreads))
            __builtin_trap();
        break;
    }
    }
    return 0;
}
