/*
 * Which GPU a peer uses. Device identity across processes (CUDA_VISIBLE_DEVICES numbers devices
 * per process, so every rank may be "device 0"): peer_identity fills me->cuda_uuid and
 * cuda_bus_id for device dev before the peer exchange. same_gpu: ranks a and b use one GPU (same
 * host, same uuid). peer_device: the ordinal in this process of rank p's device, or -1 (another
 * host, no device, or not visible here). Read from exchanged peer info and the CUDA ops table
 * (cuda/cuda_ops.h) only, for the CUDA executor (exec/cuda.c) and the p2p transport alike, from
 * a communicator's transport context (transport.h).
 */
#ifndef WEFT_CORE_CUDA_PEER_H
#define WEFT_CORE_CUDA_PEER_H

#include "nccl.h"

struct weft_peer_info;
struct weft_transport_ctx;

ncclResult_t weft_cuda_peer_identity(int dev, struct weft_peer_info *me);
int weft_cuda_same_gpu(const struct weft_transport_ctx *ctx, int a, int b);
int weft_cuda_peer_device(const struct weft_transport_ctx *ctx, int p);

#endif
