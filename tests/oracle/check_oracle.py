#!/usr/bin/python3
"""Check a loom dump against the PyTorch GPT-2 oracle (DESIGN invariant 2).

usage: check_oracle.py DUMP.safetensors [--tol 1e-5]

The dump (written by loom's oracle test program) holds the config and AdamW
hyper-parameters as metadata, one batch of tokens, loom's initial parameters,
its logits and loss, its gradient of the mean loss for every parameter, and its
parameters after one AdamW step (no clipping). This script

  1. builds the torch model in float64 from param.*, and compares loom's
     out.logits, out.loss and every grad.* with torch's forward and autograd;
  2. runs torch.optim.AdamW in float32 from param.* with .grad = loom's grad.*
     (decay only on ndim >= 2) for one step, and compares with step.*.

Error per tensor: max|loom - torch| / max|torch| (absolute if torch is all 0).
Prints one line per tensor and a final "N passed, M failed".
Exit 0 if all pass, 1 if any fails, 2 if the dump is missing or malformed.
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402
import torch_gpt2  # noqa: E402

INT_KEYS = ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions", "B", "T")
FLOAT_KEYS = ("lr", "beta1", "beta2", "eps", "weight_decay")
# Mixture-of-experts keys (optional; absent: a dense model)
MOE_KEYS = {"n_expert": int, "top_k": int, "moe_every": int, "expert_hidden": int,
            "norm_topk": int, "aux_coef": float, "z_coef": float, "capacity_factor": float}


class DumpError(Exception):
    pass


def rel_err(loom, ref):
    """max|loom - ref| / max|ref|; absolute if ref is all zero; inf if not finite."""
    loom = np.asarray(loom, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if loom.size == 0:
        return 0.0
    if not np.all(np.isfinite(loom)):
        return float("inf")
    diff = float(np.max(np.abs(loom - ref)))
    denom = float(np.max(np.abs(ref)))
    return diff / denom if denom > 0 else diff


def parse_meta(meta):
    out = {}
    for k in INT_KEYS + FLOAT_KEYS:
        if k not in meta:
            raise DumpError("metadata lacks %r" % k)
        try:
            out[k] = int(meta[k]) if k in INT_KEYS else float(meta[k])
        except ValueError:
            raise DumpError("metadata %s=%r is not a%s" % (k, meta[k], "n integer" if k in INT_KEYS else " number"))
    moe = {}
    for k, conv in MOE_KEYS.items():
        if k in meta:
            try:
                moe[k] = conv(meta[k])
            except ValueError:
                raise DumpError("metadata %s=%r is not a number" % (k, meta[k]))
    if "norm_topk" in moe:
        moe["norm_topk"] = bool(moe["norm_topk"])
    out["moe"] = moe
    return out


def need(tensors, name, shape, dtype):
    if name not in tensors:
        raise DumpError("dump lacks tensor %r %s" % (name, tuple(shape)))
    a = tensors[name]
    if tuple(a.shape) != tuple(shape):
        raise DumpError("tensor %r has shape %s, expected %s" % (name, tuple(a.shape), tuple(shape)))
    if a.dtype != dtype:
        raise DumpError("tensor %r has dtype %s, expected %s" % (name, a.dtype, np.dtype(dtype)))
    return a


def load_dump(path):
    """Return (cfg, meta, tensors); raise DumpError naming what is wrong."""
    if not os.path.isfile(path):
        raise DumpError("no such file: %s" % path)
    try:
        tensors, meta = st.load(path)
    except (OSError, ValueError) as e:
        raise DumpError(str(e))
    try:
        return _check_dump(tensors, meta)
    except DumpError as e:
        raise DumpError("%s: %s" % (path, e))


def _check_dump(tensors, meta):
    m = parse_meta(meta)
    cfg = torch_gpt2.Config(m["n_layer"], m["n_head"], m["n_embd"], m["vocab_size"], m["n_positions"],
                            **m["moe"])
    try:
        cfg.check()
    except ValueError as e:
        raise DumpError("bad config: %s" % e)
    B, T, V = m["B"], m["T"], cfg.vocab_size
    if B <= 0 or T <= 0 or T > cfg.n_positions:
        raise DumpError("need B > 0 and 0 < T <= n_positions; got B=%d T=%d n_positions=%d"
                        % (B, T, cfg.n_positions))
    for k in ("tokens.inputs", "tokens.targets"):
        tok = need(tensors, k, (B, T), np.int32)
        if tok.min() < 0 or tok.max() >= V:
            raise DumpError("%s has values in [%d, %d], outside [0, vocab_size=%d)" % (k, tok.min(), tok.max(), V))
    need(tensors, "out.logits", (B, T, V), np.float32)
    if "out.loss" in tensors and tensors["out.loss"].shape == ():  # accept a scalar too
        tensors["out.loss"] = tensors["out.loss"].reshape(1)
    need(tensors, "out.loss", (1,), np.float32)
    for name, shape in torch_gpt2.param_shapes(cfg).items():
        for kind in ("param.", "grad.", "step."):
            need(tensors, kind + name, shape, np.float32)
    return cfg, m, tensors


def reference_fwd_bwd(cfg, tensors):
    """float64 torch logits, loss and {name: grad} from the dump's param.* and tokens."""
    names = list(torch_gpt2.param_shapes(cfg))
    params = torch_gpt2.params_from_numpy({n: tensors["param." + n] for n in names}, cfg, torch.float64)
    idx = torch.from_numpy(tensors["tokens.inputs"].astype(np.int64))
    tgt = torch.from_numpy(tensors["tokens.targets"].astype(np.int64))
    moe_stats = []
    logits, loss = torch_gpt2.forward(params, cfg, idx, tgt, moe_stats)
    loss.backward()
    grads = {n: params[n].grad.numpy() if params[n].grad is not None else np.zeros(params[n].shape)
             for n in names}
    return logits.detach().numpy(), np.array([loss.item()]), grads, moe_stats


def reference_step(cfg, m, tensors):
    """float32 torch AdamW step from param.* with loom's grad.*; {name: new param}."""
    names = list(torch_gpt2.param_shapes(cfg))
    params = torch_gpt2.params_from_numpy({n: tensors["param." + n] for n in names}, cfg, torch.float32)
    for n in names:
        params[n].grad = torch.from_numpy(tensors["grad." + n].copy())
    opt = torch_gpt2.make_adamw(params, m["lr"], (m["beta1"], m["beta2"]), m["eps"], m["weight_decay"])
    opt.step()
    return {n: params[n].detach().numpy() for n in names}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dump", help="safetensors file written by loom's oracle test")
    ap.add_argument("--tol", type=float, default=1e-5, help="max-norm relative error bound (default 1e-5)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    try:
        cfg, m, tensors = load_dump(args.dump)
    except DumpError as e:
        print("check_oracle: bad dump: %s" % e, file=sys.stderr)
        return 2
    print("config: n_layer=%d n_head=%d n_embd=%d vocab_size=%d n_positions=%d B=%d T=%d"
          % (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size, cfg.n_positions, m["B"], m["T"]))
    print("adamw: lr=%g betas=(%g, %g) eps=%g weight_decay=%g; tol=%g"
          % (m["lr"], m["beta1"], m["beta2"], m["eps"], m["weight_decay"], args.tol))

    logits, loss, grads, moe_stats = reference_fwd_bwd(cfg, tensors)
    stepped = reference_step(cfg, m, tensors)
    checks = [("out.logits", tensors["out.logits"], logits), ("out.loss", tensors["out.loss"], loss)]
    checks += [("grad." + n, tensors["grad." + n], g) for n, g in grads.items()]
    checks += [("step." + n, tensors["step." + n], p) for n, p in stepped.items()]

    passed = failed = 0
    # MoE routing: loom's per-expert counts (chosen, kept after capacity) are torch's exactly
    moe_layers = [i for i in range(cfg.n_layer) if cfg.is_moe(i)]
    for layer, ref in zip(moe_layers, moe_stats):
        for what in ("chosen", "kept"):
            name = "moe.h.%d.%s" % (layer, what)
            ok = name in tensors and np.array_equal(tensors[name].astype(np.int64), ref[what])
            print("%s  loom %s torch %s  %s" % (name, tensors[name].tolist() if name in tensors else None,
                                                ref[what].tolist(), "ok" if ok else "FAIL"))
            passed += ok
            failed += not ok
        dropped = int(ref["chosen"].sum() - ref["kept"].sum())
        ok = (dropped > 0) == (cfg.capacity_factor > 0)  # a capacity test must drop something
        print("moe.h.%d dropped %d choices (capacity_factor %g)  %s"
              % (layer, dropped, cfg.capacity_factor, "ok" if ok else "FAIL"))
        passed += ok
        failed += not ok
    width = max(len(c[0]) for c in checks)
    for name, loom, ref in checks:
        err = rel_err(loom, ref)
        ok = err <= args.tol  # False for nan
        passed += ok
        failed += not ok
        print("%-*s  %.3e  %s" % (width, name, err, "ok" if ok else "FAIL"))
    print("torch loss %.8f, loom loss %.8f" % (loss[0], float(tensors["out.loss"][0])))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
