/*
 * From NCCL's (op, datatype) to the struct weft_redop the executors apply: built-in ops, ncclAvg
 * (pre-multiply for floats, post-divide for integers) and user PreMulSum ops.
 *
 * User ops belong to one communicator. Their handle encodes a slot index and a tag derived from
 * the communicator, so a handle used on another communicator or after ncclRedOpDestroy is
 * rejected with ncclInvalidArgument.
 */
#ifndef WEFT_CORE_REDOP_BUILD_H
#define WEFT_CORE_REDOP_BUILD_H

#include "nccl.h"
#include "redop.h"

struct ncclComm;

/* Fills *out for a reduction on comm; checks op and datatype (messages name `api`). */
ncclResult_t weft_redop_build(const struct ncclComm *comm, ncclRedOp_t op, ncclDataType_t dtype,
                              const char *api, struct weft_redop *out);

ncclResult_t weft_redop_create_premulsum(struct ncclComm *comm, ncclRedOp_t *op_p, void *scalar,
                                         ncclDataType_t dtype, ncclScalarResidence_t residence);
ncclResult_t weft_redop_destroy(struct ncclComm *comm, ncclRedOp_t op);

#endif
