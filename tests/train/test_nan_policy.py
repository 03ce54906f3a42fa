#!/usr/bin/env python3
"""--nan-policy (docs/checkpoints.md). With --lr 1e30 and no clipping, the
first update makes every later loss and gradient non-finite.

skip: the run finishes (exit 0), steps 2 and 3 are logged with
"skipped": true and null loss, and the final parameters are bitwise those
of a 1-step run (a skipped step changes nothing; the LR of step 1 is the
same in both). abort (the default): exit 65 at step 2, nothing saved,
naming the first parameter (whole-model order) whose gradient is
non-finite - the same name on one rank and on dp2 zero3 / pp2 (where the
tensor is sharded or held by one stage)."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402
import numpy as np  # noqa: E402


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        model = lt.write_model(tmp, n_layer=2, n_head=4, n_embd=32, vocab_size=256, n_positions=32)
        common = ["--model", model, "--data", data, "--batch", 8, "--seq", 16, "--lr", "1e30",
                  "--grad-clip", 0, "--seed", 9, "--peak-flops", "1e11", "--no-progress"]
        _, p1 = lt.train(tmp, "one_step", None, common + ["--steps", 1])
        m3, p3 = lt.train(tmp, "skip", None, common + ["--steps", 3, "--nan-policy", "skip"])
        ms = lt.read_metrics(m3)
        lt.check([m["skipped"] for m in ms] == [False, True, True], "skipped flags %s" % [m["skipped"] for m in ms])
        lt.check(ms[1]["loss"] is None and ms[0]["loss"] > 0, "losses %s" % [m["loss"] for m in ms])
        a, _ = lt.st.load(p1)
        b, _ = lt.st.load(p3)
        lt.check(all(np.array_equal(a[k], b[k]) for k in a), "skipped steps changed the parameters")
        names = []
        for ranks, flags in ((None, []), (2, ["--dp", 2, "--zero", 3]), (2, ["--pp", 2])):
            out = os.path.join(tmp, "abort.safetensors")
            p = lt.run(["train"] + common + flags + ["--steps", 3, "--save-params", out], np=ranks, check_ok=False)
            lt.check(p.returncode == 65, "abort %s: exit %d" % (flags, p.returncode))
            lt.check(not os.path.exists(out), "abort %s: parameters written" % flags)
            line = [x for x in p.stderr.splitlines() if "first non-finite gradient in" in x]
            lt.check(len(line) == 1 and "step 2" in line[0], "abort %s: message %s" % (flags, p.stderr[-600:]))
            names.append(line[0].split("first non-finite gradient in ")[1].split(")")[0] if line else None)
        lt.check(len(set(names)) == 1 and names[0] == "wte.weight", "named %s" % names)
        print("skip: 2 steps skipped, parameters unchanged; abort names %s" % names)
    lt.done()


if __name__ == "__main__":
    main()
