/*
 * Whether reading another process's memory with process_vm_readv (cross memory attach, CMA)
 * pays on this machine.
 *
 * Two paths of one host can move a buffer from a peer process in one copy instead of two
 * through a shared-memory FIFO: single-copy sends (exec/lane.h) and the zero-copy collectives
 * of unregistered buffers (exec/zcopy.h). Whether one kernel copy beats two user copies depends
 * on the machine: process_vm_readv pins the source pages and copies in the kernel, at 12-14
 * GB/s on one KVM guest (AMD EPYC, Zen 5) where glibc's memcpy moves 50-100 GB/s, so there the
 * FIFO path was 1.6-2.4x faster than the single copy; on another (Intel Xeon) the single copy
 * tripled send/recv. The policy is WEFT_CMA: 1 always, 0 never, -1 (default) measure: once per
 * process, at its first communicator's init, time process_vm_readv and memcpy of the same 512 KiB
 * (the process's own pages, best of a few interleaved runs, about a millisecond) and use CMA
 * when the kernel copies at least half as fast as memcpy (one copy instead of two).
 *
 * Each rank decides for itself, and nothing depends on ranks agreeing: a single-copy send is
 * read that way only when its receiver said so at setup, and a zero-copy collective runs only
 * when every rank votes for it (else the normal schedule runs).
 */
#ifndef WEFT_CORE_CMA_H
#define WEFT_CORE_CMA_H

/* 1 when this process should read peers' memory with process_vm_readv where the kernel allows
 * it (the caller still checks that: same PID namespace, ptrace rights). Thread-safe; the first
 * call may take about a millisecond, the others a load. */
int weft_cma_pays(void);

#endif
