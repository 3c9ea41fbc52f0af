/* ncclUniqueId <-> hex text; see hexid.h. */
#include "core/hexid.h"

#include <string.h>

#include "core/log.h"

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

void weft_hexid_encode(const ncclUniqueId *id, char *hex_p)
{
    static const char digits[] = "0123456789abcdef";
    const unsigned char *bytes = (const unsigned char *)id->internal;

    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
        hex_p[2 * i] = digits[bytes[i] >> 4];
        hex_p[2 * i + 1] = digits[bytes[i] & 0xf];
    }
    hex_p[WEFT_HEXID_LEN] = '\0';
}

ncclResult_t weft_hexid_decode(const char *what, const char *hex, ncclUniqueId *id_p)
{
    ncclUniqueId id;
    size_t len = strlen(hex);

    if (len != WEFT_HEXID_LEN) {
        WEFT_WARN("%s has %zu characters, expected %d hex digits (an ncclUniqueId)", what, len,
                  WEFT_HEXID_LEN);
        return ncclInvalidArgument;
    }
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
        int hi = hex_value(hex[2 * i]);
        int lo = hex_value(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            int bad = hi < 0 ? 2 * i : 2 * i + 1;
            unsigned char c = (unsigned char)hex[bad];
            if (c >= 0x20 && c < 0x7f)
                WEFT_WARN("%s has a non-hex character '%c' at position %d", what, c, bad);
            else
                WEFT_WARN("%s has a non-hex byte 0x%02x at position %d", what, c, bad);
            return ncclInvalidArgument;
        }
        id.internal[i] = (char)((hi << 4) | lo);
    }
    *id_p = id;
    return ncclSuccess;
}
