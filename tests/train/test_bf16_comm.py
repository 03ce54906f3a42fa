"""--comm-precision bf16 (issue 13): the data-parallel gradient reductions and
the tensor-parallel activation collectives in bf16, half their bytes, and the
run still the one-rank bf16 run within what bf16 rounding allows.

Layouts at --precision bf16 --comm-precision bf16: dp=2 zero 0 (the
all-reduce; and with --grad-accum 4, the early-wte path), dp=2 zero 1 (the
reduce-scatter), dp=2 zero 2 (reduce-scatters per micro-batch, --grad-accum 2),
dp=3 zero 1 with one bucket per unit (the buckets need padding: the blocking
padded reduce-scatter), tp=2 with SP (all-gathers and reduce-scatters of
activations), and tp=2 x dp=2 zero 0 (TP all-reduces and the dp all-reduce).
Each is compared with the one-rank bf16 run and with the same layout at
--comm-precision fp32:

1. Bytes, from the trainer's per-step "comm" stats, against the fp32-comm
   run: over dp, the gradient reductions' bytes are exactly half (the
   all-reduce at zero 0 less the trainer's 8-byte loss all-reduce, the
   reduce-scatter at zero 1/2); over tp with SP the reduce-scatters and
   all-gathers are exactly half; over tp without SP the all-reduces shrink by
   exactly half of their activation part, (4 L + 2) all-reduces of B T C
   floats per micro-batch (two per block forward, two backward, the
   vocab-parallel embedding's forward and the head's input gradient), the
   softmax statistics and SP parameter-gradient sums staying fp32; calls
   unchanged, every other op of every group unchanged.
2. Rounding happened: the final parameters differ from the fp32-comm run's.
3. Parity with one rank, with a tolerance derived from the rounding (first
   order; cancellation in a sum and what a drift does to later gradients are
   left out). A sum over N ranks carries N input roundings and N - 1 rounded
   partial sums, each at most u = 2^-8 (bf16's unit roundoff, 8 significant
   bits) of sum_r |x_r|: relative error (2N - 1) u. A parameter's gradient
   passes through K such collectives: K = 1 for the dp reduction; a tp
   layout adds the 4 L + 2 activation collectives above; so its relative
   error is at most delta = K (2N - 1) u. AdamW's step m/sqrt(v) then moves by
   at most 2 delta of itself (m and sqrt(v) each off by delta), and a step
   moves an element by about lr_t at most, so after t steps an element has
   drifted by at most D_t = 2 delta sum_{s<t} lr_s. Allowed on top of the bf16
   layout tolerances of test_bf16.py (weights 2^-9 norm-wise, biases lr/4 per
   element, the loss 1e-4 relative):
   - every parameter tensor: ||p - p_1|| <= 2^-9 ||p_1|| + D sqrt(numel);
     a bias: max |p - p_1| <= lr/4 + D;
   - the loss at step t: first order, dL = sum_i dL/dp_i dp_i; the rounding
     errors of different elements are unbiased and independent, so dL has a
     standard deviation of at most ||grad L_t|| D_t (the gradient norm the
     one-rank run logs); 6 of those are allowed. Step 1 (no update yet; only
     the forward's TP roundings) must agree within 1e-4 alone.
4. Refused with a message naming the cause: --precision fp32, a one-rank
   layout, and an unknown precision.
"""
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import loomtest as lt  # noqa: E402
import st  # noqa: E402

LR = 1e-3
U = 2.0 ** -8  # bf16 unit roundoff
COMMON = ["--steps", 12, "--seq", 32, "--lr", str(LR), "--warmup", 2, "--seed", 5,
          "--peak-flops", "1e11", "--no-progress", "--threads", 1, "--precision", "bf16"]
LOSS_ALLREDUCE = 8  # the trainer's loss all-reduce over dp (one double), every step
# (label, ranks, dp, batch, flags); zero 1 with --bucket-mb 0 at dp = 3: the
# blocks (49984 floats) are not a multiple of 3, so their buckets are padded
L = 2
# (label, ranks, N (the group size of the sums), K (bf16 collectives on a
# gradient's path), batch, flags); zero 1 with --bucket-mb 0 at dp = 3: the
# blocks (49984 floats) are not a multiple of 3, so their buckets are padded
LAYOUTS = [("dp=2 zero=0", 2, 2, 1, 8, ["--dp", 2, "--zero", 0]),
           # 32 rows per micro-batch: dp x B x T <= V / 2, the early-wte path
           # (wte reduced alone, the embedding rows gathered in fp32)
           ("dp=2 zero=0 accum=4 early wte", 2, 2, 1, 8, ["--dp", 2, "--zero", 0, "--grad-accum", 4]),
           ("dp=2 zero=1", 2, 2, 1, 8, ["--dp", 2, "--zero", 1]),
           ("dp=2 zero=2 accum=2", 2, 2, 1, 8, ["--dp", 2, "--zero", 2, "--grad-accum", 2]),
           ("dp=3 zero=1 padded", 3, 3, 1, 6, ["--dp", 3, "--zero", 1, "--bucket-mb", 0]),
           ("tp=2 sp", 2, 2, 4 * L + 2, 8, ["--tp", 2, "--sp"]),
           ("tp=2 dp=2 zero=0", 4, 2, 4 * L + 3, 8, ["--tp", 2, "--dp", 2, "--zero", 0])]
C, SEQ = 64, 32


def drift(ref_rows, N, K):
    """D_t for t = 1..steps: the bound on an element's drift before step t."""
    delta = K * (2 * N - 1) * U
    out, s = [], 0.0
    for r in ref_rows:
        out.append(2 * delta * s)
        s += r["lr"]
    return out + [2 * delta * s]  # after the last step


def check_parity(label, ref, run, N, K):
    rows0, rows1 = lt.read_metrics(ref[0]), lt.read_metrics(run[0])
    lt.check(len(rows0) == len(rows1), "%s: %d vs %d steps" % (label, len(rows1), len(rows0)))
    D = drift(rows0, N, K)
    worst = 0.0
    for t, (a, b) in enumerate(zip(rows1, rows0)):
        allow = 1e-4 * b["loss"] + 6 * b["grad_norm"] * D[t]
        err = abs(a["loss"] - b["loss"])
        worst = max(worst, err / allow)
        lt.check(err <= allow, "%s: step %d loss %.8g vs one rank %.8g (|diff| %.2e > %.2e)"
                 % (label, b["step"], a["loss"], b["loss"], err, allow))
    p0, _ = st.load(ref[1])
    p1, _ = st.load(run[1])
    lt.check(sorted(p0) == sorted(p1), "%s: parameter names differ" % label)
    import numpy as np
    worst_p = 0.0
    for name in p0:
        a, b = np.asarray(p1[name], np.float64), np.asarray(p0[name], np.float64)
        d = D[-1]
        if name.endswith("bias"):
            err, allow = float(np.max(np.abs(a - b))), LR / 4 + d
        else:
            err, allow = float(np.linalg.norm(a - b)), 2.0 ** -9 * float(np.linalg.norm(b)) + d * math.sqrt(b.size)
        worst_p = max(worst_p, err / allow)
        lt.check(err <= allow, "%s: %s differs by %.3e, allowed %.3e" % (label, name, err, allow))
    print("%s: worst loss at %.2f of its bound, worst parameter at %.2f of its bound (D = %.2e)"
          % (label, worst, worst_p, D[-1]))


def expected_bytes(group, op, b32, zero, flags, batch):
    """The bf16-comm run's bytes of one group's op, from the fp32-comm run's."""
    if group == "dp" and op == ("allreduce" if zero == 0 else "reduce_scatter"):
        other = LOSS_ALLREDUCE if op == "allreduce" else 0
        return (b32 - other) // 2 + other
    if group == "tp" and "--sp" in flags and op in ("allgather", "reduce_scatter"):
        return b32 // 2
    if group == "tp" and "--sp" not in flags and op == "allreduce":
        dp = flags[flags.index("--dp") + 1] if "--dp" in flags else 1
        activations = (4 * L + 2) * (batch // dp) * SEQ * C * 4  # fp32 bytes, one micro-batch
        return b32 - activations // 2
    return b32


def check_bytes(label, zero, flags, batch, run32, run16):
    rows32, rows16 = lt.read_metrics(run32[0]), lt.read_metrics(run16[0])
    for a, b in zip(rows32, rows16):
        for group in sorted(set(a["comm"]) | set(b["comm"])):
            g32, g16 = a["comm"].get(group, {}), b["comm"].get(group, {})
            lt.check(sorted(g32) == sorted(g16), "%s: %s ops %s vs %s" % (label, group, sorted(g16), sorted(g32)))
            for op in g32:
                c32, c16 = g32[op], g16.get(op, {"calls": -1, "bytes": -1})
                lt.check(c16["calls"] == c32["calls"], "%s step %d: %s %s calls %d vs %d"
                         % (label, a["step"], group, op, c16["calls"], c32["calls"]))
                want = expected_bytes(group, op, c32["bytes"], zero, flags, batch)
                lt.check(c16["bytes"] == want, "%s step %d: %s %s bytes %d, expected %d (fp32 comm: %d)"
                         % (label, a["step"], group, op, c16["bytes"], want, c32["bytes"]))
    for group in sorted(rows32[-1]["comm"]):
        g32, g16 = rows32[-1]["comm"][group], rows16[-1]["comm"].get(group, {})
        print("%s: %s bytes per step, fp32 -> bf16 comm: %s" % (label, group, ", ".join(
            "%s %d -> %d" % (op, g32[op]["bytes"], g16.get(op, {}).get("bytes", -1)) for op in sorted(g32))))


def check_refused(tmp, common, flags, np, want):
    p = lt.run(["train", "--batch", 8] + common + flags, np=np, check_ok=False)
    out = p.stdout + p.stderr
    lt.check(p.returncode == 64 and want in out, "%s: exit %d, output %r (want 64 and %r)"
             % (" ".join(map(str, flags)), p.returncode, out[-400:], want))


with tempfile.TemporaryDirectory() as tmp:
    data = lt.make_text_data(tmp)
    model = lt.write_model(tmp, n_layer=2, n_head=4, n_embd=64, vocab_size=253, n_positions=64)
    common = ["--model", model, "--data", data] + COMMON
    refs = {}
    for label, np, N, K, batch, flags in LAYOUTS:
        if batch not in refs:
            refs[batch] = lt.train(tmp, "ref%d" % batch, None, common + ["--batch", batch])
        zero = int(flags[flags.index("--zero") + 1]) if "--zero" in flags else 0
        run32 = lt.train(tmp, label + " fp32", np, common + ["--batch", batch] + flags)
        run16 = lt.train(tmp, label + " bf16", np, common + ["--batch", batch, "--comm-precision", "bf16"] + flags)
        check_bytes(label, zero, flags, batch, run32, run16)
        p32, _ = st.load(run32[1])
        p16, _ = st.load(run16[1])
        lt.check(any((p32[k] != p16[k]).any() for k in p32), "%s: bf16 comm gave the fp32 parameters" % label)
        check_parity(label + " bf16 comm", refs[batch], run16, N, K)
    check_refused(tmp, common[:-2] + ["--precision", "fp32"], ["--dp", 2, "--comm-precision", "bf16"], 2,
                  "--comm-precision bf16 needs --precision bf16")
    check_refused(tmp, common, ["--comm-precision", "bf16"], None, "--comm-precision bf16 with dp=1 cp=1 tp=1")
    check_refused(tmp, common, ["--dp", 2, "--comm-precision", "fp16"], 2, "--comm-precision fp16: expected fp32 or bf16")
lt.done()
