#!/usr/bin/env python3
"""WEFT_LOG_FORMAT=json and WEFT_TRACE_FILE, end to end (suite mp).

Usage: log_trace.py WEFTRUN ALL_REDUCE_PERF WEFT_TRACE_TOOL TEST_FAULTS

1. 3 ranks run all_reduce_perf with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ALL, the JSON log format,
   2 channels and a trace file per rank. Every line of every log file must parse as one JSON
   object with time, host, pid, tid, rank, subsystem, level and message of the right types; some
   lines must carry a rank, a peer and an operation.
   A mismatch (tests/mp/test_faults mismatch: ranks post different counts) logs WARNs that name
   a peer, an operation and its sequence number: those must be the fields peer, operation, seq.
2. A run whose NCCL_ALGO holds a quote, a backslash, a control character and a byte above 0x7f
   fails init with a WARN: that line too must parse, its message must hold those characters, and
   it must name the file and line.
3. Each rank's trace must parse as Chrome trace-event JSON with one track (pid) = its rank: an
   "X" op event per operation of the run with a numeric ts and dur, channel events on 2 channel
   tracks, enqueue instants; tools/weft-trace merges them into one file with pids {0, 1, 2}, one
   process_name per rank and events in time order, and renders it as text.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

weftrun, perf, weft_trace, faults = sys.argv[1:5]
failed = []


def check(cond, what):
    print("%s %s" % ("ok  " if cond else "FAIL", what))
    if not cond:
        failed.append(what)


def parse_log(path):
    recs = []
    with open(path, "rb") as f:
        for i, raw in enumerate(f):
            try:
                r = json.loads(raw.decode("ascii"))
            except (ValueError, UnicodeDecodeError) as e:
                check(False, "%s line %d parses (%s): %r" % (path, i + 1, e, raw[:200]))
                continue
            ok = (isinstance(r, dict) and isinstance(r.get("time"), str) and
                  r["time"].endswith("Z") and isinstance(r.get("host"), str) and
                  isinstance(r.get("pid"), int) and isinstance(r.get("tid"), int) and
                  "rank" in r and (r["rank"] is None or isinstance(r["rank"], int)) and
                  "subsystem" in r and r.get("level") in ("INFO", "WARN", "TRACE") and
                  isinstance(r.get("message"), str))
            if not ok:
                check(False, "%s line %d has every field: %r" % (path, i + 1, r))
            recs.append(r)
    return recs


with tempfile.TemporaryDirectory() as d:
    env = dict(os.environ, WEFT_LOG_FORMAT="json", NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="ALL",
               NCCL_DEBUG_FILE=os.path.join(d, "log.%p"), WEFT_HOST_NCHANNELS="2",
               WEFT_TRACE_FILE=os.path.join(d, "trace-%r.json"))
    cmd = [weftrun, "-n", "3", "--timeout", "50", perf, "-H", "1", "-b", "8", "-e", "64K",
           "-f", "64", "-n", "4", "-w", "1", "-c", "1"]
    rc = subprocess.call(cmd, env=env, stdout=subprocess.DEVNULL)
    check(rc == 0, "all_reduce_perf on 3 ranks with JSON logs and traces (rc %d)" % rc)

    # 1. logs
    logs = sorted(glob.glob(os.path.join(d, "log.*")))
    recs = [r for p in logs for r in parse_log(p)]
    check(len(logs) >= 3 and len(recs) > 30, "%d log files, %d JSON lines" % (len(logs), len(recs)))
    check({r["rank"] for r in recs if r.get("rank") is not None} >= {0, 1, 2},
          "lines name ranks 0, 1 and 2")
    check(any(isinstance(r.get("operation"), str) for r in recs), "some line names an operation")
    # WEFT_CHECK=0: the slice-size check reports it ("peer P sent a ... (operation S)"), whose
    # fields the JSON line must carry; the signature check's message names calls, not a peer.
    env1 = dict(os.environ, WEFT_LOG_FORMAT="json", NCCL_DEBUG="WARN", WEFT_CHECK="0",
                NCCL_DEBUG_FILE=os.path.join(d, "mismatch.%p"))
    rc = subprocess.call([faults, "mismatch"], env=env1, stdout=subprocess.DEVNULL)
    mm = [r for p in glob.glob(os.path.join(d, "mismatch.*")) for r in parse_log(p)
          if r["level"] == "WARN" and "sent a" in r["message"]]
    want = [(r["message"].split("peer ")[1].split()[0], r["message"].split("(operation ")[1]
             .split(")")[0]) for r in mm]
    check(rc == 0 and len(mm) >= 2 and
          all(r.get("peer") == int(p) and r.get("seq") == int(s) and
              r.get("operation") == "ncclAllReduce" and r.get("rank") is not None
              for r, (p, s) in zip(mm, want)),
          "mismatch WARNs carry peer, operation, seq and rank: %r" % (mm[:1],))
    check(all(r["subsystem"] is None or isinstance(r["subsystem"], str) for r in recs),
          "subsystem is a name list or null")

    # 2. a WARN with characters that need escaping
    bad = "ri\"ng\\\x01\xff"
    env2 = dict(env, NCCL_ALGO=bad, NCCL_DEBUG_FILE=os.path.join(d, "warn.%p"))
    env2.pop("WEFT_TRACE_FILE")
    env2b = {k: v.encode("latin-1") if isinstance(v, str) else v for k, v in env2.items()}
    rc = subprocess.call([weftrun, "-n", "1", "--timeout", "30", perf, "-H", "1", "-b", "8",
                          "-e", "8", "-n", "1"], env=env2b, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    check(rc != 0, "NCCL_ALGO with a quote etc. fails init (rc %d)" % rc)
    warns = [r for p in glob.glob(os.path.join(d, "warn.*")) for r in parse_log(p)
             if r["level"] == "WARN"]
    hit = [w for w in warns if "NCCL_ALGO" in w["message"]]
    check(bool(hit) and 'ri"ng\\\x01\u00ff' in hit[0]["message"] and
          isinstance(hit[0].get("file"), str) and isinstance(hit[0].get("line"), int),
          "the WARN parses, keeps the quote, backslash, control and high characters, names "
          "file and line: %r" % (hit[0] if hit else None))

    # 3. traces
    traces = {}
    for r in range(3):
        p = os.path.join(d, "trace-%d.json" % r)
        try:
            with open(p) as f:
                traces[r] = json.load(f)
        except (OSError, ValueError) as e:
            check(False, "trace of rank %d parses: %s" % (r, e))
    for r, t in traces.items():
        ev = t.get("traceEvents", [])
        ops = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "op"]
        chans = {e["tid"] for e in ev if e.get("ph") == "X" and e.get("cat") == "channel"}
        allreduce = [e for e in ops if e["args"]["collective"] == "AllReduce" and
                     e["args"]["datatype"] == "float"]
        check(all(e.get("pid") == r for e in ev), "rank %d: every event on track pid %d" % (r, r))
        # 3 sizes x 2 halves x (1 warm-up + 1 sync + 4 timed + 1 check) float all-reduces
        check(len(allreduce) >= 3 * 2 * 4 and
              all(isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)) and
                  e["dur"] >= 0 for e in ops),
              "rank %d: %d float all-reduce op events with ts and dur" % (r, len(allreduce)))
        check(len(chans) == 2, "rank %d: channel events on %d tracks" % (r, len(chans)))
        check(any(e.get("ph") == "i" and e.get("cat") == "enqueue" for e in ev),
              "rank %d: enqueue instants" % r)
        check(t.get("otherData", {}).get("rank") == r, "rank %d: otherData.rank" % r)
    merged = os.path.join(d, "merged.json")
    rc = subprocess.call([sys.executable, weft_trace, "merge", "-o", merged] +
                         [os.path.join(d, "trace-%d.json" % r) for r in range(3)])
    check(rc == 0, "weft-trace merge (rc %d)" % rc)
    try:
        with open(merged) as f:
            m = json.load(f)
        ev = m["traceEvents"]
        pids = {e["pid"] for e in ev}
        names = [e for e in ev if e.get("ph") == "M" and e.get("name") == "process_name"]
        ts = [e["ts"] for e in ev if "ts" in e]
        check(pids == {0, 1, 2} and len(names) == 3 and ts == sorted(ts),
              "merged: pids %s, %d process names, events in time order" % (sorted(pids),
                                                                             len(names)))
    except (OSError, ValueError, KeyError) as e:
        check(False, "merged trace parses: %s" % e)
    out = subprocess.run([sys.executable, weft_trace, "ascii", "--ops", "3", merged],
                         stdout=subprocess.PIPE, text=True)
    check(out.returncode == 0 and "rank 2 channel 1" in out.stdout,
          "weft-trace ascii draws every rank and channel")
    print(out.stdout)

print("%s: %d checks failed" % ("FAIL" if failed else "PASS", len(failed)))
sys.exit(1 if failed else 0)
