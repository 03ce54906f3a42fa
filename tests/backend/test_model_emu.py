#!/usr/bin/env python3
"""The runs of test_model_emu.sh: `loom train --device cuda` on the CPU
emulation of CUDA (LOOM: the loom_emu binary it built), against `--device
cpu` runs of the same binary. Every multi-rank cuda run goes through the
device's host-staged groups (no LOOM_CUDA_AWARE_MPI, LOOM_DEVICE_COMM unset):
each collective copies its device buffers to host memory, runs on MPI and
copies back, and the emulation aborts any copy whose device side is not
device memory (a host buffer handed to a device group).

- Against the one-rank CPU run (loss per step within 1e-6 relative): 1 rank,
  dp2 ZeRO-3, tp2 SP, pp2 zero-bubble.
- Against the CPU run of the same layout (loss within 1e-6, and rank 0's
  communication per step - calls and bytes of every op of every group:
  invariant 4 - equal to the CPU run's): those three, cp2 ring, tiny-moe
  cp2 Ulysses x ep2, and bf16 communication (dp2 ZeRO-1 at --precision bf16
  --comm-precision bf16: the wire format packs with the device's kernels
  into device buffers; the loss within 1e-4, the bf16 layouts' tolerance of
  tests/train/test_bf16.py).
- An expert-parallel MoE with aux-loss-free balancing, dp2 x ep2 ZeRO-1
  (parameters, ZeRO shards, AdamW moments, expert storage and selection
  biases all in device memory), 4 steps against the CPU run of the same
  layout as above, saving sharded checkpoints on the device; its step-2
  checkpoint resumed to step 4: the resumed losses and the final parameter
  file are bit-identical to the straight run's, and `loom export` of the
  device run's step-4 checkpoint holds exactly its final parameters.
- Inference's groups: `loom generate --device cuda` of that model at 1 rank,
  tp2, ep2 and pp2: the tokens of the cpu run of the same layout, and the
  last position's logits within 1e-5.
Usage: LOOM=loom_emu LOOM_RUN=... test_model_emu.py WORKDIR
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402

WORK = sys.argv[1]
DATA = os.path.join(WORK, "data.bin")
COMMON = ["--data", DATA, "--batch", 4, "--seq", 16, "--threads", 1, "--peak-flops", "1e9", "--quiet"]
TOL = 1e-6
# --precision bf16: operands rounded to bf16, so the CPU's and the emulated
# cuBLAS's different orders of fp32 accumulation flip some roundings (of the
# operands, and of the gradients on the bf16 wire) from step 2 on; the loss
# tolerance of bf16 layouts (tests/train/test_bf16.py)
TOL_BF16 = 1e-4


T0 = time.time()


def train(tag, np, device, args, steps=3):
    """One run; returns its metrics (one record per step)."""
    m = os.path.join(WORK, tag.replace(" ", "_") + "." + device + ".jsonl")
    if os.path.exists(m):
        os.remove(m)
    lt.run(["train"] + COMMON + ["--steps", steps, "--device", device, "--metrics", m] + list(args),
           np=np if np > 1 else None, timeout=900)
    return lt.read_metrics(m)


def rel(a, b):
    return max(abs(x - y) / abs(x) for x, y in zip(a, b)) if len(a) == len(b) else float("inf")


def losses(metrics):
    return [r["loss"] for r in metrics]


def traffic(metrics):
    """Rank 0's calls and bytes per step, group and op (not the times)."""
    return [{g: {op: (v["calls"], v["bytes"]) for op, v in ops.items()} for g, ops in r["comm"].items()}
            for r in metrics]


def same(label, np, args, one_rank=None, tol=TOL):
    """The cuda run of a layout against the cpu run of the same layout (and
    the one-rank cpu run when given): losses, and rank 0's traffic."""
    cpu = train(label, np, "cpu", args)
    cuda = train(label, np, "cuda", args)
    d = rel(losses(cpu), losses(cuda))
    lt.check(len(cuda) == 3 and d <= tol, "%s: cuda losses %s, cpu %s (%.2e)" % (label, losses(cuda), losses(cpu), d))
    tc, tg = traffic(cpu), traffic(cuda)
    lt.check(tc == tg, "%s: the staged groups' traffic differs from the cpu run's:\n  cpu  %s\n  cuda %s" %
             (label, tc, tg))
    nbytes = sum(b for g in tg[-1].values() for _, b in g.values())
    line = "--device cuda (emulated) %-44s max |cpu - cuda| / |cpu| %.2e, traffic equal (%d B/step on rank 0)" % (
        label, d, nbytes)
    if one_rank is not None:
        d1 = rel(one_rank, losses(cuda))
        lt.check(d1 <= TOL, "%s: cuda losses %s, one-rank cpu %s (%.2e)" % (label, losses(cuda), one_rank, d1))
        line += "; vs one rank %.2e" % d1
    print(line + " [%.0f s]" % (time.time() - T0), flush=True)


def checkpoints():
    """Save on the device at step 2, resume to 4: bit-identical to straight."""
    model = lt.write_model(WORK, n_layer=2, n_head=4, n_embd=64, vocab_size=256, n_positions=128,
                           num_local_experts=4, num_experts_per_tok=2, aux_free_bias_rate=0.01)
    args = ["--model", model, "--dp", 2, "--ep", 2, "--zero", 1, "--lr", "1e-3"]
    straight, resumed = os.path.join(WORK, "straight"), os.path.join(WORK, "resumed")
    pa, pb = os.path.join(WORK, "straight.safetensors"), os.path.join(WORK, "resumed.safetensors")
    ma = train("ckpt-straight", 2, "cuda", args + ["--save-dir", straight, "--save-every", 2, "--save-params", pa],
               steps=4)
    cpu = train("ckpt-straight", 2, "cpu", args, steps=4)
    d = rel(losses(cpu), losses(ma))
    lt.check(len(ma) == 4 and d <= TOL, "ckpt: straight cuda losses %s, cpu %s (%.2e)" % (losses(ma), losses(cpu), d))
    lt.check(traffic(cpu) == traffic(ma), "ckpt: the staged groups' traffic differs from the cpu run's")
    mb = train("ckpt-resumed", 2, "cuda", args + ["--resume", os.path.join(straight, "step_2"), "--save-dir", resumed,
                                                  "--save-params", pb], steps=4)
    lt.check([r["step"] for r in mb] == [r["step"] for r in ma[2:]], "ckpt: resumed steps %s" % [r["step"] for r in mb])
    lt.check(losses(mb) == losses(ma)[2:], "ckpt: resumed losses %s, straight %s" % (losses(mb), losses(ma)[2:]))
    with open(pa, "rb") as f:
        a = f.read()
    with open(pb, "rb") as f:
        b = f.read()
    lt.check(a == b, "ckpt: the resumed run's parameter file differs from the straight run's")
    with open(os.path.join(straight, "step_2", "manifest.json")) as f:
        man = json.load(f)
    lt.check("buffers" in man and len(man["buffers"]) == 2, "ckpt: the selection biases are not in the manifest")
    os.makedirs(os.path.join(WORK, "export"), exist_ok=True)  # config.json goes beside the file
    ex = os.path.join(WORK, "export", "model.safetensors")
    lt.run(["export", os.path.join(straight, "step_4"), ex])
    pe, _ = lt.st.load(ex)
    pf, _ = lt.st.load(pa)
    lt.check(sorted(pe) == sorted(pf) and all((pe[k] == pf[k]).all() for k in pf),
             "ckpt: loom export of the device checkpoint differs from its --save-params")
    print("--device cuda (emulated) moe dp2 ep2 zero1 (aux-free bias): cpu %.2e, traffic equal; its checkpoint resumed "
          "at step 2: losses %s bit-identical, parameter file identical; export identical [%.0f s]" %
          (d, losses(mb), time.time() - T0), flush=True)
    return model, pa


def generate(model, params):
    """Inference's mesh groups on the device: the last position's logits of
    `loom generate --device cuda` at 1 rank, tp2, ep2 and pp2 against the cpu
    run of the same layout."""
    import numpy as np
    for label, n, lay in (("1 rank", 1, []), ("tp2", 2, ["--tp", 2]), ("ep2", 2, ["--ep", 2]), ("pp2", 2, ["--pp", 2])):
        out = {}
        for dev in ("cpu", "cuda"):
            f = os.path.join(WORK, "logits.%s.%d.f32" % (dev, n))
            p = lt.run(["generate", "--model", model, "--load-params", params, "--ids", "84,104,101", "--max-tokens", 4,
                        "--format", "ids", "--threads", 1, "--device", dev, "--logits-out", f] + lay,
                       np=n if n > 1 else None)
            out[dev] = (p.stdout.split(), np.fromfile(f, dtype=np.float32))
        (tc, lc), (tg, lg) = out["cpu"], out["cuda"]
        e = lt.max_rel_err(lg, lc)
        lt.check(tc == tg and lc.size > 0 and e <= 1e-5, "generate %s: cuda tokens %s logits err %.2e, cpu %s" %
                 (label, tg, e, tc))
        print("--device cuda (emulated) generate %-8s tokens %s as on cpu, logits within %.2e [%.0f s]" %
              (label, " ".join(tg), e, time.time() - T0), flush=True)


def main():
    one = losses(train("one", 1, "cpu", ["--model", "tiny"]))
    cuda1 = losses(train("one", 1, "cuda", ["--model", "tiny"]))
    d = rel(one, cuda1)
    lt.check(d <= TOL, "1 rank: cuda %s, cpu %s (%.2e)" % (cuda1, one, d))
    print("--device cuda (emulated) %-44s max |cpu - cuda| / |cpu| %.2e" % ("1 rank", d), flush=True)
    tiny = ["--model", "tiny"]
    same("dp2 zero3", 2, tiny + ["--dp", 2, "--zero", 3], one)
    same("tp2 sp", 2, tiny + ["--tp", 2, "--sp"], one)
    same("pp2 zb m2", 2, tiny + ["--pp", 2, "--schedule", "zb", "--micro-batches", 2], one)
    same("cp2 ring", 2, tiny + ["--cp", 2])
    same("tiny-moe cp2 ulysses ep2", 2, ["--model", "tiny-moe", "--cp", 2, "--ep", 2, "--cp-impl", "ulysses"])
    bf16 = ["--precision", "bf16", "--comm-precision", "bf16"]
    same("dp2 zero1 bf16 comm", 2, tiny + ["--dp", 2, "--zero", 1] + bf16, tol=TOL_BF16)
    generate(*checkpoints())
    lt.done()


if __name__ == "__main__":
    main()
