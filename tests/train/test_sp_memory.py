#!/usr/bin/env python3
"""Sequence parallelism saves activation memory, measured by the kernel.

Each rank of `loom train` runs under tests/lib/peak_rss.py, which records the
kernel's peak resident set size of the loom process (ru_maxrss, its VmHWM):
an instrument loom does not compute. Every layout runs at two global batch
sizes, B_LO and B_HI sequences; the difference of a rank's two peaks is the
memory of the extra (B_HI - B_LO)*s tokens' activations - parameters, grads,
optimizer state, MPI and BLAS buffers are the same in both runs and cancel.
The model is narrow and deep with a short sequence, so activations dominate
(tens of MB of difference per rank).

Asserted, per rank:
  - with --sp, the measured activation peak falls with tp in {1, 2, 4} by the
    ratio the formula predicts (within TOL of it): with SP every per-block
    activation is 1/tp of the single-device one, and only per-slot and shared
    buffers (inputs, the one gathered (N, h) scratch, ...) stay whole;
  - at tp = 2, with --sp it is below the run without --sp, again by about
    the predicted ratio.
Secondary: loom's own accounting ("mem" -> "activations" of --metrics) equals
the formula of docs/parallelism.md byte for byte, and the measured difference
is within TOL of the formula's difference (the arena is the only memory that
grows with the batch).

The formula (docs/parallelism.md, "Activation memory") is the plan of
layout_slot / layout_acts in src/model/gpt.c for one slot and a full backward,
each allocation rounded up to 64 bytes by src/core/arena.c. Notation: L
blocks, h = n_embd, V = vocab_size, heads a, t = tp, b = --batch / dp, s =
--seq, N = b*s, Nx = N/t with --sp and N without, h_t = h/t, a_t = a/t,
V_t = ceil(V/t), f(n) = n float32 rounded up to 64 bytes:

  slot      2 r(4N) [inputs, targets] + 2 f(Nx h) [x, dx]
  per block 4 f(Nx h) [ln1, res2, ln2, res3] + 4 f(Nx) [LN means, rstds]
            + f(3N h_t) [qkv] + f(N h_t) [atty] + f(b a_t s) [lse]
            + 2 f(4N h_t) [fch, fch_gelu]
  head      f(Nx h) [lnf] + 2 f(Nx) + f(N V_t) [logits] + f(N) [losses]
  shared    2 f(Nx h) [dres, dlnf] + f(N h) [dlnfull] + [SP] f(N h) [dfull]
            + f(4N h_t) [d4c] + f(N h_t) [datty] + f(N) [xmax] + f(2N) [xsum]
  scratch   2 f(N h) [dfcp, dproj] + f(4N h_t) [dfch] + f(3N h_t) [dqkv]
            + 2 f(Nx h) [dln2, dln1]

  activations = slot + L * block + head + shared + scratch"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402

MODEL = {"n_layer": 6, "n_head": 4, "n_embd": 128, "vocab_size": 256, "n_positions": 64}
SEQ, B_LO, B_HI = 64, 8, 40
THREADS = 1
TOL = 0.15  # relative tolerance of a measured ratio or difference against the formula's
COMMON = ["--steps", 1, "--seq", SEQ, "--seed", 3, "--threads", THREADS, "--peak-flops", "1e11",
          "--no-progress"]
LAYOUTS = [("tp=1", 1, False), ("tp=2", 2, False), ("tp=2 sp", 2, True), ("tp=4 sp", 4, True)]
MB = 1e6


def activation_bytes(cfg, tp, sp, b, s, align=64):
    """The formula of the docstring."""
    L, h, a, V = cfg["n_layer"], cfg["n_embd"], cfg["n_head"], cfg["vocab_size"]
    N = b * s
    Nx = N // tp if sp else N
    ht, at, Vt = h // tp, a // tp, -(-V // tp)

    def r(x):
        return -(-x // align) * align

    def f(n):
        return r(4 * n)

    slot = 2 * r(4 * N) + 2 * f(Nx * h)
    block = (4 * f(Nx * h) + 4 * f(Nx) + f(3 * N * ht) + f(N * ht) + f(b * at * s)
             + 2 * f(4 * N * ht))
    head = f(Nx * h) + 2 * f(Nx) + f(N * Vt) + f(N)
    shared = (2 * f(Nx * h) + f(N * h) + (f(N * h) if sp else 0) + f(4 * N * ht) + f(N * ht)
              + f(N) + f(2 * N))
    scratch = 2 * f(N * h) + f(4 * N * ht) + f(3 * N * ht) + 2 * f(Nx * h)
    return slot + L * block + head + shared + scratch


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        model = os.path.join(tmp, "config.json")
        with open(model, "w") as f:
            json.dump(MODEL, f)
        measured, planned = {}, {}  # label -> per-rank peak difference; formula difference
        for label, tp, sp in LAYOUTS:
            peaks = []
            for batch in (B_LO, B_HI):
                tag = "%s_b%d" % (label, batch)
                metrics = os.path.join(tmp, tag.replace(" ", "_").replace("=", "") + ".jsonl")
                args = (["train", "--model", model, "--data", data, "--metrics", metrics, "--tp", tp,
                         "--batch", batch] + COMMON + (["--sp"] if sp else []))
                peaks.append(lt.peak_rss(tmp, tag, tp, args))
                got = lt.read_metrics(metrics)[0]["mem"]["activations"]
                want = activation_bytes(MODEL, tp, sp, batch, SEQ)
                lt.check(got == want, "%s batch %d: loom accounts %d activation bytes, the formula "
                         "says %d" % (label, batch, got, want))
            diff = [hi - lo for lo, hi in zip(peaks[0], peaks[1])]
            measured[label] = diff
            planned[label] = (activation_bytes(MODEL, tp, sp, B_HI, SEQ)
                              - activation_bytes(MODEL, tp, sp, B_LO, SEQ))
            print("%-8s peak RSS per rank at batch %d: %s MB, at batch %d: %s MB; activation peak "
                  "of the extra tokens %s MB (formula %.1f MB)" % (
                      label, B_LO, "/".join("%.1f" % (p / MB) for p in peaks[0]), B_HI,
                      "/".join("%.1f" % (p / MB) for p in peaks[1]),
                      "/".join("%.1f" % (d / MB) for d in diff), planned[label] / MB))
            for r, d in enumerate(diff):
                lt.check(abs(d - planned[label]) <= TOL * planned[label],
                         "%s rank %d: measured activation peak %.1f MB, the plan is %.1f MB (more "
                         "than %d%% apart)" % (label, r, d / MB, planned[label] / MB, TOL * 100))

        def compare(label, base, what):
            want = planned[label] / planned[base]
            ref = sum(measured[base]) / len(measured[base])
            for r, d in enumerate(measured[label]):
                got = d / ref
                print("%-8s rank %d / %s: measured %.3f, formula %.3f" % (label, r, base, got, want))
                lt.check(got < 1.0 and abs(got - want) <= TOL * want,
                         "%s rank %d: activation peak %.1f MB is %.3f of %s's %.1f MB; %s %.3f "
                         "(+-%d%%)" % (label, r, d / MB, got, base, ref / MB, what,
                                       want, TOL * 100))

        compare("tp=2 sp", "tp=1", "with SP it should fall to")
        compare("tp=4 sp", "tp=2 sp", "with SP it should fall to")
        compare("tp=2 sp", "tp=2", "SP at tp=2 should save down to")
    lt.done()


if __name__ == "__main__":
    main()
