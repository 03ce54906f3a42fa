#!/usr/bin/env python3
"""Context parallelism saves activation memory, measured by the kernel.

Each rank of `loom train` runs under tests/lib/peak_rss.py (ru_maxrss of the
loom process, an instrument loom does not compute). The activation peak of a
layout is taken as the growth of a rank's peak RSS between two sequence
lengths - parameters, optimizer state, MPI and BLAS buffers do not depend on
T and cancel:
  cp = 1 at T = 2048 and 4096 gives the one-rank growth per token;
  cp = 4 (ring) at T = 8192 and 16384 gives each rank's growth over those
  8192 extra tokens.
Asserted: every cp = 4 rank's growth is <= 0.35 of what one rank grows over
the same 8192 tokens (extrapolated linearly from its measured slope: the
attention kernel's memory is O(T), tests/train/test_attention_memory.py), and
the extrapolation is checked by the cp = 1 growth itself being linear enough
to trust (both cp = 1 points above the noise floor)."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402

MODEL = {"n_layer": 1, "n_head": 1, "n_embd": 16, "vocab_size": 256, "n_positions": 16384}
RATIO = 0.35
MB = 1e6


def peak(tmp, data, model, T, cp):
    args = ["train", "--model", model, "--data", data, "--steps", 1, "--seq", T, "--batch", 1,
            "--seed", 3, "--threads", 1, "--peak-flops", "1e11", "--no-progress", "--cp", cp]
    return lt.peak_rss(tmp, "T%d_cp%d" % (T, cp), cp, args)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        model = lt.write_model(tmp, **MODEL)
        lo, hi = peak(tmp, data, model, 2048, 1)[0], peak(tmp, data, model, 4096, 1)[0]
        per_token = (hi - lo) / 2048.0
        lt.check(hi - lo > 2 * MB, "cp=1: growth %.2f MB from T=2048 to 4096 is too small to "
                 "measure" % ((hi - lo) / MB))
        one = per_token * 8192
        lo4, hi4 = peak(tmp, data, model, 8192, 4), peak(tmp, data, model, 16384, 4)
        print("cp=1: %.1f -> %.1f MB (T 2048 -> 4096): %.0f bytes/token; one rank would grow "
              "%.1f MB from T=8192 to 16384" % (lo / MB, hi / MB, per_token, one / MB))
        for r in range(4):
            grow = hi4[r] - lo4[r]
            print("cp=4 rank %d: %.1f -> %.1f MB (T 8192 -> 16384): growth %.1f MB = %.3f of one "
                  "rank's" % (r, lo4[r] / MB, hi4[r] / MB, grow / MB, grow / one))
            lt.check(grow <= RATIO * one, "cp=4 rank %d grows %.1f MB, more than %.2f of one "
                     "rank's %.1f MB" % (r, grow / MB, RATIO, one / MB))
    return lt.done()


if __name__ == "__main__":
    sys.exit(main())
