#!/usr/bin/env python3
"""Invariant 1 for tensor and sequence parallelism: tp = 1, 2, 4, 8 with and
without --sp, alone and with dp = 2, 4, train the same model as one rank - the
loss at each of 12 steps within 1e-5 relative and every final parameter tensor
within 1e-5 (norm-wise relative, ||p - p_1|| / ||p_1||).

The model has 8 heads (so tp = 8 divides them) and a vocabulary of 253, which
no tp > 1 divides: the padded vocabulary rows must never change the loss."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402

STEPS = 12
COMMON = ["--steps", STEPS, "--batch", 8, "--seq", 32, "--lr", "1e-3", "--warmup", 2,
          "--seed", 5, "--peak-flops", "1e11", "--no-progress"]

LAYOUTS = [  # (label, ranks, flags)
    ("tp=1", 1, ["--tp", 1]),
    ("tp=2", 2, ["--tp", 2]),
    ("tp=4", 4, ["--tp", 4]),
    ("tp=8", 8, ["--tp", 8]),
    ("tp=2 sp", 2, ["--tp", 2, "--sp"]),
    ("tp=4 sp", 4, ["--tp", 4, "--sp"]),
    ("tp=8 sp", 8, ["--tp", 8, "--sp"]),
    ("dp=2 tp=2", 4, ["--dp", 2, "--tp", 2]),
    ("dp=2 tp=2 sp", 4, ["--dp", 2, "--tp", 2, "--sp"]),
    ("dp=4 tp=2 sp", 8, ["--dp", 4, "--tp", 2, "--sp"]),
    ("dp=2 tp=4", 8, ["--dp", 2, "--tp", 4]),
]


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        model = lt.write_model(tmp, n_layer=2, n_head=8, n_embd=64, vocab_size=253, n_positions=64)
        common = ["--model", model, "--data", data] + COMMON
        ref = lt.train(tmp, "ref", None, common)
        for label, np, flags in LAYOUTS:
            run = lt.train(tmp, label, np, common + flags)
            lt.compare_runs(ref[0], ref[1], run[0], run[1], label)
    lt.done()


if __name__ == "__main__":
    main()
