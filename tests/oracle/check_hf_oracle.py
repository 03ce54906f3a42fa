#!/usr/bin/python3
"""The Llama family against transformers (DESIGN invariant 2).

usage: check_hf_oracle.py ORACLE_DUMP [--only NAME,...] [--tol 1e-5]

For each case - Llama with grouped-query attention, Llama with one
key/value head, attention biases and a tied head, Llama 3's rope scaling,
Mistral with a sliding window shorter than the sequence, Qwen2 with its
q/k/v biases, Mixtral (4 SwiGLU experts, softmax top 2 renormalised) - this makes a tiny random model with transformers'
save_pretrained, runs ORACLE_DUMP (tests/model/oracle_dump.c) with
--hf DIR, which loads it with loom's --model DIR reader and writes its
parameters, logits, loss, every gradient and one AdamW step, and compares
with transformers' model of the same directory in float64 (the AdamW step
with torch.optim.AdamW in float32 from loom's gradients, as
check_oracle.py does). Error per tensor: max|loom - torch| / max|torch|.
Prints one line per case and tensor group; exit 1 if any fails.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_models  # noqa: E402
import st  # noqa: E402
from check_oracle import rel_err  # noqa: E402
from torch_gpt2 import make_adamw  # noqa: E402

CASES = [
    ("llama-gqa", "llama", dict(num_key_value_heads=2)),
    ("llama-mqa-bias-tied", "llama", dict(num_key_value_heads=1, attention_bias=True, tie_word_embeddings=True)),
    ("llama3-rope-scaling", "llama", dict(num_key_value_heads=2, rope_theta=500000.0,
                                          rope_scaling=hf_models.LLAMA3)),
    ("mistral-window", "mistral", dict(num_key_value_heads=2, sliding_window=5)),
    ("qwen2", "qwen2", dict(num_key_value_heads=2, rope_theta=1000000.0)),
    ("mixtral", "mixtral", dict(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)),
    ("qwen2-moe", "qwen2_moe", hf_models.QWEN2_MOE),
    ("qwen2-moe-step2-norm", "qwen2_moe", dict(hf_models.QWEN2_MOE, decoder_sparse_step=2, norm_topk_prob=True)),
]
B, T = 2, 16


def check_case(dump_bin, tmp, name, arch, keys, tol):
    return check_dir(dump_bin, tmp, name, hf_models.make(os.path.join(tmp, name), arch, **keys), tol)


def check_dir(dump_bin, tmp, name, d, tol):
    """loom (oracle_dump --hf d) against transformers on directory d."""
    out = os.path.join(tmp, name + ".safetensors")
    p = subprocess.run([dump_bin, out, "--hf", d, str(B), str(T)], capture_output=True, text=True)
    if p.returncode != 0:
        print("%s: oracle_dump failed (%d)\n%s%s" % (name, p.returncode, p.stdout, p.stderr))
        return 0, 1
    t, meta = st.load(out)
    model = hf_models.load(d)
    sd = {k: v for k, v in model.named_parameters()}
    errs = {"param": 0.0, "grad": 0.0, "step": 0.0}
    missing = [n for n in sd if "param." + n not in t]
    extra = [k[6:] for k in t if k.startswith("param.") and k[6:] not in sd]
    if missing or extra:
        print("%s: names differ: missing in loom %s, not in transformers %s" % (name, missing, extra))
        return 0, 1
    for n, v in sd.items():
        errs["param"] = max(errs["param"], rel_err(t["param." + n], v.detach().numpy()))
    idx = torch.from_numpy(t["tokens.inputs"].astype(np.int64))
    tgt = torch.from_numpy(t["tokens.targets"].astype(np.int64))
    torch.set_default_dtype(torch.float64)  # transformers' float64 masks need it under torch 1.13
    try:
        logits = model(idx).logits
    finally:
        torch.set_default_dtype(torch.float32)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
    loss.backward()
    e_logits = rel_err(t["out.logits"], logits.detach().numpy())
    e_loss = rel_err(t["out.loss"], np.array([loss.item()]))
    worst = ""
    for n, v in sd.items():
        e = rel_err(t["grad." + n], v.grad.numpy())
        if e > errs["grad"]:
            errs["grad"], worst = e, n
    params = {n: torch.from_numpy(t["param." + n].copy()).requires_grad_() for n in sd}
    for n in sd:
        params[n].grad = torch.from_numpy(t["grad." + n].copy())
    lr, b1, b2 = float(meta["lr"]), float(meta["beta1"]), float(meta["beta2"])
    opt = make_adamw(params, lr, (b1, b2), float(meta["eps"]), float(meta["weight_decay"]))
    opt.step()
    for n in sd:
        errs["step"] = max(errs["step"], rel_err(t["step." + n], params[n].detach().numpy()))
    results = [("params as loaded", errs["param"]), ("logits", e_logits), ("loss", e_loss),
               ("gradients (worst %s)" % worst, errs["grad"]), ("adamw step", errs["step"])]
    ok = fail = 0
    for what, e in results:
        good = e <= tol
        ok += good
        fail += not good
        print("%-22s %-38s %.3e  %s" % (name, what, e, "ok" if good else "FAIL"))
    return ok, fail


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("oracle_dump")
    ap.add_argument("--only", default="")
    ap.add_argument("--tol", type=float, default=1e-5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    only = set(filter(None, args.only.split(",")))
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, arch, keys in CASES:
            if only and name not in only:
                continue
            ok, bad = check_case(args.oracle_dump, tmp, name, arch, keys, args.tol)
            passed += ok
            failed += bad
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
