#!/usr/bin/env python3
"""torch_oracle.py DIR -- checks weft-train against the same GPT-2 written in PyTorch.

DIR is what `weft-train --dump DIR` writes:
  config.txt   key=value lines: layers, channels, heads, vocab, seq, experts, batch (global
               sequences per step), steps, lr, beta1, beta2, eps, weight_decay (optional: clip,
               the global gradient-norm clip, 0 for none)
  params0.bin  float32 initial parameters in the canonical order of tools/train/train.h
  tokens.bin   int32; per step: batch*seq tokens, then batch*seq targets
  losses.txt   lines "step loss" of weft-train's run
  grads0.bin   float32 canonical gradient of the mean loss at step 0

The model is built from plain tensors (float32 on the CPU): tied token embedding, position
embedding, per block LayerNorm (eps 1e-5), causal self-attention with fused QKV (rows [Q; K; V],
heads contiguous inside each), tanh-GeLU MLP, final LayerNorm, logits = x . wte^T, mean
cross-entropy over batch*seq tokens. Linear weights are (out, in) as nn.Linear stores them.
Optimizer: torch.optim.AdamW on every tensor (weft-train decays every parameter too).

Checks: the step-0 gradient of every tensor (max abs diff <= 1e-5 + 1e-4 * max|g|) and the loss
of every step (|diff| <= 1e-4). Prints a table and PASS or FAIL. Exit 0 pass, 1 fail, 77 skip
(torch missing, or a mixture-of-experts model, which the oracle does not build).
"""
import math
import os
import struct
import sys

GRAD_ATOL = 1e-5
GRAD_RTOL = 1e-4
LOSS_ATOL = 1e-4

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("SKIP: python3 cannot import torch (install python3-torch)")
    sys.exit(77)


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def read_config(path):
    cfg = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            key, val = line.split("=", 1)
            cfg[key.strip()] = val.strip()
    need = ["layers", "channels", "heads", "vocab", "seq", "experts", "batch", "steps", "lr",
            "beta1", "beta2", "eps", "weight_decay"]
    missing = [k for k in need if k not in cfg]
    if missing:
        fail("config.txt lacks " + ", ".join(missing))
    out = {k: int(cfg[k]) for k in ["layers", "channels", "heads", "vocab", "seq", "experts",
                                    "batch", "steps"]}
    for k in ["lr", "beta1", "beta2", "eps", "weight_decay"]:
        out[k] = float(cfg[k])
    out["clip"] = float(cfg.get("clip", "0"))
    ignored = sorted(set(cfg) - set(need) - {"clip"})
    if ignored:
        print("note: config keys not used by the oracle: " + ", ".join(ignored))
    return out


def canonical_shapes(c):
    """(name, shape) in the canonical order of train.h (dense model)."""
    L, C, V, T = c["layers"], c["channels"], c["vocab"], c["seq"]
    shapes = [("WTE", (V, C)), ("WPE", (T, C))]
    for l in range(L):
        for name, shape in [("LN1W", (C,)), ("LN1B", (C,)), ("QKVW", (3 * C, C)),
                            ("QKVB", (3 * C,)), ("ATTPROJW", (C, C)), ("ATTPROJB", (C,)),
                            ("LN2W", (C,)), ("LN2B", (C,)), ("FCW", (4 * C, C)),
                            ("FCB", (4 * C,)), ("FCPROJW", (C, 4 * C)), ("FCPROJB", (C,))]:
            shapes.append(("%s[%d]" % (name, l), shape))
    shapes += [("LNFW", (C,)), ("LNFB", (C,))]
    return shapes


def read_floats(path, count):
    size = os.path.getsize(path)
    if size != 4 * count:
        fail("%s is %d bytes, expected %d (%d float32)" % (path, size, 4 * count, count))
    with open(path, "rb") as f:
        data = f.read()
    return torch.tensor(struct.unpack("<%df" % count, data), dtype=torch.float32)


def split(flat, shapes):
    out, off = {}, 0
    for name, shape in shapes:
        n = math.prod(shape)
        out[name] = flat[off:off + n].view(shape).clone()
        off += n
    return out


def forward(p, c, tokens, targets):
    B, T, C, NH, L = tokens.shape[0], c["seq"], c["channels"], c["heads"], c["layers"]
    hs = C // NH
    x = p["WTE"][tokens] + p["WPE"][:T].unsqueeze(0)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(L):
        g = lambda n: p["%s[%d]" % (n, l)]
        h = F.layer_norm(x, (C,), g("LN1W"), g("LN1B"), eps=1e-5)
        qkv = h @ g("QKVW").t() + g("QKVB")
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ g("ATTPROJW").t() + g("ATTPROJB")
        h = F.layer_norm(x, (C,), g("LN2W"), g("LN2B"), eps=1e-5)
        f = F.gelu(h @ g("FCW").t() + g("FCB"), approximate="tanh")
        x = x + f @ g("FCPROJW").t() + g("FCPROJB")
    x = F.layer_norm(x, (C,), p["LNFW"], p["LNFB"], eps=1e-5)
    logits = x @ p["WTE"].t()
    return F.cross_entropy(logits.reshape(-1, c["vocab"]), targets.reshape(-1))


def read_losses(path):
    rows = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and not line.lstrip().startswith("#"):
                rows.append((int(parts[0]), float(parts[1])))
    rows.sort()
    return rows


def main():
    if len(sys.argv) != 2:
        print("usage: torch_oracle.py DUMP_DIR")
        return 2
    d = sys.argv[1]
    c = read_config(os.path.join(d, "config.txt"))
    if c["experts"] > 0:
        print("SKIP experts: the oracle builds the dense MLP only (experts=%d)" % c["experts"])
        return 77
    if c["channels"] % c["heads"] != 0:
        fail("channels %d not a multiple of heads %d" % (c["channels"], c["heads"]))
    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    shapes = canonical_shapes(c)
    P = sum(math.prod(s) for _, s in shapes)
    print("model: L=%d C=%d NH=%d V=%d T=%d, %d parameters; batch %d, %d steps" %
          (c["layers"], c["channels"], c["heads"], c["vocab"], c["seq"], P, c["batch"],
           c["steps"]))

    params = split(read_floats(os.path.join(d, "params0.bin"), P), shapes)
    weft_grads = split(read_floats(os.path.join(d, "grads0.bin"), P), shapes)
    B, T, steps = c["batch"], c["seq"], c["steps"]
    n_tok = os.path.getsize(os.path.join(d, "tokens.bin")) // 4
    if n_tok != steps * 2 * B * T:
        fail("tokens.bin holds %d int32, expected %d (steps x 2 x batch x seq)" %
             (n_tok, steps * 2 * B * T))
    with open(os.path.join(d, "tokens.bin"), "rb") as f:
        tok_all = torch.tensor(struct.unpack("<%di" % n_tok, f.read()), dtype=torch.int64)
    tok_all = tok_all.view(steps, 2, B, T)
    if tok_all.min() < 0 or tok_all.max() >= c["vocab"]:
        fail("token ids outside [0, vocab)")
    weft_losses = read_losses(os.path.join(d, "losses.txt"))

    leaves = [params[name].requires_grad_(True) for name, _ in shapes]
    opt = torch.optim.AdamW(leaves, lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"],
                            weight_decay=c["weight_decay"])
    ok = True
    torch_losses = []
    for step in range(steps):
        opt.zero_grad(set_to_none=False)
        loss = forward(params, c, tok_all[step, 0], tok_all[step, 1])
        loss.backward()
        torch_losses.append(loss.item())
        if step == 0:
            print("\nstep-0 gradient (tolerance %g + %g * max|g|)" % (GRAD_ATOL, GRAD_RTOL))
            print("%-14s %-12s %12s %12s %s" % ("tensor", "shape", "max|diff|", "max|g|", ""))
            for name, shape in shapes:
                g = params[name].grad
                diff = (g - weft_grads[name]).abs().max().item()
                gmax = g.abs().max().item()
                good = diff <= GRAD_ATOL + GRAD_RTOL * gmax and math.isfinite(diff)
                ok &= good
                print("%-14s %-12s %12.3e %12.3e %s" % (name, "x".join(map(str, shape)), diff,
                                                        gmax, "" if good else "FAIL"))
        if c["clip"] > 0:
            norm = math.sqrt(sum(float((t.grad.double() ** 2).sum()) for t in leaves))
            if norm > c["clip"]:
                scale = torch.tensor(c["clip"] / norm, dtype=torch.float32)
                for t in leaves:
                    t.grad.mul_(scale)
        opt.step()

    print("\nlosses (tolerance %g)" % LOSS_ATOL)
    print("%5s %12s %12s %12s" % ("step", "weft", "torch", "|diff|"))
    if len(weft_losses) != steps:
        print("losses.txt has %d lines, expected %d" % (len(weft_losses), steps))
        ok = False
    for i, (s, wl) in enumerate(weft_losses[:steps]):
        diff = abs(wl - torch_losses[i])
        good = diff <= LOSS_ATOL
        ok &= good
        print("%5d %12.6f %12.6f %12.3e %s" % (s, wl, torch_losses[i], diff,
                                               "" if good else "FAIL"))
    print("\n" + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
