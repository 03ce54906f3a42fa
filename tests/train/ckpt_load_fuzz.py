#!/usr/bin/env python3
"""In-process manifest fuzzing (issue 31), CI-sized: a dp2 ZeRO-1 checkpoint
written by `loom train` through loomrun, then tests/train/ckpt_load_fuzz.c
(one process, the trainer's own loom_ckpt_load) loads it ITERATIONS times
with the manifest mutated together with its rank files, re-hashed and
re-signed; each load must equal the untouched one bit for bit or be
refused. The long run is the same with more iterations:

    ckpt_load_fuzz.py HARNESS [--iterations N] [--seed S]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("harness")
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=31)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        model = lt.write_model(tmp, n_layer=1, n_head=2, n_embd=8, vocab_size=256, n_positions=8)
        ck = os.path.join(tmp, "ck")
        train = ["train", "--model", model, "--data", data, "--steps", "8", "--batch", "4", "--seq", "8",
                 "--lr", "1e-3", "--seed", "5", "--peak-flops", "1e11", "--no-progress", "--quiet"]
        lt.run(train + ["--dp", "2", "--zero", "1", "--save-dir", ck, "--save-every", "3"], np=2)
        step = os.path.join(ck, "step_3")
        lt.check(os.path.isfile(os.path.join(step, "manifest.json")), "no checkpoint step_3 written")
        p = subprocess.run([a.harness, step, model, data, "8", "4", "8", "1e-3", "5", str(a.iterations),
                            str(a.seed), tmp], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        print(p.stdout + p.stderr[-4000:])
        lt.check(p.returncode == 0, "ckpt_load_fuzz exit %d" % p.returncode)
        lt.check(" 0 wrong state accepted" in p.stdout, "a wrong state was accepted")
        m = re.search(r"(\d+) loaded equal, (\d+) refused, (\d+) wrong", p.stdout)
        c = re.search(r"(\d+) of (\d+) seen as different", p.stdout)
        lt.check(m is not None and int(m.group(1)) > 0 and int(m.group(2)) > 0 and m.group(3) == "0",
                 "want loads equal and refusals, none wrong: %s" % p.stdout)
        lt.check(c is not None and int(c.group(2)) > 0 and c.group(1) == c.group(2),
                 "want every control seen as another state: %s" % p.stdout)
    lt.done()


if __name__ == "__main__":
    main()
