#!/usr/bin/env python3
"""PyTorch on Weft: torch.distributed's nccl backend on Weft's libnccl.so.2 (issue 13, item 5).

    LD_PRELOAD=build/libnccl.so.2 python3 tests/gpu/torch_check.py --expect weft [--timing]
        [--lib build/libnccl.so.2]
    LD_PRELOAD=build/libnccl.so.2 python3 tests/gpu/torch_check.py --nproc 2 --expect weft
    python3 tests/gpu/torch_check.py --expect nvidia --timing      # the wheel's NCCL, a baseline
    python3 tests/gpu/torch_check.py --probe                       # which libnccl.so.2 torch uses
    python3 tests/gpu/torch_check.py --backend gloo [--nproc 2]    # this script's own logic, CPU

Ranks: run it under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), or give
--nproc N and it starts N copies of itself with those variables (exit 77 when every copy does);
with neither it is one rank. Every rank uses cuda:0: several processes share the one GPU (NVIDIA's
NCCL refuses that, "Duplicate GPU detected"; Weft allows it, so --nproc 2 is for Weft only).

Checks, each ending in one line on rank 0: `TORCH ok <check> ...`, `TORCH FAIL <check> ...` (with
what differed on which rank) or `TORCH skip <check> (why)`:
  library   the libnccl.so.2 that torch's calls bind to (the one that defines ncclAllReduce in
            the global scope, else in libtorch_cuda.so's own dependencies; dladdr names its file)
            is Weft (it exports weftLaunchInfo) or NVIDIA's, as --expect says, and reports the
            version torch.cuda.nccl.version() reports: a silent fall-back to NVIDIA's NCCL is a
            FAIL, not a pass.
  all_reduce (sum, avg, max, min, product), all_gather_into_tensor and reduce_scatter_tensor
            (out of place and in place), broadcast from every root, all_to_all_single (even and
            uneven splits), send/recv (batch_isend_irecv ring and blocking pairs): device tensors
            of 1 .. 4M+15 elements in float32, bfloat16 and int64, compared element by element
            with the same computation done on the CPU of every rank (each rank makes every rank's
            input from a seed). Inputs are small integers (float32: |x| <= 1000, bfloat16:
            |x| <= 8 and products of |x| <= 4; int64: |x| < 2^40), so every result is exact in its
            type whatever the reduction order: equality is the right test.
  ddp       a small MLP under DistributedDataParallel, 20 SGD steps (momentum 0.9), the global
            batch of 64 split across the ranks. Its final parameters are compared (a) bit for bit
            with the same steps done in this process without DDP the way DDP decomposes them
            (per-shard gradients of each shard's mean loss, each divided by the world size, then
            summed): DDP's only change to those numbers is the library's sum, and a sum of two
            floats is exact in any order, so equality must hold at 1 and 2 ranks (at more ranks
            the order of a float sum matters and only (b) applies); (b) with a one-process run
            on the whole global batch, within atol 1e-5 + rtol 1e-4: the two differ only by the
            rounding of the batch-dimension sums inside the gradients (float32, TF32 off; about
            1e-7 relative per step), which 20 steps of lr 0.05 keep well below that.
  timing    (--timing) all_reduce of 8 B (latency) and of 64 MiB (algbw = bytes / time; busbw =
            algbw * 2(n-1)/n as nccl-tests, 0 at one rank), each from a run of about 0.3 s after
            a warm-up, wall clock around synchronized batches: one `TORCH time lib=... ranks=...`
            line.

Exit: 0 when every check passes, 1 on any FAIL, 77 (with `SKIP: why`) when torch, its CUDA
device (nccl) or its distributed package is absent, 2 on a usage error. A torch that is there
but fails to import, or sees no CUDA device where /dev/nvidiactl exists, is a FAIL.
"""
import argparse
import ctypes
import datetime
import os
import signal
import socket
import subprocess
import sys
import time

# Deterministic cuBLAS (the ddp check's bitwise comparison): must be set before CUDA starts.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

SIZES = [1, 1027, 262147, 4194319]  # elements: 1 .. 16 MiB of float32, odd counts
SIZES_GLOO = [1, 1027, 65543]  # the CPU self-test on a small machine
DDP_STEPS = 20
DDP_BATCH = 64


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--expect", choices=["weft", "nvidia", "any"], default="weft",
                   help="which libnccl.so.2 torch must be using (default weft)")
    p.add_argument("--lib", metavar="PATH",
                   help="Weft's libnccl.so.2 that --expect weft means (default: any Weft)")
    p.add_argument("--probe", action="store_true",
                   help="only say which library is used (one all_reduce first); exit 0 if it works")
    p.add_argument("--timing", action="store_true", help="time all_reduce at 8 B and 64 MiB")
    p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl",
                   help="gloo: CPU tensors, this script's own logic without a GPU")
    p.add_argument("--nproc", type=int, default=0, help="start this many ranks as processes")
    p.add_argument("--timeout", type=float, default=120,
                   help="seconds: torch.distributed's timeout, and --nproc's limit for the job")
    return p.parse_args()


def skip(why):
    print(f"SKIP: {why}", flush=True)
    sys.exit(77)


# --- --nproc: start the ranks ------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args):
    """Starts args.nproc copies of this script as ranks; returns the job's exit status: the first
    failing rank's (the others are stopped), 77 when every rank skipped, 124 past --timeout."""
    n = args.nproc
    argv, rest = [], sys.argv[1:]
    while rest:  # the ranks' arguments: these, less "--nproc N" / "--nproc=N"
        a = rest.pop(0)
        if a == "--nproc":
            rest.pop(0)
        elif not a.startswith("--nproc="):
            argv.append(a)
    port = free_port()
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   TORCH_CHECK_CHILD="1")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv,
                                      env=env))

    def stop(signum=None, frame=None):
        for p in procs:
            if p.poll() is None:
                p.terminate()
        t_end = time.monotonic() + 5
        for p in procs:
            try:
                p.wait(timeout=max(0.1, t_end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
        if signum is not None:
            sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    deadline = time.monotonic() + args.timeout
    codes = [None] * n
    while None in codes:
        for r, p in enumerate(procs):
            if codes[r] is None:
                codes[r] = p.poll()
        bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0, 77)]
        if bad:
            r, c = bad[0]
            print(f"torch_check: rank {r} exited with {c}; stopping the others", flush=True)
            stop()
            return c if c > 0 else 128 - c
        if time.monotonic() > deadline:
            left = [r for r, c in enumerate(codes) if c is None]
            print(f"torch_check: ranks {left} still running after {args.timeout:.0f} s; "
                  "stopping them", flush=True)
            stop()
            return 124
        time.sleep(0.05)
    if all(c == 77 for c in codes):
        return 77
    if any(c == 77 for c in codes):
        print(f"torch_check: some ranks skipped, some ran: {codes}", flush=True)
        return 1
    return 0


# --- which libnccl.so.2 -------------------------------------------------------------------------

class DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def mapped_files(pattern):
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6:
                path = parts[5].strip()
                if pattern in os.path.basename(path) and path not in out:
                    out.append(path)
    return out


def nccl_binding():
    """The file that defines the ncclAllReduce torch's calls bind to, or (None, why). glibc binds
    a library's undefined symbols from the global scope first, then from the library's own
    dependencies: look in the same order."""
    libc = ctypes.CDLL(None)
    dladdr = libc.dladdr
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
    dladdr.restype = ctypes.c_int

    def file_of(fn):
        info = DlInfo()
        if dladdr(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(info)) == 0 or not info.dli_fname:
            return None
        return os.fsdecode(info.dli_fname)

    try:
        return file_of(libc.ncclAllReduce), "global scope"
    except AttributeError:
        pass
    for path in mapped_files("libtorch_cuda"):
        try:
            h = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            return file_of(h.ncclAllReduce), "libtorch_cuda.so's dependencies"
        except (OSError, AttributeError):
            continue
    return None, "ncclAllReduce is in neither the global scope nor libtorch_cuda.so's dependencies"


def library_info(torch):
    """(path, is_weft, version code, backend, details) of the library torch uses."""
    path, where = nccl_binding()
    if path is None:
        return None, False, None, None, where
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        lib = ctypes.CDLL(path)
    is_weft = hasattr(lib, "weftLaunchInfo")
    code = ctypes.c_int(0)
    version = code.value if lib.ncclGetVersion(ctypes.byref(code)) == 0 else None
    backend = None
    if is_weft:
        lib.weftCudaBackend.restype = ctypes.c_char_p
        backend = lib.weftCudaBackend().decode()
    tv = torch.cuda.nccl.version()
    tcode = tv[0] * 10000 + tv[1] * 100 + tv[2] if isinstance(tv, tuple) else int(tv)
    others = [p for p in mapped_files("libnccl") if os.path.realpath(p) != os.path.realpath(path)]
    details = (f"file={os.path.realpath(path)} (bound from {where})"
               f" weft={'yes' if is_weft else 'no'}"
               f" version={version} torch.cuda.nccl.version={tcode}"
               + (f" backend={backend}" if backend else "")
               + (f" also_mapped={','.join(others)}" if others else ""))
    if version != tcode:
        details += " MISMATCH: torch reports another version than the library found"
        return path, is_weft, None, backend, details
    return path, is_weft, version, backend, details


# --- checks -------------------------------------------------------------------------------------

class Checks:
    def __init__(self, torch, dist, rank, world, dev, ctl, gloo):
        self.torch, self.dist = torch, dist
        self.rank, self.world, self.dev, self.ctl, self.gloo = rank, world, dev, ctl, gloo
        self.failed = 0
        self.seed = 0

    def say(self, line):
        if self.rank == 0:
            print(line, flush=True)

    def report(self, name, ok, detail=""):
        """One line for a check done on every rank: ok only if ok on all of them."""
        got = [None] * self.world
        self.dist.all_gather_object(got, (bool(ok), detail), group=self.ctl)
        if all(o for o, _ in got):
            self.say(f"TORCH ok {name} {got[0][1]}".rstrip())
            return True
        self.failed += 1
        self.say(f"TORCH FAIL {name}: " + "; ".join(f"rank {r}: {d}" for r, (o, d) in
                                                    enumerate(got) if not o))
        return False

    def run(self, name, fn, *a):
        """Runs fn (which returns a list of what differed) on every rank and reports it."""
        try:
            bad = fn(*a)
            detail = "; ".join(bad[:4]) + (f" (+{len(bad) - 4} more)" if len(bad) > 4 else "")
            return self.report(name, not bad, detail if bad else "")
        except Exception as e:  # a library error is a FAIL of this check, not a crash
            if self.gloo and ("does not support" in str(e) or "no support" in str(e)):
                self.say(f"TORCH skip {name} (gloo: {str(e).splitlines()[0]})")
                return True
            return self.report(name, False, f"{type(e).__name__}: {str(e).splitlines()[0]}")

    # Inputs: rank r's values for a check are a pure function of (seed, r), so any rank can make
    # any rank's input. Small integers keep every sum, product and average exact (see the top).
    def gen(self, seed, r, n, dtype, small=False):
        torch = self.torch
        g = torch.Generator().manual_seed(seed * 1009 + r)
        if dtype is torch.int64:
            hi = 4 if small else 1 << 40
        elif dtype is torch.bfloat16:
            hi = 4 if small else 8
        else:
            hi = 4 if small else 1000
        return torch.randint(-hi, hi + 1, (n,), generator=g, dtype=torch.int64).to(dtype)

    def next_seed(self):
        self.seed += 1
        return self.seed

    def diff(self, n, got, exp):
        got = got.cpu()
        if got.shape != exp.shape:
            return f"n={n}: shape {tuple(got.shape)} != {tuple(exp.shape)}"
        if got.dtype != exp.dtype:
            return f"n={n}: dtype {got.dtype} != {exp.dtype}"
        if self.torch.equal(got, exp):
            return None
        wrong = (got != exp).nonzero().flatten()
        i = int(wrong[0])
        return (f"n={n}: {wrong.numel()} wrong, first [{i}] = {got[i].item()} "
                f"expected {exp[i].item()}")

    def reduce(self, inputs, op, dtype):
        """The expected reduction of inputs (a list, one per rank), computed in float64/int64."""
        torch, RO = self.torch, self.dist.ReduceOp
        wide = torch.int64 if dtype is torch.int64 else torch.float64
        s = torch.stack([x.to(wide) for x in inputs])
        if op == RO.SUM:
            out = s.sum(0)
        elif op == RO.AVG:
            out = s.sum(0) / len(inputs)
        elif op == RO.MAX:
            out = s.amax(0)
        elif op == RO.MIN:
            out = s.amin(0)
        else:
            out = s.prod(0)
        return out.to(dtype)

    def dtypes(self):
        t = self.torch
        if self.gloo:  # gloo has no bfloat16
            return [("float32", t.float32), ("int64", t.int64)]
        return [("float32", t.float32), ("bfloat16", t.bfloat16), ("int64", t.int64)]

    def ops(self, dtype):
        RO = self.dist.ReduceOp
        ops = [("sum", RO.SUM), ("max", RO.MAX), ("min", RO.MIN), ("product", RO.PRODUCT)]
        if dtype is not self.torch.int64 and not self.gloo:  # gloo has no AVG
            ops.insert(1, ("avg", RO.AVG))
        return ops

    def check_all_reduce(self, sizes):
        for dname, dt in self.dtypes():
            for oname, op in self.ops(dt):
                def one():
                    bad, seed = [], self.next_seed()
                    small = oname == "product"
                    for n in sizes:
                        x = self.gen(seed, self.rank, n, dt, small).to(self.dev)
                        self.dist.all_reduce(x, op=op)
                        exp = self.reduce([self.gen(seed, r, n, dt, small)
                                           for r in range(self.world)], op, dt)
                        d = self.diff(n, x, exp)
                        if d:
                            bad.append(d)
                    return bad
                self.run(f"all_reduce {dname} {oname}", one)

    def check_all_gather(self, sizes):
        torch, W, R = self.torch, self.world, self.rank
        for dname, dt in self.dtypes():
            for inplace in (False, True):
                def one():
                    bad, seed = [], self.next_seed()
                    for n in sizes:
                        out = torch.full((W * n,), -7, dtype=dt, device=self.dev)
                        mine = self.gen(seed, R, n, dt).to(self.dev)
                        if inplace:
                            out[R * n:(R + 1) * n].copy_(mine)
                            mine = out[R * n:(R + 1) * n]
                        self.dist.all_gather_into_tensor(out, mine)
                        exp = torch.cat([self.gen(seed, r, n, dt) for r in range(W)])
                        d = self.diff(n, out, exp)
                        if d:
                            bad.append(d)
                    return bad
                self.run(f"all_gather_into_tensor {dname}{' in-place' if inplace else ''}", one)

    def check_reduce_scatter(self, sizes):
        torch, RO, W, R = self.torch, self.dist.ReduceOp, self.world, self.rank
        for dname, dt in self.dtypes():
            for oname, op, inplace in (("sum", RO.SUM, False), ("sum", RO.SUM, True),
                                       ("max", RO.MAX, False)):
                def one():
                    bad, seed = [], self.next_seed()
                    for n in sizes:
                        inp = self.gen(seed, R, W * n, dt).to(self.dev)
                        if inplace:
                            out = inp[R * n:(R + 1) * n]
                        else:
                            out = torch.full((n,), -7, dtype=dt, device=self.dev)
                        self.dist.reduce_scatter_tensor(out, inp, op=op)
                        full = self.reduce([self.gen(seed, r, W * n, dt) for r in range(W)], op,
                                           dt)
                        d = self.diff(n, out, full[R * n:(R + 1) * n])
                        if d:
                            bad.append(d)
                    return bad
                self.run(f"reduce_scatter_tensor {dname} {oname}"
                         f"{' in-place' if inplace else ''}", one)

    def check_broadcast(self, sizes):
        torch, W, R = self.torch, self.world, self.rank
        for dname, dt in self.dtypes():
            def one():
                bad, seed = [], self.next_seed()
                for root in range(W):
                    for n in sizes:
                        if R == root:
                            x = self.gen(seed, root, n, dt).to(self.dev)
                        else:
                            x = torch.full((n,), -7, dtype=dt, device=self.dev)
                        self.dist.broadcast(x, src=root)
                        d = self.diff(n, x, self.gen(seed, root, n, dt))
                        if d:
                            bad.append(f"root {root} {d}")
                return bad
            self.run(f"broadcast {dname} (every root)", one)

    def check_all_to_all(self, sizes):
        torch, W, R = self.torch, self.world, self.rank
        for dname, dt in self.dtypes():
            def even():
                bad, seed = [], self.next_seed()
                for n in sizes:
                    inp = self.gen(seed, R, W * n, dt).to(self.dev)
                    out = torch.full((W * n,), -7, dtype=dt, device=self.dev)
                    self.dist.all_to_all_single(out, inp)
                    exp = torch.cat([self.gen(seed, s, W * n, dt)[R * n:(R + 1) * n]
                                     for s in range(W)])
                    d = self.diff(n, out, exp)
                    if d:
                        bad.append(d)
                return bad

            def uneven():
                # rank s sends split(s, d) elements to rank d, a different count per pair
                bad, seed = [], self.next_seed()
                for n in sizes:
                    def split(s, d):
                        return n + (s * 7 + d * 3) % 5

                    def offset(s, d):
                        return sum(split(s, k) for k in range(d))
                    total = [offset(s, W) for s in range(W)]
                    inp = self.gen(seed, R, total[R], dt).to(self.dev)
                    outn = sum(split(s, R) for s in range(W))
                    out = torch.full((outn,), -7, dtype=dt, device=self.dev)
                    self.dist.all_to_all_single(out, inp,
                                                output_split_sizes=[split(s, R) for s in range(W)],
                                                input_split_sizes=[split(R, d) for d in range(W)])
                    exp = torch.cat([self.gen(seed, s, total[s], dt)[offset(s, R):
                                                                     offset(s, R) + split(s, R)]
                                     for s in range(W)])
                    d = self.diff(n, out, exp)
                    if d:
                        bad.append(d)
                return bad
            self.run(f"all_to_all_single {dname}", even)
            self.run(f"all_to_all_single {dname} uneven", uneven)

    def check_send_recv(self, sizes):
        torch, dist, W, R = self.torch, self.dist, self.world, self.rank
        if W < 2:
            self.say("TORCH skip send_recv (one rank: torch refuses a send to itself)")
            return
        nxt, prv = (R + 1) % W, (R - 1) % W
        for dname, dt in self.dtypes():
            def ring():
                bad, seed = [], self.next_seed()
                for n in sizes:
                    mine = self.gen(seed, R, n, dt).to(self.dev)
                    got = torch.full((n,), -7, dtype=dt, device=self.dev)
                    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, nxt),
                                                   dist.P2POp(dist.irecv, got, prv)])
                    for q in reqs:
                        q.wait()
                    d = self.diff(n, got, self.gen(seed, prv, n, dt))
                    if d:
                        bad.append(d)
                return bad

            def pairs():
                # blocking calls: even ranks send to the next then receive from the previous,
                # odd ranks the other way round (no cycle of waiting sends)
                bad, seed = [], self.next_seed()
                for n in sizes:
                    mine = self.gen(seed, R, n, dt).to(self.dev)
                    got = torch.full((n,), -7, dtype=dt, device=self.dev)
                    if R % 2 == 0:
                        dist.send(mine, nxt)
                        dist.recv(got, prv)
                    else:
                        dist.recv(got, prv)
                        dist.send(mine, nxt)
                    if self.dev.type == "cuda":
                        torch.cuda.synchronize()
                    d = self.diff(n, got, self.gen(seed, prv, n, dt))
                    if d:
                        bad.append(d)
                return bad
            self.run(f"send_recv {dname} batch_isend_irecv ring", ring)
            if W % 2 == 0:
                self.run(f"send_recv {dname} blocking pairs", pairs)

    def check_ddp(self):
        torch, W, R = self.torch, self.world, self.rank
        nn = torch.nn
        from torch.nn.parallel import DistributedDataParallel as DDP

        def model():
            torch.manual_seed(1234)
            return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                                 nn.Linear(64, 8)).to(self.dev)

        def sgd(m):
            return torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        g = torch.Generator().manual_seed(99)
        xs = torch.randn(DDP_STEPS, DDP_BATCH, 32, generator=g).to(self.dev)
        ys = torch.randn(DDP_STEPS, DDP_BATCH, 8, generator=g).to(self.dev)
        b = DDP_BATCH // W
        loss_fn = nn.functional.mse_loss

        def ddp_run():
            m = model()
            # small buckets: several all-reduces per step, not one
            d = DDP(m, device_ids=[0] if self.dev.type == "cuda" else None, bucket_cap_mb=0.01)
            opt = sgd(d)
            for s in range(DDP_STEPS):
                opt.zero_grad()
                loss_fn(d(xs[s, R * b:(R + 1) * b]), ys[s, R * b:(R + 1) * b]).backward()
                opt.step()
            return [p.detach().clone() for p in m.parameters()]

        def decomposed_run():
            m = model()
            opt = sgd(m)
            for s in range(DDP_STEPS):
                avg = None
                for r in range(W):
                    m.zero_grad()
                    loss_fn(m(xs[s, r * b:(r + 1) * b]), ys[s, r * b:(r + 1) * b]).backward()
                    gr = [p.grad / W for p in m.parameters()]
                    avg = gr if avg is None else [a + x for a, x in zip(avg, gr)]
                for p, a in zip(m.parameters(), avg):
                    p.grad = a
                opt.step()
            return [p.detach().clone() for p in m.parameters()]

        def global_run():
            m = model()
            opt = sgd(m)
            for s in range(DDP_STEPS):
                opt.zero_grad()
                loss_fn(m(xs[s]), ys[s]).backward()
                opt.step()
            return [p.detach().clone() for p in m.parameters()]

        def one():
            got = ddp_run()
            bad = []
            ref = decomposed_run()
            maxd = max(float((a - x).abs().max()) for a, x in zip(got, ref))
            if W <= 2 and not all(torch.equal(a, x) for a, x in zip(got, ref)):
                bad.append(f"not bit-equal to the decomposed steps: max |diff| {maxd:.3g}")
            ref = global_run()
            maxg = max(float((a - x).abs().max()) for a, x in zip(got, ref))
            if not all(torch.allclose(a, x, rtol=1e-4, atol=1e-5) for a, x in zip(got, ref)):
                bad.append(f"one-process global batch: max |diff| {maxg:.3g} over tolerance")
            self.ddp_detail = (f"steps={DDP_STEPS} batch={DDP_BATCH} decomposed_maxdiff={maxd:.3g}"
                               f"{' (bitwise)' if W <= 2 else ''} global_maxdiff={maxg:.3g}")
            return bad
        self.ddp_detail = ""
        if self.run("ddp", one) and self.ddp_detail:
            self.say(f"TORCH info ddp {self.ddp_detail}")

    def timing(self, lib):
        torch, dist, W = self.torch, self.dist, self.world
        cuda = self.dev.type == "cuda"

        def sync():
            if cuda:
                torch.cuda.synchronize()

        def per_op(nbytes):
            x = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=self.dev)

            def run(k):
                dist.barrier(group=self.ctl)
                sync()
                t0 = time.perf_counter()
                for _ in range(k):
                    dist.all_reduce(x)
                sync()
                return time.perf_counter() - t0
            run(5)  # warm-up
            t = run(10) / 10
            # every rank must run the same count: rank 0's estimate for 0.3 s decides
            k = [max(10, min(20000, int(0.3 / max(t, 1e-7))))]
            dist.broadcast_object_list(k, src=0, group=self.ctl)
            return run(k[0]) / k[0]
        lat = per_op(8)
        big = 64 << 20
        t = per_op(big)
        algbw = big / t / 1e9
        busbw = algbw * 2 * (W - 1) / W
        self.say(f"TORCH time lib={lib} ranks={W} allreduce_8B_us={lat * 1e6:.2f} "
                 f"allreduce_64MiB_us={t * 1e6:.1f} algbw_GBs={algbw:.2f} busbw_GBs={busbw:.2f}")


def main():
    args = parse_args()
    if args.nproc:
        if "RANK" in os.environ and "TORCH_CHECK_CHILD" not in os.environ:
            print("torch_check: --nproc under a launcher that already set RANK", flush=True)
            return 2
        return launch(args)
    if os.environ.get("TORCH_CHECK_CHILD"):
        # do not outlive the launcher (a killed launcher must not leave ranks on the GPU)
        try:
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (AttributeError, OSError):
            pass
    try:
        import torch
        import torch.distributed as dist
    except ModuleNotFoundError as e:
        skip(f"no torch ({e})")
    except Exception as e:  # torch is there but does not load (a symbol the library lacks?)
        print(f"TORCH FAIL import torch: {type(e).__name__}: {e}", flush=True)
        return 1
    gloo = args.backend == "gloo"
    if not dist.is_available():
        skip(f"torch {torch.__version__} has no torch.distributed")
    if gloo:
        if not dist.is_gloo_available():
            skip(f"torch {torch.__version__} has no gloo")
        dev = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            if os.path.exists("/dev/nvidiactl"):  # a GPU machine: not a reason to skip
                print(f"TORCH FAIL cuda: torch {torch.__version__} sees no CUDA device, but "
                      "/dev/nvidiactl exists", flush=True)
                return 1
            skip(f"torch {torch.__version__} sees no CUDA device")
        if not dist.is_nccl_available():
            skip(f"torch {torch.__version__} has no nccl backend")
        torch.cuda.set_device(0)
        dev = torch.device("cuda", 0)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.use_deterministic_algorithms(True, warn_only=True)
    if "RANK" not in os.environ:  # one rank of its own
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=args.timeout)
    dist.init_process_group(args.backend, rank=rank, world_size=world, timeout=timeout)
    ctl = dist.new_group(backend="gloo", timeout=timeout) if not gloo else dist.group.WORLD
    c = Checks(torch, dist, rank, world, dev, ctl, gloo)
    c.say(f"TORCH info torch={torch.__version__} backend={args.backend} ranks={world} "
          f"device={torch.cuda.get_device_name(0) if not gloo else 'cpu'}")

    # the first call starts the library; then which one is it?
    x = torch.full((4,), float(rank + 1), device=dev)
    dist.all_reduce(x)
    ok = torch.equal(x.cpu(), torch.full((4,), float(world * (world + 1) // 2)))
    lib = "gloo"
    if gloo:
        c.say("TORCH skip library (gloo: no NCCL)")
    else:
        path, is_weft, version, backend, details = library_info(torch)
        lib = "weft" if is_weft else "nvidia"
        expect = args.expect if not args.probe else "any"
        want = {"weft": is_weft, "nvidia": path is not None and not is_weft,
                "any": path is not None}[expect]
        if expect == "weft" and is_weft and backend != "cuda":
            want = False  # Weft without its GPU backend could not have run device tensors
            details += " (Weft's CUDA backend is not the active one)"
        if args.lib and path is not None:
            same = os.path.realpath(path) == os.path.realpath(args.lib)
            details += f" is_lib={'yes' if same else 'no'}"
            if expect == "weft" and not same:
                want = False
                details += f" (not {os.path.realpath(args.lib)})"
        c.report(f"library (expect {expect})", want and version is not None, details)
    c.report("first all_reduce", ok, "" if ok else f"got {x.cpu().tolist()}")
    if not args.probe:
        sizes = SIZES_GLOO if gloo else SIZES
        c.check_all_reduce(sizes)
        c.check_all_gather(sizes)
        c.check_reduce_scatter(sizes)
        c.check_broadcast(sizes)
        c.check_all_to_all(sizes)
        c.check_send_recv(sizes)
        c.check_ddp()
        if args.timing:
            c.timing(lib)
    c.say(f"TORCH {'FAIL' if c.failed else 'ok'} summary: {c.failed} checks failed")
    dist.barrier(group=ctl)
    dist.destroy_process_group()
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
