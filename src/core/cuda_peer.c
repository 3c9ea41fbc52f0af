/* Which GPU a peer uses: see cuda_peer.h. */
#include "core/cuda_peer.h"

#include <string.h>

#include "core/communicator.h"
#include "core/log.h"
#include "cuda/cuda_ops.h"

ncclResult_t weft_cuda_peer_identity(int dev, struct weft_peer_info *me)
{
    struct weft_cuda_dev_id id;
    int err = weft_cuda()->device_id(dev, &id);
    if (err != 0) {
        WEFT_WARN("rank %d: the uuid and PCI bus id of device %d: %s (%d)", me->rank, dev,
                  weft_cuda()->error_string(err), err);
        return ncclUnhandledCudaError;
    }
    _Static_assert(sizeof(me->cuda_uuid) == sizeof(id.uuid), "uuid size");
    _Static_assert(sizeof(me->cuda_bus_id) == sizeof(id.bus_id), "bus id size");
    memcpy(me->cuda_uuid, id.uuid, sizeof(id.uuid));
    memcpy(me->cuda_bus_id, id.bus_id, sizeof(id.bus_id));
    me->cuda_bus_id[sizeof(me->cuda_bus_id) - 1] = '\0';
    return ncclSuccess;
}

int weft_cuda_same_gpu(const struct weft_transport_ctx *ctx, int a, int b)
{
    const struct weft_peer_info *pa = &ctx->peers[a], *pb = &ctx->peers[b];
    return pa->cuda_dev >= 0 && pb->cuda_dev >= 0 && pa->host_hash == pb->host_hash &&
           pa->machine_hash == pb->machine_hash &&
           memcmp(pa->cuda_uuid, pb->cuda_uuid, sizeof(pa->cuda_uuid)) == 0;
}

int weft_cuda_peer_device(const struct weft_transport_ctx *ctx, int p)
{
    const struct weft_peer_info *pi = &ctx->peers[p], *self = &ctx->peers[ctx->rank];
    int d = -1;
    if (pi->cuda_dev < 0 || self->cuda_dev < 0 || pi->host_hash != self->host_hash ||
        pi->machine_hash != self->machine_hash)
        return -1;
    if (weft_cuda_same_gpu(ctx, ctx->rank, p))
        return ctx->cuda_dev;
    if (weft_cuda()->device_by_bus_id(&d, pi->cuda_bus_id) != 0)
        return -1; /* not visible in this process (CUDA_VISIBLE_DEVICES) */
    return d;
}
