#!/usr/bin/env python3
"""Checkpoints (docs/checkpoints.md): exact resume and resharding.

Same layout, bit-exact: for dp2 zero2, tp2 sp, pp2 zb, pp2 zbv (V
placement: rank 0 holds the first and the last stage) and dp2 x tp2 x pp2
zero1 on 8 ranks, 20 steps straight (saving at step 10 and 20) against
10 + --resume DIR/step_10 + 10: the losses of steps 11..20 and every final
parameter are bitwise equal.

Any other layout: the step-10 checkpoints of those runs (and of a one-rank
run) are resumed under a different layout and world size (8 -> 4 -> 1 -> 8
among them, every pair changes dp, tp, pp, zero or sp): each rank reads only
the shards it needs; the 10 resumed losses and the final parameters agree
with the uninterrupted one-rank run within 1e-5.

loom export of the 8-rank checkpoint equals that run's --save-params
bitwise, and its config.json loads in `loom eval`. --keep 2 leaves the two
newest checkpoints, latest and run.json; --save-dir naming a file is exit 73 before
any step.

Also: the manifest names every file with a SHA-256 that matches the bytes
(computed here with hashlib), every global element of every tensor is held
by exactly one shard per kind, --resume DIR picks the newest step that
verifies, and a
mismatched --lr is refused with exit 64 naming it."""
import hashlib
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import ckptlib  # noqa: E402
import loomtest as lt  # noqa: E402
import numpy as np  # noqa: E402

COMMON = ["--steps", 20, "--batch", 8, "--seq", 16, "--lr", "1e-3", "--warmup", 2, "--seed", 9,
          "--peak-flops", "1e11", "--no-progress", "--quiet"]

LAYOUTS = {  # name: (ranks, flags)
    "one": (None, []),
    "dp2z2": (2, ["--dp", 2, "--zero", 2]),
    "tp2sp": (2, ["--tp", 2, "--sp"]),
    "pp2zb": (2, ["--pp", 2, "--schedule", "zb", "--micro-batches", 4]),
    "pp2zbv": (2, ["--pp", 2, "--schedule", "zbv", "--micro-batches", 4]),  # V: rank 0 holds both ends
    "3d8": (8, ["--dp", 2, "--tp", 2, "--pp", 2, "--zero", 1]),
    "cp2z3": (2, ["--cp", 2, "--zero", 3]),  # ZeRO shards over dp x cp
}
# (saved under, resumed under): world sizes 8->4, 4->1, 1->8, 2->4, 2->2, 2->4, 8->2,
# across cp: 2->4, 2->2, and pp2 zbv (V placement) -> one rank
RESHARD = [
    ("3d8", (4, ["--dp", 4, "--zero", 3])),
    ("dp2z2", (None, [])),
    ("one", (8, ["--dp", 2, "--tp", 2, "--pp", 2, "--zero", 2, "--sp", "--schedule", "zb"])),
    ("tp2sp", (4, ["--dp", 2, "--pp", 2, "--zero", 2, "--schedule", "1f1b"])),
    ("dp2z2", (2, ["--tp", 2])),
    ("pp2zb", (4, ["--dp", 2, "--tp", 2, "--zero", 3, "--sp"])),
    ("3d8", (2, ["--pp", 2, "--schedule", "interleaved", "--virtual-stages", 2, "--micro-batches", 4])),
    ("cp2z3", (4, ["--dp", 2, "--cp", 2, "--zero", 1, "--cp-impl", "ulysses"])),
    ("dp2z2", (2, ["--cp", 2, "--zero", 2])),
    ("pp2zbv", (None, [])),
]


def losses(path):
    return {m["step"]: m["loss"] for m in lt.read_metrics(path)}


def check_manifest(ck, label):
    with open(os.path.join(ck, "manifest.json")) as f:
        text = f.read()
    man = json.loads(text)
    lt.check(ckptlib.manifest_hash_ok(text), "%s: the manifest's own SHA-256 does not match" % label)
    lt.check(man["step"] == 10 and man["optimizer_steps"] == 10, "%s: manifest step %s" % (label, man["step"]))
    for fe in man["files"]:
        with open(os.path.join(ck, fe["file"]), "rb") as f:
            h = hashlib.sha256(f.read()).hexdigest()
        lt.check(h == fe["sha256"], "%s: %s sha256 %s, manifest %s" % (label, fe["file"], h, fe["sha256"]))
    for name, t in man["tensors"].items():
        numel = int(np.prod(t["shape"]))
        for kind in ("param", "exp_avg", "exp_avg_sq"):
            cover = np.zeros(numel, dtype=np.int64)
            for sh in man["shards"]:
                if sh["tensor"] != name or sh["kind"] != kind:
                    continue
                for start, ln, stride, count in sh["runs"]:
                    for c in range(count):
                        cover[start + c * stride: start + c * stride + ln] += 1
            lt.check(bool(np.all(cover == 1)), "%s: %s %s covered %d..%d times" % (label, kind, name, cover.min(), cover.max()))


def main():
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        model = lt.write_model(tmp, n_layer=4, n_head=4, n_embd=32, vocab_size=256, n_positions=32)
        common = ["--model", model, "--data", data] + COMMON
        out = {}
        for name, (np_, flags) in LAYOUTS.items():
            ck = os.path.join(tmp, "ck_" + name)
            m, p = lt.train(tmp, name + "_straight", np_, common + flags + ["--save-dir", ck, "--save-every", 10])
            out[name] = (m, p, ck)
            check_manifest(os.path.join(ck, "step_10"), name)
            if name == "one":
                continue
            rm, rp = lt.train(tmp, name + "_resumed", np_, common + flags + ["--resume", os.path.join(ck, "step_10")])
            a, b = losses(m), losses(rm)
            lt.check(sorted(b) == list(range(11, 21)), "%s: resumed steps %s" % (name, sorted(b)))
            lt.check(all(b[s] == a[s] for s in b), "%s: resumed losses not bitwise equal: %s" % (
                name, [(s, a[s], b[s]) for s in b if a[s] != b[s]]))
            pa, _ = lt.st.load(p)
            pb, _ = lt.st.load(rp)
            diff = [k for k in pa if not np.array_equal(pa[k], pb[k])]
            lt.check(not diff, "%s: final parameters not bitwise equal: %s" % (name, diff[:5]))
            print("%s: 10 resumed steps and final parameters bitwise equal" % name)
        # loom export: the 8-rank checkpoint at step 20 consolidated equals that
        # run's --save-params bitwise, and its config.json loads
        exp = os.path.join(tmp, "export", "model.safetensors")
        os.makedirs(os.path.dirname(exp))
        lt.run(["export", os.path.join(out["3d8"][2], "step_20"), exp])
        pa, _ = lt.st.load(out["3d8"][1])
        pb, meta = lt.st.load(exp)
        lt.check(sorted(pa) == sorted(pb) and all(np.array_equal(pa[k], pb[k]) for k in pa),
                 "export differs from --save-params")
        lt.check(meta.get("step") == "20", "export metadata %s" % meta)
        ev = lt.run(["eval", "--model", os.path.join(tmp, "export", "config.json"), "--load-params", exp,
                     "--data", data, "--batch", 2, "--seq", 16])
        lt.check("loss " in ev.stdout, "eval of the export: %s" % ev.stdout)
        ref_m, ref_p, _ = out["one"]
        ref = losses(ref_m)
        # --resume DIR: DIR/latest names step_20; a flipped byte in one of its
        # files fails the hash, so step_10 is chosen (3d8); with latest and
        # step_20 gone, the newest step_N is (dp2z2)
        ck = out["3d8"][2]
        ckptlib.flip_byte(os.path.join(ck, "step_20", "rank_00003.safetensors"), 5)
        ck = out["dp2z2"][2]
        os.remove(os.path.join(ck, "latest"))
        for f in os.listdir(os.path.join(ck, "step_20")):
            os.remove(os.path.join(ck, "step_20", f))
        os.rmdir(os.path.join(ck, "step_20"))
        for i, (src, (np_, flags)) in enumerate(RESHARD):
            label = "%s -> %s on %s ranks" % (src, " ".join(map(str, flags)) or "one rank", np_ or 1)
            ck = out[src][2]
            if src not in ("3d8", "dp2z2"):  # the two whose DIR resolves to step_10
                ck = os.path.join(ck, "step_10")
            rm, rp = lt.train(tmp, "reshard%d" % i, np_, common + flags + ["--resume", ck])
            got = losses(rm)
            lt.check(sorted(got) == list(range(11, 21)), "%s: steps %s" % (label, sorted(got)))
            worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in got)
            lt.check(worst <= 1e-5, "%s: worst loss rel err %.2e" % (label, worst))
            pa, _ = lt.st.load(ref_p)
            pb, _ = lt.st.load(rp)
            wp = max(lt.l2_rel_err(pb[k], pa[k]) for k in pa)
            lt.check(wp <= 1e-5, "%s: worst parameter rel err %.2e" % (label, wp))
            print("%s: worst loss rel err %.2e, parameter %.2e" % (label, worst, wp))
        # --keep 2 with a checkpoint every step: only the two newest remain
        kd = os.path.join(tmp, "ck_keep")
        lt.run(["train"] + common + ["--steps", 5, "--save-dir", kd, "--save-every", 1, "--keep", 2])
        left = sorted(os.listdir(kd))
        lt.check(left == ["latest", "run.json", "step_4", "step_5"], "--keep 2 left %s" % left)
        with open(os.path.join(kd, "latest")) as f:
            lt.check(f.read().strip() == "step_5", "--keep 2: latest does not name step_5")
        # --save-dir naming a file: refused before training (73), the file untouched
        f = os.path.join(tmp, "a_file")
        with open(f, "w") as fh:
            fh.write("keep")
        bad = lt.run(["train"] + common + ["--steps", 2, "--save-dir", f], check_ok=False)
        lt.check(bad.returncode == 73 and "--save-dir" in bad.stderr and open(f).read() == "keep",
                 "--save-dir FILE: exit %d, %s" % (bad.returncode, bad.stderr.strip()))
        # a run that cannot continue the saved one is refused before any step
        bad = lt.run(["train"] + common + ["--lr", "2e-3", "--resume", out["one"][2]], check_ok=False)
        lt.check(bad.returncode == 64 and "lr" in bad.stderr, "mismatched --lr: exit %d, %s" % (bad.returncode, bad.stderr.strip()))
    print("total %.1f s" % (time.time() - t0))
    lt.done()


if __name__ == "__main__":
    main()
