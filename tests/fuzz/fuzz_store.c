/*
 * libFuzzer harness: the launch store's message parsers (src/core/store.c): the 12-byte header
 * and whole messages of every type. Accepted lengths must stay inside what the types allow, and
 * the key must be NUL-terminated within its buffer.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct weft_store_msg m;
    uint16_t type;
    uint32_t plen;
    if (weft_store_hdr_parse(data, size < WEFT_STORE_HDR_BYTES ? size : WEFT_STORE_HDR_BYTES,
                             &type, &plen) == NULL &&
        plen > WEFT_STORE_HELLO_MAX && plen > 16 + WEFT_STORE_KEY_MAX + 32 &&
        plen != NCCL_UNIQUE_ID_BYTES + 32)
        __builtin_trap();
    if (weft_store_msg_parse(data, size, &m) == NULL) {
        if (strlen(m.key) > WEFT_STORE_KEY_MAX || m.signed_len > size)
            __builtin_trap();
    }
    return 0;
}
