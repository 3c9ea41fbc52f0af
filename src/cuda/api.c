/* The weftCuda* forwards of include/weft.h: one line each onto the chosen backend's table. */
#include "api/export.h"
#include "cuda/cuda_ops.h"
#include "weft.h"

#define OPS weft_cuda()

WEFT_EXPORT const char *weftCudaBackend(void) { return OPS->name; }
WEFT_EXPORT int weftCudaGetDeviceCount(int *count) { return OPS->get_device_count(count); }
WEFT_EXPORT int weftCudaSetDevice(int device) { return OPS->set_device(device); }
WEFT_EXPORT int weftCudaGetDevice(int *device) { return OPS->get_device(device); }
WEFT_EXPORT int weftCudaDeviceCanAccessPeer(int *canAccess, int device, int peer)
{
    return OPS->can_access_peer(canAccess, device, peer);
}
WEFT_EXPORT int weftCudaDeviceEnablePeerAccess(int peer) { return OPS->enable_peer_access(peer); }
WEFT_EXPORT int weftCudaDeviceSynchronize(void) { return OPS->device_synchronize(); }
WEFT_EXPORT int weftCudaMalloc(void **ptr, size_t bytes) { return OPS->malloc(ptr, bytes); }
WEFT_EXPORT int weftCudaFree(void *ptr) { return OPS->free(ptr); }
WEFT_EXPORT int weftCudaHostAlloc(void **ptr, size_t bytes) { return OPS->host_alloc(ptr, bytes); }
WEFT_EXPORT int weftCudaHostFree(void *ptr) { return OPS->host_free(ptr); }

/*
 * The synchronous calls synchronise the legacy stream first: a capture that forbids them then
 * fails the call before anything is queued (cudaMemcpy copies nothing when it returns 900).
 */
WEFT_EXPORT int weftCudaMemcpy(void *dst, const void *src, size_t bytes)
{
    int err = OPS->stream_synchronize(NULL);
    if (err == 0)
        err = OPS->memcpy_async(dst, src, bytes, NULL);
    return err != 0 ? err : OPS->stream_synchronize(NULL);
}

WEFT_EXPORT int weftCudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaStream_t stream)
{
    return OPS->memcpy_async(dst, src, bytes, (weft_cuda_stream_t)stream);
}

WEFT_EXPORT int weftCudaMemset(void *dst, int value, size_t bytes)
{
    int err = OPS->stream_synchronize(NULL);
    if (err == 0)
        err = OPS->memset_async(dst, value, bytes, NULL);
    return err != 0 ? err : OPS->stream_synchronize(NULL);
}

WEFT_EXPORT int weftCudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t stream)
{
    return OPS->memset_async(dst, value, bytes, (weft_cuda_stream_t)stream);
}

WEFT_EXPORT int weftCudaStreamCreate(cudaStream_t *stream)
{
    return OPS->stream_create((weft_cuda_stream_t *)stream);
}
WEFT_EXPORT int weftCudaStreamDestroy(cudaStream_t stream) { return OPS->stream_destroy(stream); }
WEFT_EXPORT int weftCudaStreamSynchronize(cudaStream_t stream)
{
    return OPS->stream_synchronize(stream);
}
WEFT_EXPORT int weftCudaStreamQuery(cudaStream_t stream) { return OPS->stream_query(stream); }
WEFT_EXPORT int weftCudaStreamBeginCapture(cudaStream_t stream)
{
    return OPS->capture_begin(stream);
}
WEFT_EXPORT int weftCudaStreamEndCapture(cudaStream_t stream, weftCudaGraph_t *graph)
{
    return OPS->capture_end(stream, (weft_cuda_graph_t *)graph);
}
WEFT_EXPORT int weftCudaGraphLaunch(weftCudaGraph_t graph, cudaStream_t stream)
{
    return OPS->graph_launch(graph, stream);
}
WEFT_EXPORT int weftCudaGraphDestroy(weftCudaGraph_t graph) { return OPS->graph_destroy(graph); }
WEFT_EXPORT int weftCudaEventCreate(weftCudaEvent_t *event)
{
    return OPS->event_create((weft_cuda_event_t *)event);
}
WEFT_EXPORT int weftCudaEventRecord(weftCudaEvent_t event, cudaStream_t stream)
{
    return OPS->event_record(event, stream);
}
WEFT_EXPORT int weftCudaEventSynchronize(weftCudaEvent_t event)
{
    return OPS->event_synchronize(event);
}
WEFT_EXPORT int weftCudaEventDestroy(weftCudaEvent_t event) { return OPS->event_destroy(event); }
WEFT_EXPORT int weftCudaStreamWaitEvent(cudaStream_t stream, weftCudaEvent_t event)
{
    return OPS->stream_wait_event(stream, event);
}
WEFT_EXPORT const char *weftCudaGetErrorString(int error) { return OPS->error_string(error); }
