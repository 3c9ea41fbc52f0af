#!/usr/bin/env python3
"""perf-smoke: a tool run with -S (time target) and -k (repeats) writes JSON lines whose row is
the median of its repeats: iters >= 1, repeats as asked, time_us_min <= time_us <= time_us_max,
a run never lasted beyond 50 x the target, and the count came from the calibration, not from
-n 1 (some row ran more; on a loaded machine a row's run may be far shorter than the target, when
the calibration met a slow moment).
Usage: timed_check.py WEFTRUN TOOL TARGET REPEATS"""
import json, os, subprocess, sys, tempfile

weftrun, tool, target, repeats = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
with tempfile.TemporaryDirectory() as d:
    out = os.path.join(d, "out.jsonl")
    cmd = [weftrun, "-n", "2", "--timeout", "50", tool, "-H", "1", "-b", "8", "-e", "64K",
           "-f", "64", "-n", "1", "-w", "1", "-c", "1", "-S", str(target), "-k", str(repeats),
           "-J", out]
    rc = subprocess.call(cmd)
    if rc != 0:
        sys.exit("FAIL: %s exited %d" % (" ".join(cmd), rc))
    rows = [json.loads(l) for l in open(out)]
bad = 0
for r in rows:
    ok = (r["iters"] >= 1 and r["repeats"] == repeats and r["wrong"] == 0 and
          r["time_us_min"] <= r["time_us"] <= r["time_us_max"] and
          r["iters"] * r["time_us"] * 1e-6 <= 50 * target)
    print("%s %s" % ("ok  " if ok else "FAIL", json.dumps(r)))
    bad += not ok
if not any(r["iters"] > 1 for r in rows):  # -n 1 was given: the count came from -S
    sys.exit("FAIL: every row ran -n's 1 iteration")
if len(rows) != 6:  # 8 B, 512 B and 32 KiB, out of place and in place
    sys.exit("FAIL: %d JSON lines, expected 6" % len(rows))
sys.exit(1 if bad else 0)
