/* Weft host streams (include/weft.h): asynchronous, in-order execution of host-memory work;
 * and the hang report on request. */
#include "api/export.h"
#include "core/check.h"
#include "core/comm.h"
#include "exec/sig.h"
#include "exec/stream.h"
#include "weft.h"

static ncclResult_t weft_stream_arg(weftStream_t stream, const char *api, struct weft_stream **s_p)
{
    struct weft_stream *s = weft_stream_lookup(stream);
    if (s == NULL) {
        WEFT_WARN("%s: %p is not a live Weft host stream", api, (void *)stream);
        return ncclInvalidArgument;
    }
    *s_p = s;
    return ncclSuccess;
}

WEFT_EXPORT ncclResult_t weftStreamCreate(weftStream_t *stream)
{
    if (stream == NULL) {
        WEFT_WARN("weftStreamCreate: stream is NULL");
        return ncclInvalidArgument;
    }
    struct weft_stream *s;
    WEFT_CHECK(weft_stream_create(&s));
    *stream = (weftStream_t)s;
    return ncclSuccess;
}

WEFT_EXPORT ncclResult_t weftStreamDestroy(weftStream_t stream)
{
    struct weft_stream *s;
    WEFT_CHECK(weft_stream_arg(stream, "weftStreamDestroy", &s));
    return weft_stream_destroy(s);
}

WEFT_EXPORT ncclResult_t weftStreamSynchronize(weftStream_t stream)
{
    struct weft_stream *s;
    WEFT_CHECK(weft_stream_arg(stream, "weftStreamSynchronize", &s));
    return weft_stream_synchronize(s);
}

WEFT_EXPORT ncclResult_t weftStreamQuery(weftStream_t stream)
{
    struct weft_stream *s;
    WEFT_CHECK(weft_stream_arg(stream, "weftStreamQuery", &s));
    return weft_stream_query(s);
}

WEFT_EXPORT ncclResult_t weftCommHangReport(ncclComm_t comm)
{
    WEFT_CHECK(weft_comm_enter(comm, "weftCommHangReport"));
    ncclResult_t res = weft_sig_request_report(comm);
    weft_comm_leave(comm);
    return res;
}
