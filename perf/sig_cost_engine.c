/*
 * The signature check's CPU cost without the noise of two processes on a shared machine:
 *   1. the step engine's work for one 8 B ring all-reduce on 2 ranks, both driven by this thread
 *      over in-memory FIFOs, with lane.sig = 0 (WEFT_CHECK=0) and with a hash (WEFT_CHECK=1);
 *   2. the per-operation record (weft_sig_begin, weft_sig_of, weft_sig_end), paid in both modes.
 * Best of 30 runs each. meson test -C build --benchmark sig-cost-engine -v
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "core/comm.h"
#include "core/group.h"
#include "exec/lane.h"
#include "exec/sig.h"
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc, char **argv){
  (void)argc;
  (void)argv;
  int algo = WEFT_ALGO_RING;
  size_t sb = 1024; /* LL-sized slots */
  struct weft_fifo_ctrl *ctrl = aligned_alloc(64, 2 * sizeof(*ctrl)); memset(ctrl, 0, 2 * sizeof(*ctrl));
  char *slots[2]; for (int d = 0; d < 2; d++) { slots[d] = aligned_alloc(64, sb * 32); memset(slots[d], 0, sb * 32); }
  /* direction d: rank d -> rank 1-d */
  struct weft_conn s[2], r[2];
  for (int d = 0; d < 2; d++) {
    s[d] = (struct weft_conn){.ctrl = &ctrl[d], .slots = slots[d], .slot_bytes = sb, .nslots = 32};
    r[d] = s[d];
  }
  struct weft_peer_conns pc[2][2] = {{{0}}};
  pc[0][1].send = &s[0]; pc[0][1].recv = &r[1];
  pc[1][0].send = &s[1]; pc[1][0].recv = &r[0];
  float in[2][2] = {{1, 2}, {3, 4}}, out[2][2];
  struct weft_redop op = {.dtype = WEFT_FLOAT32, .kind = WEFT_RED_SUM};
  struct weft_lane lanes[2];
  struct weft_step steps[2][64];
  for (int k = 0; k < 2; k++) {
    struct weft_sched_args a = {.coll = WEFT_COLL_ALLREDUCE, .algo = algo, .count = 2, .nranks = 2,
                                .rank = k, .root = -1, .channel = 0, .nchannels = 1, .chunk = 1024};
    memset(&lanes[k], 0, sizeof(lanes[k]));
    lanes[k].steps = steps[k];
    lanes[k].nsteps = weft_sched_build(&a, steps[k], 64);
    lanes[k].peers = pc[k]; lanes[k].nranks = 2; lanes[k].input = in[k]; lanes[k].output = out[k];
    lanes[k].elem_size = 4; lanes[k].op = &op; lanes[k].ll = 1;
  }
  for (int mode = 0; mode < 2; mode++) {
    double best = 1e9;
    for (int rep = 0; rep < 30; rep++) {
      double t0 = now();
      for (int i = 0; i < 20000; i++) {
        for (int k = 0; k < 2; k++) { weft_lane_init(&lanes[k]); lanes[k].sig = mode ? 0x1234567u : 0; }
        while (!weft_lane_done(&lanes[0]) || !weft_lane_done(&lanes[1]))
          for (int k = 0; k < 2; k++) if (weft_lane_progress(&lanes[k], NULL, NULL) < 0) { puts("mismatch"); return 1; }
      }
      double dt = (now() - t0) / 20000 * 1e9; if (dt < best) best = dt;
    }
    printf("algo %d, WEFT_CHECK=%d: %.1f ns per 2-rank 8 B all-reduce (both ranks' step engine work, best of 30 x 20000)\n", algo, mode, best);
  }
  if (out[0][0] != 4 || out[1][1] != 6) { printf("wrong %g %g\n", out[0][0], out[1][1]); return 1; }
  struct ncclComm *c = calloc(1, sizeof(*c));
  c->nranks = 2;
  if (c == NULL || weft_sig_init(c) != ncclSuccess)
    return 1;
  struct weft_task t = {.comm = c, .coll = WEFT_COLL_ALLREDUCE, .count = 2, .dtype = WEFT_FLOAT32,
                        .has_redop = 1, .root = -1};
  double best = 1e9;
  volatile uint32_t sink = 0;
  for (int rep = 0; rep < 30; rep++) {
    double t0 = now();
    for (int i = 0; i < 100000; i++) {
      uint64_t rec;
      weft_sig_begin(c, &t, 1, &t, &rec);
      sink += weft_sig_of(c, rec)->hash;
      weft_sig_end(c, rec, 0);
    }
    double dt = (now() - t0) / 100000 * 1e9; if (dt < best) best = dt;
  }
  printf("operation record (begin, of, end): %.1f ns per operation per rank, both modes\n", best);
  weft_sig_fini(c);
  free(c);
  return 0;
}
