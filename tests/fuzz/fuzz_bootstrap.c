/*
 * libFuzzer harness: every parser of bootstrap bytes from outside (src/bootstrap/wire.c): the
 * unique id, challenges, hellos at the root, CONNECT and ACCEPT on rank links, root replies and
 * data headers. The first input byte picks the parser; the rest is the message. A parser must
 * never crash, read out of bounds, or accept a MAC it was not given the key for.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "bootstrap/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t key[WEFT_AUTH_KEY_BYTES] = {1, 2, 3};
    struct weft_auth_nonces n = {{7}, {9}};
    struct weft_bs_hdr h;
    struct weft_bs_id id;
    struct weft_bs_hello hello;
    uint64_t magic = 0x1234;
    int rank;
    if (size < 1)
        return 0;
    const uint8_t *p = data + 1;
    size_t len = size - 1;
    /* Messages whose header matches get a fair chance: magic from the input when present. */
    if (len >= 16)
        memcpy(&magic, p + 8, 8);
    switch (data[0] % 7) {
    case 0:
        if (weft_bs_id_parse(p, len, &id) == NULL && len != NCCL_UNIQUE_ID_BYTES)
            __builtin_trap();
        break;
    case 1:
        (void)weft_bs_challenge_parse(p, len, magic, &n);
        break;
    case 2:
        if (weft_bs_hello_parse(p, len, magic, key, &n, &hello) == NULL &&
            (hello.hdr.type != WEFT_BS_HELLO || len != sizeof(hello)))
            __builtin_trap();
        break;
    case 3:
        if (weft_bs_connect_parse(p, len, magic, 8, key, &n, &rank) == NULL &&
            (rank < 0 || rank >= 8))
            __builtin_trap();
        break;
    case 4:
        (void)weft_bs_accept_parse(p, len, magic, 3, key, &n);
        break;
    case 5:
        if (weft_bs_reply_hdr_parse(p, len, magic, 1, 4, &h) == NULL &&
            h.size > WEFT_BS_ERR_LEN && h.size != 4 * sizeof(union weft_sockaddr))
            __builtin_trap();
        break;
    default:
        if (weft_bs_data_hdr_parse(p, len, magic, 2, &h) == NULL && h.size > WEFT_BS_MAX_MSG)
            __builtin_trap();
        break;
    }
    return 0;
}
