#!/usr/bin/env python3
"""Invariant 1 for the Llama family: a tiny Llama (grouped-query attention,
4 query heads over 2 key/value heads, untied LM head), a tiny Mixtral (4
SwiGLU experts, top 2: dp x ep, tp, ZeRO 3 over the experts, cp x pp) and a
tiny Qwen2 (its q/k/v biases), each a directory written by transformers' save_pretrained
and read with --model DIR, train the same run under each layout as on one
rank - the loss at each of 6 steps within 1e-5 relative and every final
parameter tensor within 1e-5 (norm-wise relative).

The layouts cover what the Llama parts change: tp 2 splits the key/value
heads, tp 4 replicates each on two ranks (their gradients summed over the
replicas), SP, CP ring with rotary positions on the load-balanced chunks
and Ulysses (with the key/value heads split too), PP with the untied head
on the last stage only, ZeRO 2 and 3 and full recompute.

Qwen2's key bias is measured element-wise instead where the norm-wise error
exceeds 1e-5: every element within 5e-5 of one rank, under 1 % of the
6e-3 that six AdamW steps of lr 1e-3 can move it. The reason:
the key dimensions of the lowest rotary frequency turn by under 1e-3 rad
over 16 positions, so a bias there shifts every score of a query almost
equally, the softmax nearly cancels it and its true gradient is close to
zero; AdamW divides that by its own small size, so the rounding of a
different summation order moves those elements by up to ~2e-5."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402

sys.path.insert(0, os.path.join(lt.SRC, "tests", "oracle"))
import hf_models  # noqa: E402

COMMON = ["--steps", 6, "--batch", 4, "--seq", 16, "--lr", "1e-3", "--warmup", 2, "--seed", 5,
          "--peak-flops", "1e11", "--no-progress"]

LLAMA_LAYOUTS = [  # (label, ranks, flags)
    ("dp=2", 2, ["--dp", 2]),
    ("tp=2", 2, ["--tp", 2]),
    ("tp=4 (kv heads replicated)", 4, ["--tp", 4]),
    ("tp=4 sp", 4, ["--tp", 4, "--sp"]),
    ("cp=2 ring", 2, ["--cp", 2]),
    ("cp=2 ulysses", 2, ["--cp", 2, "--cp-impl", "ulysses"]),
    ("pp=2 1f1b", 2, ["--pp", 2, "--micro-batches", 2]),
    ("dp=2 zero=3", 2, ["--dp", 2, "--zero", 3]),
    ("dp=2 tp=2 zero=2", 4, ["--dp", 2, "--tp", 2, "--zero", 2]),
    ("tp=2 recompute full", 2, ["--tp", 2, "--recompute", "full"]),
]
MIXTRAL_LAYOUTS = [
    ("mixtral dp=2 ep=2", 2, ["--dp", 2, "--ep", 2]),
    ("mixtral tp=2", 2, ["--tp", 2]),
    ("mixtral dp=2 ep=2 zero=3", 2, ["--dp", 2, "--ep", 2, "--zero", 3]),
    ("mixtral cp=2 pp=2", 4, ["--cp", 2, "--pp", 2, "--micro-batches", 2]),
]
QWEN2_LAYOUTS = [
    ("qwen2 tp=4 (kv heads replicated)", 4, ["--tp", 4]),
    ("qwen2 cp=2 pp=2", 4, ["--cp", 2, "--pp", 2, "--micro-batches", 2]),
]


def family(tmp, data, arch, layouts, bias_abs=None, **keys):
    d = hf_models.make(os.path.join(tmp, arch), arch, num_key_value_heads=2, vocab_size=256, **keys)
    common = ["--model", d, "--data", data] + COMMON
    ref = lt.train(tmp, arch + " ref", None, common)
    for label, np, flags in layouts:
        run = lt.train(tmp, label, np, common + flags)
        lt.compare_runs(ref[0], ref[1], run[0], run[1], label, bias_abs=bias_abs)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        family(tmp, data, "llama", LLAMA_LAYOUTS)
        family(tmp, data, "mixtral", MIXTRAL_LAYOUTS, num_local_experts=4, num_experts_per_tok=2)
        family(tmp, data, "qwen2", QWEN2_LAYOUTS, bias_abs=5e-5, rope_theta=1000000.0)
    lt.done()


if __name__ == "__main__":
    main()
