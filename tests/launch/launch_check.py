#!/usr/bin/env python3
"""Runs a perf tool under a launcher and checks the result (suite 'launch').

    launch_check.py MODE NRANKS TOOL [ARGS...]

MODE is one of
    ompi        mpirun.openmpi --allow-run-as-root --oversubscribe -np N
    mpich       mpiexec.mpich -n N
    torch       a torchrun-style start: N processes with RANK, WORLD_SIZE, LOCAL_RANK,
                LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=<free port>
    torch-agent as torch, but MASTER_PORT is held by a listener (as torchrun's agent store holds
                it) and TORCHELASTIC_USE_AGENT_STORE=True: Weft must meet at MASTER_PORT + 1
    slurm       an srun-style start on one node (no srun needed): SLURM_PROCID, SLURM_NTASKS,
                SLURM_LOCALID, SLURM_JOB_ID, SLURM_STEP_ID, SLURM_STEP_NUM_NODES=1
    torch-twojobs  two torchrun-style jobs (different TORCHELASTIC_RUN_ID) started together with
                one WEFT_STORE_ADDR: ranks that reach the other job's store are refused and retry,
                the second rank 0 waits for the port; both jobs must pass
    torch-nomaster  torch without MASTER_ADDR/MASTER_PORT and LOCAL_WORLD_SIZE=1 (ranks claim to
                be on different hosts): must fail fast and name WEFT_STORE_ADDR

Passes (exit 0) when the launcher and every rank exit 0, the tool printed its table and every
#wrong column is 0. A launcher that is not installed is a failure, not a skip: scripts/deps.sh
installs both, and a suite must never skip for a package the install step adds.
"""
import os
import shutil
import socket
import subprocess
import sys
import time

RUN_TIMEOUT_S = 40

# Variables of an enclosing launch that must not leak into the one under test.
SCRUB_PREFIXES = ("WEFT_RANK", "WEFT_NRANKS", "WEFT_LOCAL_", "WEFT_UNIQUE_ID", "WEFT_STORE_ADDR",
                  "OMPI_COMM_WORLD_", "PMI_", "PMIX_", "MPI_LOCAL", "SLURM_", "TORCHELASTIC_")
SCRUB_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT", "GROUP_RANK"}


def clean_env():
    env = {k: v for k, v in os.environ.items()
           if k not in SCRUB_NAMES and not k.startswith(SCRUB_PREFIXES)}
    return env


def skip(reason):
    print("SKIP: " + reason)
    sys.exit(77)


def fail(reason, output=""):
    if output:
        sys.stdout.write(output)
    print("FAIL: " + reason)
    sys.exit(1)


def free_port_pair():
    """A port p such that p and p + 1 are both free right now (on 127.0.0.1)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            p = a.getsockname()[1]
            if p >= 65535:
                continue
            try:
                with socket.socket() as b:
                    b.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
            return p
    fail("no free pair of ports on 127.0.0.1")


def check_table(out):
    """Every #wrong column of every data row is 0 (or N/A); returns the number of rows checked."""
    cols, rows = None, 0
    for line in out.splitlines():
        toks = line.split()
        if not toks:
            continue
        if toks[0] == "#" and "#wrong" in toks:
            cols = [i - 1 for i, t in enumerate(toks) if t == "#wrong"]
            continue
        if cols is None or toks[0].startswith("#") or not toks[0].isdigit():
            continue
        for c in cols:
            if c >= len(toks):
                fail("short table row: " + line, out)
            if toks[c] not in ("0", "N/A"):  # N/A: not measured (in-place sendrecv)
                fail("wrong results in row: " + line, out)
        rows += 1
    if cols is None or rows == 0:
        fail("no result table in the output", out)
    if "Out of bounds values : 0 OK" not in out:
        fail("no 'Out of bounds values : 0 OK' line", out)
    return rows


def run(cmd, env):
    try:
        p = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if e.stdout else ""
        fail("timed out after %d s: %s" % (RUN_TIMEOUT_S, " ".join(cmd)), out)
    return p.returncode, p.stdout.decode(errors="replace")


def torch_spawn(n, prog, env, master_port, local_world_size=None, run_id="weft-launch-test"):
    """Starts n ranks like torchrun's workers; returns their Popen objects."""
    procs = []
    for r in range(n):
        e = dict(env)
        e.update({"RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r),
                  "LOCAL_WORLD_SIZE": str(local_world_size or n), "GROUP_RANK": "0",
                  "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": "0"})
        if master_port is not None:
            e.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port)})
        procs.append(subprocess.Popen(prog, env=e, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    return procs


def torch_start(n, prog, env, master_port, local_world_size=None):
    """Starts n ranks like torchrun's workers; returns (worst exit status, joined output)."""
    return torch_wait(torch_spawn(n, prog, env, master_port, local_world_size))


def torch_wait(procs):
    """Waits for every rank; returns (worst exit status, joined output)."""
    end = time.monotonic() + RUN_TIMEOUT_S
    outs, status = [], 0
    for r, p in enumerate(procs):
        try:
            o, _ = p.communicate(timeout=max(1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            fail("rank %d timed out after %d s" % (r, RUN_TIMEOUT_S), "".join(outs))
        outs.append(o.decode(errors="replace"))
        if p.returncode != 0 and status == 0:
            status = p.returncode
    return status, "".join(outs)


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        sys.exit(2)
    mode, n, prog = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    env = clean_env()

    if mode == "ompi":
        launcher = shutil.which("mpirun.openmpi")
        if launcher is None:
            fail("mpirun.openmpi not installed: run scripts/deps.sh (Debian package openmpi-bin)")
        env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                    "OMPI_MCA_rmaps_base_oversubscribe": "1"})
        rc, out = run([launcher, "--allow-run-as-root", "--oversubscribe", "-np", str(n)] + prog,
                      env)
    elif mode == "mpich":
        launcher = shutil.which("mpiexec.mpich")
        if launcher is None:
            fail("mpiexec.mpich not installed: run scripts/deps.sh (Debian package mpich)")
        rc, out = run([launcher, "-n", str(n)] + prog, env)
    elif mode == "torch":
        rc, out = torch_start(n, prog, env, free_port_pair())
    elif mode == "torch-agent":
        port = free_port_pair()
        agent = socket.socket()
        agent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        agent.bind(("0.0.0.0", port))
        agent.listen(16)  # never answers, like a store that speaks another protocol
        env["TORCHELASTIC_USE_AGENT_STORE"] = "True"
        try:
            rc, out = torch_start(n, prog, env, port)
        finally:
            agent.close()
    elif mode == "slurm":
        procs = []
        for r in range(n):
            e = dict(env)
            e.update({"SLURM_PROCID": str(r), "SLURM_NTASKS": str(n), "SLURM_LOCALID": str(r),
                      "SLURM_JOB_ID": str(os.getpid()), "SLURM_STEP_ID": "0",
                      "SLURM_STEP_NUM_NODES": "1", "SLURM_NNODES": "1"})
            procs.append(subprocess.Popen(prog, env=e, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        rc, out = torch_wait(procs)
    elif mode == "torch-twojobs":
        env["WEFT_STORE_ADDR"] = "127.0.0.1:%d" % free_port_pair()
        # Interleave the two jobs' ranks so each meets the other's store at least sometimes.
        a = torch_spawn(n, prog, env, None, run_id="job-a")
        b = torch_spawn(n, prog, env, None, run_id="job-b")
        rc_a, out_a = torch_wait(a)
        rc_b, out_b = torch_wait(b)
        for name, rc, out in (("job a", rc_a, out_a), ("job b", rc_b, out_b)):
            if rc != 0:
                fail("%s: exit status %d" % (name, rc), out)
            rows = check_table(out)
            sys.stdout.write(out)
            print("%s: %d rows, every #wrong 0" % (name, rows))
        print("PASS: two jobs on one store address both completed")
        return
    elif mode == "torch-nomaster":
        t0 = time.monotonic()
        rc, out = torch_start(n, prog, env, None, local_world_size=1)
        if rc == 0:
            fail("ranks on different hosts without a store address succeeded", out)
        if "WEFT_STORE_ADDR" not in out:
            fail("the error does not tell the user to set WEFT_STORE_ADDR", out)
        if time.monotonic() - t0 > 10:
            fail("took %.1f s to fail; expected an immediate usage error" %
                 (time.monotonic() - t0), out)
        sys.stdout.write(out)
        print("PASS: failed fast with exit %d and named WEFT_STORE_ADDR" % rc)
        return
    else:
        print("unknown mode " + mode)
        sys.exit(2)

    if rc != 0:
        fail("exit status %d" % rc, out)
    rows = check_table(out)
    sys.stdout.write(out)
    print("PASS: %s, %d ranks, %d rows, every #wrong 0" % (mode, n, rows))


if __name__ == "__main__":
    main()
