#!/usr/bin/python3
"""Write an oracle dump whose "loom" is the torch model in float32.

usage: make_fake_dump.py OUT.safetensors [--perturb-grad NAME [--perturb-rel R]]
                         [--drop TENSOR] [--n-layer L --n-head NH --n-embd C
                          --vocab V --n-positions P -B B -T T] [--seed S]

The file has exactly the layout loom's oracle test writes (see check_oracle.py).
--perturb-grad adds R * max|g| to one element of grad.NAME (and the step is
taken from that perturbed gradient, as a loom with a gradient bug would), so
check_oracle.py must report exactly that gradient. --drop leaves one tensor
out, so check_oracle.py must refuse the dump with exit 2.
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402
import torch_gpt2  # noqa: E402


def make_dump(cfg, B, T, seed=0, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
              perturb_grad=None, perturb_rel=1e-3):
    """Return (tensors, metadata) of a float32-torch dump."""
    rng = np.random.default_rng(seed + 1)
    init = torch_gpt2.init_params(cfg, seed=seed, dtype=np.float32, random_affine=True)
    tokens = rng.integers(0, cfg.vocab_size, size=(B, T + 1), dtype=np.int32)
    inputs, targets = tokens[:, :T].copy(), tokens[:, 1:].copy()

    params = torch_gpt2.params_from_numpy(init, cfg, torch.float32)
    logits, loss = torch_gpt2.forward(params, cfg, torch.from_numpy(inputs), torch.from_numpy(targets))
    loss.backward()
    if perturb_grad is not None:
        if perturb_grad not in params:
            raise KeyError("no parameter %r to perturb" % perturb_grad)
        g = params[perturb_grad].grad
        flat = g.view(-1)
        i = int(rng.integers(0, flat.numel()))
        flat[i] += perturb_rel * float(g.abs().max())
    grads = {n: t.grad.detach().numpy().copy() for n, t in params.items()}
    opt = torch_gpt2.make_adamw(params, lr, betas, eps, weight_decay)
    opt.step()

    tensors = {"tokens.inputs": inputs, "tokens.targets": targets,
               "out.logits": logits.detach().numpy(),
               "out.loss": np.array([loss.item()], dtype=np.float32)}
    for n in params:
        tensors["param." + n] = init[n]
        tensors["grad." + n] = grads[n]
        tensors["step." + n] = params[n].detach().numpy().copy()
    meta = {"n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_embd": cfg.n_embd,
            "vocab_size": cfg.vocab_size, "n_positions": cfg.n_positions, "B": B, "T": T,
            "lr": lr, "beta1": betas[0], "beta2": betas[1], "eps": eps, "weight_decay": weight_decay}
    return tensors, {k: repr(v) if isinstance(v, float) else str(v) for k, v in meta.items()}


def main():
    ap = argparse.ArgumentParser(description="write a float32-torch oracle dump")
    ap.add_argument("out")
    ap.add_argument("--n-layer", type=int, default=2)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=97)
    ap.add_argument("--n-positions", type=int, default=32)
    ap.add_argument("-B", type=int, default=3)
    ap.add_argument("-T", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--perturb-grad", metavar="NAME", help="HF parameter name whose gradient to perturb")
    ap.add_argument("--perturb-rel", type=float, default=1e-3)
    ap.add_argument("--drop", metavar="TENSOR", help="leave this dump tensor out (e.g. grad.ln_f.bias)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    cfg = torch_gpt2.Config(a.n_layer, a.n_head, a.n_embd, a.vocab, a.n_positions)
    cfg.check()
    tensors, meta = make_dump(cfg, a.B, a.T, a.seed, perturb_grad=a.perturb_grad, perturb_rel=a.perturb_rel)
    if a.drop is not None:
        if a.drop not in tensors:
            sys.exit("make_fake_dump: no tensor %r to drop" % a.drop)
        del tensors[a.drop]
    st.save(a.out, tensors, meta)
    print("wrote %s (%d tensors, loss %.6f)" % (a.out, len(tensors), float(tensors["out.loss"][0])))


if __name__ == "__main__":
    main()
