/*
 * test_schedule.c -- properties of the pipeline schedules (tools/train/pp.c) for every p in 1..8
 * and m in 1..16, GPipe and 1F1B:
 *   - every stage runs F and B of every micro-batch exactly once, B after F, B in order 0..m-1;
 *   - receives / sends exist exactly where the stage has a neighbour, once per micro-batch,
 *     receive before F (B), send after F (B);
 *   - groups are contiguous runs of point-to-point actions;
 *   - live activation slots never exceed wt_schedule_slots, which is min(p-i, m) for 1F1B and m
 *     for GPipe, and the maximum is reached;
 *   - simulated in lockstep with rendezvous point-to-point (a send completes only together with
 *     its receive, both posted at once; a group returns when all of its operations completed),
 *     every stage finishes (no deadlock) and the k-th send on every channel carries the same
 *     micro-batch as the k-th receive.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

static int failures;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        failures++;                                                                                \
        return;                                                                                    \
    } while (0)

#define MAXP 8
#define MAXM 16
#define MAXA 256

static const char *sname(enum wt_schedule s)
{
    return s == WT_SCHED_GPIPE ? "gpipe" : "1f1b";
}

static int is_p2p(enum wt_action_kind k)
{
    return k != WT_ACT_FORWARD && k != WT_ACT_BACKWARD;
}

static void check_stage(enum wt_schedule s, int i, int p, int m, const struct wt_action *a,
                        int n)
{
    int posF[MAXM], posB[MAXM], posRF[MAXM], posSF[MAXM], posRB[MAXM], posSB[MAXM];
    int cnt[6][MAXM];
    memset(cnt, 0, sizeof(cnt));
    for (int k = 0; k < MAXM; k++)
        posF[k] = posB[k] = posRF[k] = posSF[k] = posRB[k] = posSB[k] = -1;
    int first = i == 0, last = i == p - 1;
    int live = 0, maxlive = 0, nextB = 0;
    for (int k = 0; k < n; k++) {
        int mb = a[k].mb;
        if (mb < 0 || mb >= m)
            FAIL("%s p%d m%d stage %d: action %d has micro-batch %d", sname(s), p, m, i, k, mb);
        if ((unsigned)a[k].kind > WT_ACT_SEND_BWD)
            FAIL("%s p%d m%d stage %d: bad action kind", sname(s), p, m, i);
        cnt[a[k].kind][mb]++;
        switch (a[k].kind) {
        case WT_ACT_FORWARD:
            posF[mb] = k;
            live++;
            if (live > maxlive)
                maxlive = live;
            if (a[k].group != 0)
                FAIL("%s p%d m%d stage %d: forward in a group", sname(s), p, m, i);
            break;
        case WT_ACT_BACKWARD:
            posB[mb] = k;
            live--;
            if (mb != nextB)
                FAIL("%s p%d m%d stage %d: backward of %d, expected %d", sname(s), p, m, i, mb,
                     nextB);
            nextB++;
            if (a[k].group != 0)
                FAIL("%s p%d m%d stage %d: backward in a group", sname(s), p, m, i);
            break;
        case WT_ACT_RECV_FWD: posRF[mb] = k; break;
        case WT_ACT_SEND_FWD: posSF[mb] = k; break;
        case WT_ACT_RECV_BWD: posRB[mb] = k; break;
        case WT_ACT_SEND_BWD: posSB[mb] = k; break;
        }
    }
    for (int mb = 0; mb < m; mb++) {
        if (cnt[WT_ACT_FORWARD][mb] != 1 || cnt[WT_ACT_BACKWARD][mb] != 1)
            FAIL("%s p%d m%d stage %d: mb %d has %d forwards, %d backwards", sname(s), p, m, i,
                 mb, cnt[WT_ACT_FORWARD][mb], cnt[WT_ACT_BACKWARD][mb]);
        if (posB[mb] < posF[mb])
            FAIL("%s p%d m%d stage %d: mb %d backward before forward", sname(s), p, m, i, mb);
        if (cnt[WT_ACT_RECV_FWD][mb] != !first || cnt[WT_ACT_SEND_BWD][mb] != !first ||
            cnt[WT_ACT_SEND_FWD][mb] != !last || cnt[WT_ACT_RECV_BWD][mb] != !last)
            FAIL("%s p%d m%d stage %d: mb %d wrong number of sends/receives", sname(s), p, m, i,
                 mb);
        if (!first && (posRF[mb] > posF[mb] || posSB[mb] < posB[mb]))
            FAIL("%s p%d m%d stage %d: mb %d recv_fwd after F or send_bwd before B", sname(s), p,
                 m, i, mb);
        if (!last && (posSF[mb] < posF[mb] || posRB[mb] > posB[mb]))
            FAIL("%s p%d m%d stage %d: mb %d send_fwd before F or recv_bwd after B", sname(s), p,
                 m, i, mb);
    }
    /* groups: contiguous, p2p only, never reused */
    for (int k = 0; k < n; k++) {
        if (a[k].group == 0)
            continue;
        if (!is_p2p(a[k].kind))
            FAIL("%s p%d m%d stage %d: compute action in group", sname(s), p, m, i);
        int j = k;
        while (j < n && a[j].group == a[k].group)
            j++;
        for (int q = j; q < n; q++)
            if (a[q].group == a[k].group)
                FAIL("%s p%d m%d stage %d: group %d not contiguous", sname(s), p, m, i,
                     a[k].group);
        k = j - 1;
    }
    int slots = wt_schedule_slots(s, i, p, m);
    int want = s == WT_SCHED_GPIPE ? m : (p - i < m ? p - i : m);
    if (slots != want)
        FAIL("%s p%d m%d stage %d: wt_schedule_slots %d, expected %d", sname(s), p, m, i, slots,
             want);
    if (maxlive != slots)
        FAIL("%s p%d m%d stage %d: %d live micro-batches at most, slots say %d", sname(s), p, m,
             i, maxlive, slots);
}

static int chan_of(enum wt_action_kind kind)
{
    return kind == WT_ACT_SEND_FWD ? 0 : kind == WT_ACT_RECV_FWD ? 1
         : kind == WT_ACT_SEND_BWD ? 2 : 3;
}

/* Lockstep rendezvous simulation over all stages. */
static void simulate(enum wt_schedule s, int p, int m, struct wt_action acts[MAXP][MAXA],
                     const int *n)
{
    int pc[MAXP], end[MAXP];
    int done[MAXP][MAXA];
    /* per stage, completed ops on: [0] send to next, [1] recv from prev, [2] send to prev,
     * [3] recv from next; and the micro-batches carried, in order */
    int chan_mb[MAXP][4][MAXM], chan_n[MAXP][4];
    memset(done, 0, sizeof(done));
    memset(chan_n, 0, sizeof(chan_n));
    for (int i = 0; i < p; i++)
        pc[i] = end[i] = 0;

    for (int iter = 0;; iter++) {
        int progress = 0, finished = 1;
        for (int i = 0; i < p; i++) {
            while (pc[i] < n[i] && !is_p2p(acts[i][pc[i]].kind)) {
                pc[i]++;
                progress = 1;
            }
            if (pc[i] < n[i]) {
                finished = 0;
                int j = pc[i] + 1;
                if (acts[i][pc[i]].group != 0)
                    while (j < n[i] && acts[i][j].group == acts[i][pc[i]].group)
                        j++;
                end[i] = j;
            }
        }
        if (finished)
            break;
        /* match posted operations pairwise */
        for (int i = 0; i < p; i++) {
            if (pc[i] >= n[i])
                continue;
            for (int k = pc[i]; k < end[i]; k++) {
                if (done[i][k])
                    continue;
                enum wt_action_kind kind = acts[i][k].kind, want;
                int peer;
                if (kind == WT_ACT_SEND_FWD) {
                    peer = i + 1;
                    want = WT_ACT_RECV_FWD;
                } else if (kind == WT_ACT_RECV_FWD) {
                    peer = i - 1;
                    want = WT_ACT_SEND_FWD;
                } else if (kind == WT_ACT_SEND_BWD) {
                    peer = i - 1;
                    want = WT_ACT_RECV_BWD;
                } else {
                    peer = i + 1;
                    want = WT_ACT_SEND_BWD;
                }
                if (peer < 0 || peer >= p)
                    FAIL("%s p%d m%d stage %d: p2p to a missing stage", sname(s), p, m, i);
                if (pc[peer] >= n[peer])
                    continue;
                for (int q = pc[peer]; q < end[peer]; q++) {
                    if (done[peer][q] || acts[peer][q].kind != want)
                        continue;
                    if (acts[peer][q].mb != acts[i][k].mb)
                        FAIL("%s p%d m%d: stage %d's %d-th op pairs mb %d with stage %d's mb %d",
                             sname(s), p, m, i, k, acts[i][k].mb, peer, acts[peer][q].mb);
                    done[i][k] = done[peer][q] = 1;
                    int c = chan_of(kind), cp = chan_of(want);
                    chan_mb[i][c][chan_n[i][c]++] = acts[i][k].mb;
                    chan_mb[peer][cp][chan_n[peer][cp]++] = acts[peer][q].mb;
                    progress = 1;
                    break;
                }
            }
        }
        for (int i = 0; i < p; i++) {
            if (pc[i] >= n[i])
                continue;
            int all = 1;
            for (int k = pc[i]; k < end[i]; k++)
                all &= done[i][k];
            if (all) {
                pc[i] = end[i];
                progress = 1;
            }
        }
        if (!progress) {
            fprintf(stderr, "%s p%d m%d: deadlock; stages at:", sname(s), p, m);
            for (int i = 0; i < p; i++)
                fprintf(stderr, " %d/%d", pc[i], n[i]);
            fputc('\n', stderr);
            failures++;
            return;
        }
        if (iter > 100000)
            FAIL("%s p%d m%d: simulation does not terminate", sname(s), p, m);
    }
    /* every channel carried micro-batches 0..m-1 in order */
    for (int i = 0; i < p; i++)
        for (int c = 0; c < 4; c++) {
            int expect = (c == 0 || c == 3) ? i < p - 1 : i > 0;
            if (chan_n[i][c] != (expect ? m : 0))
                FAIL("%s p%d m%d stage %d: channel %d carried %d messages", sname(s), p, m, i, c,
                     chan_n[i][c]);
            for (int k = 0; k < chan_n[i][c]; k++)
                if (chan_mb[i][c][k] != k)
                    FAIL("%s p%d m%d stage %d: channel %d out of order", sname(s), p, m, i, c);
        }
}

int main(void)
{
    static struct wt_action acts[MAXP][MAXA];
    int n[MAXP];
    int cases = 0;
    enum wt_schedule scheds[2] = {WT_SCHED_GPIPE, WT_SCHED_1F1B};
    for (int si = 0; si < 2; si++) {
        for (int p = 1; p <= MAXP; p++) {
            for (int m = 1; m <= MAXM; m++) {
                int before = failures;
                for (int i = 0; i < p; i++) {
                    int need = wt_schedule_build(scheds[si], i, p, m, NULL, 0);
                    if (need > MAXA) {
                        fprintf(stderr, "schedule too long: %d\n", need);
                        return 1;
                    }
                    n[i] = wt_schedule_build(scheds[si], i, p, m, acts[i], MAXA);
                    if (n[i] != need) {
                        fprintf(stderr, "%s p%d m%d stage %d: count %d vs %d\n",
                                sname(scheds[si]), p, m, i, n[i], need);
                        failures++;
                    }
                    int expect = 2 * m + (i > 0 ? 2 * m : 0) + (i < p - 1 ? 2 * m : 0);
                    if (n[i] != expect) {
                        fprintf(stderr, "%s p%d m%d stage %d: %d actions, expected %d\n",
                                sname(scheds[si]), p, m, i, n[i], expect);
                        failures++;
                    }
                    check_stage(scheds[si], i, p, m, acts[i], n[i]);
                }
                simulate(scheds[si], p, m, acts, n);
                /* truncated output stays within max */
                struct wt_action small[3];
                if (wt_schedule_build(scheds[si], 0, p, m, small, 3) > 3) {
                    fprintf(stderr, "wt_schedule_build wrote past max\n");
                    failures++;
                }
                cases++;
                if (failures > before + 20)
                    return 1;
            }
        }
    }
    /* 1F1B groups exist where both directions are in flight (p >= 2, m >= 2, middle stage) */
    {
        int cnt = wt_schedule_build(WT_SCHED_1F1B, 1, 4, 8, acts[0], MAXA), groups = 0;
        for (int k = 0; k < cnt; k++)
            groups += acts[0][k].group != 0;
        if (groups == 0) {
            fprintf(stderr, "1f1b p4 m8 stage 1: no grouped send/recv\n");
            failures++;
        }
    }
    if (failures) {
        fprintf(stderr, "test_schedule: %d failures\n", failures);
        return 1;
    }
    printf("test_schedule: %d (schedule, p, m) cases OK\n", cases);
    return 0;
}
