/*
 * A unique id as text: the 128 bytes of ncclUniqueId written as 256 hex digits, two per byte in
 * byte order, so that a launcher can pass it to its ranks in an environment variable
 * (WEFT_UNIQUE_ID, see include/weft.h). Used by tools/weftrun.c (encode) and src/core/launch.c
 * (decode). Pure functions: no state, any thread.
 */
#ifndef WEFT_CORE_HEXID_H
#define WEFT_CORE_HEXID_H

#include "nccl.h"

/* Hex digits in an encoded id (same value as WEFT_UNIQUE_ID_HEX_LEN in weft.h). */
#define WEFT_HEXID_LEN (2 * NCCL_UNIQUE_ID_BYTES)

/* Writes WEFT_HEXID_LEN lowercase hex digits and a terminating NUL to hex_p, which the caller
 * provides with room for WEFT_HEXID_LEN + 1 chars. Cannot fail. */
void weft_hexid_encode(const ncclUniqueId *id, char *hex_p);

/*
 * Decodes exactly WEFT_HEXID_LEN hex digits (either case; nothing else allowed, not even trailing
 * whitespace) into *id_p. `what` names the source in the error message (e.g. "WEFT_UNIQUE_ID").
 * Returns ncclInvalidArgument (after a WEFT_WARN naming the length or the first bad character) for
 * malformed text, with *id_p untouched; ncclSuccess otherwise.
 */
ncclResult_t weft_hexid_decode(const char *what, const char *hex, ncclUniqueId *id_p);

#endif
