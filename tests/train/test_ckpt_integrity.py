#!/usr/bin/env python3
"""Checkpoints never resume, export or keep the wrong state (issue 31,
docs/checkpoints.md). From one 10-step run saving every 2 steps, copies of
its directory are put in the states a kill or an edit leaves, and each is
resumed through the real binary (one process, and 2 ranks under mpirun):

1. latest left behind (a kill between publishing step_N and replacing
   latest): --resume DIR takes the newest step that verifies, says so, and
   latest ends on the newest verified step - also when that step is the
   last and nothing is left to run (exit 64 then).
2. a damaged step_N: skipped on resume, then written again by the run
   (bitwise the bytes of the undamaged one), latest on the newest, export
   DIR the newest; a step_M.damaged a kill left is removed.
3. another run's directory: a fresh run (no --resume) with another --lr is
   refused (exit 64 naming lr and --overwrite) on every rank and changes
   nothing there, so does a fresh run of the same settings; --overwrite
   starts over.
4. the manifest: an edit (two shard keys swapped) without its own SHA-256
   is skipped like a damaged file; a re-signed one mapping keys to other
   tensors, or claiming another step or optimizer step, is refused (65)
   naming the file's own account; a 2^40-element shape is refused (65)
   naming the manifest, not exit 71 out of memory.
Resumed runs end bitwise equal to the straight run (losses and parameters)."""
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import ckptlib  # noqa: E402
import loomtest as lt  # noqa: E402
import numpy as np  # noqa: E402

COMMON = ["--steps", 10, "--batch", 4, "--seq", 16, "--lr", "1e-3", "--warmup", 2, "--seed", 5,
          "--peak-flops", "1e11", "--no-progress"]


def snapshot(d):
    """Every file under d with its SHA-256."""
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def losses(path):
    return {m["step"]: m["loss"] for m in lt.read_metrics(path)}


def copy(src, tmp, name, drop=(), latest=None):
    d = os.path.join(tmp, name)
    shutil.copytree(src, d)
    for s in drop:
        shutil.rmtree(os.path.join(d, "step_%d" % s))
    if latest is not None:
        with open(os.path.join(d, "latest"), "w") as f:
            f.write("step_%d\n" % latest)
    return d


def resumed_from(out):
    m = re.search(r"resumed from (\S+) at step (\d+)", out)
    return (os.path.basename(m.group(1)), int(m.group(2))) if m else None


def same_as_straight(label, straight, m, p):
    a, b = losses(straight[0]), losses(m)
    lt.check(all(b[s] == a[s] for s in b), "%s: resumed losses not bitwise equal" % label)
    pa, _ = lt.st.load(straight[1])
    pb, _ = lt.st.load(p)
    lt.check(sorted(pa) == sorted(pb) and all(np.array_equal(pa[k], pb[k]) for k in pa),
             "%s: final parameters not bitwise equal to the straight run" % label)


def resume(tmp, tag, common, d, np_=None, extra=()):
    m, p = os.path.join(tmp, tag + ".jsonl"), os.path.join(tmp, tag + ".safetensors")
    r = lt.run(["train"] + common + ["--resume", d, "--save-dir", d, "--save-every", 2, "--metrics", m,
                                     "--save-params", p] + list(extra), np=np_, check_ok=False)
    return r, m, p


def edit_manifest(ck, fn, resign=True):
    path = os.path.join(ck, "manifest.json")
    with open(path) as f:
        man = json.load(f)
    fn(man)
    text = json.dumps(man, indent=1)
    with open(path, "w") as f:
        f.write(ckptlib.sign(text) if resign else text)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        model = lt.write_model(tmp, n_layer=2, n_head=2, n_embd=32, vocab_size=256, n_positions=32)
        common = ["--model", model, "--data", data] + COMMON
        ck0 = os.path.join(tmp, "ck0")
        straight = lt.train(tmp, "straight", None, common + ["--save-dir", ck0, "--save-every", 2])
        lt.check(ckptlib.published(ck0) == [2, 4, 6, 8, 10] and ckptlib.latest(ck0) == "step_10",
                 "straight run: %s, latest %s" % (ckptlib.published(ck0), ckptlib.latest(ck0)))

        # 1. latest behind: the reproduction (every step there, latest on step_6)
        d = copy(ck0, tmp, "c1", latest=6)
        r, _, _ = resume(tmp, "c1", common, d)
        err = r.stdout + r.stderr
        lt.check(r.returncode == 64 and "nothing left of --steps 10" in err and "latest names step_6" in err,
                 "1: resume of a finished run with latest behind: exit %d\n%s" % (r.returncode, err[-800:]))
        lt.check(ckptlib.latest(d) == "step_10", "1: latest %s, want step_10" % ckptlib.latest(d))
        # ... and killed after publishing step_8, before latest moved on from step_4
        d = copy(ck0, tmp, "c1b", drop=[10], latest=4)
        r, m, p = resume(tmp, "c1b", common, d)
        lt.check(r.returncode == 0 and resumed_from(r.stdout + r.stderr) == ("step_8", 8),
                 "1b: exit %d, resumed from %s" % (r.returncode, resumed_from(r.stdout + r.stderr)))
        lt.check(sorted(losses(m)) == [9, 10], "1b: steps run %s" % sorted(losses(m)))
        same_as_straight("1b", straight, m, p)
        lt.check(ckptlib.latest(d) == "step_10", "1b: latest %s" % ckptlib.latest(d))

        # 2. a damaged step_8 (latest names it): skipped, then written again
        d = copy(ck0, tmp, "c2", drop=[10], latest=8)
        ckptlib.flip_byte(os.path.join(d, "step_8", "rank_00000.safetensors"), 7, 0x10)
        os.makedirs(os.path.join(d, "step_4.damaged"))  # as a kill inside an earlier rewrite leaves
        with open(os.path.join(d, "step_4.damaged", "manifest.json"), "w") as f:
            f.write("{}")
        r, m, p = resume(tmp, "c2", common, d)
        err = r.stdout + r.stderr
        lt.check(r.returncode == 0 and resumed_from(err) == ("step_6", 6) and "writing it again" in err,
                 "2: exit %d, resumed from %s\n%s" % (r.returncode, resumed_from(err), err[-800:]))
        same_as_straight("2", straight, m, p)
        lt.check(ckptlib.verifies(os.path.join(d, "step_8")), "2: step_8 was not written again")
        lt.check(snapshot(os.path.join(d, "step_8")) == snapshot(os.path.join(ck0, "step_8")),
                 "2: the rewritten step_8 differs from the undamaged one")
        lt.check(ckptlib.latest(d) == "step_10" and not any(n.endswith(".damaged") for n in os.listdir(d)),
                 "2: latest %s, left %s" % (ckptlib.latest(d), sorted(os.listdir(d))))
        exp = os.path.join(tmp, "exp2", "model.safetensors")
        os.makedirs(os.path.dirname(exp))
        lt.run(["export", d, exp])
        _, meta = lt.st.load(exp)
        lt.check(meta.get("step") == "10", "2: export DIR took step %s" % meta.get("step"))

        # 3. another run's directory, on 2 ranks through mpirun
        d = copy(ck0, tmp, "c3")
        before = snapshot(d)
        other = [a if a != "1e-3" else "2e-3" for a in common] + ["--dp", 2, "--save-dir", d, "--save-every", 2]
        r = lt.run(["train"] + other, np=2, check_ok=False)
        err = r.stderr
        lt.check(r.returncode == 64 and "holds the checkpoints of another run" in err and "(--lr)" in err
                 and "--overwrite" in err, "3: another run: exit %d\n%s" % (r.returncode, err[-800:]))
        lt.check(snapshot(d) == before, "3: the refused run changed the directory")
        r = lt.run(["train"] + common + ["--save-dir", d, "--save-every", 2], check_ok=False)
        lt.check(r.returncode == 64 and "already holds this run's checkpoints" in r.stderr,
                 "3: a fresh run of the same settings: exit %d\n%s" % (r.returncode, r.stderr[-800:]))
        lt.check(snapshot(d) == before, "3: the refused fresh run changed the directory")
        r = lt.run(["train"] + other + ["--overwrite"], np=2, check_ok=False)
        lt.check(r.returncode == 0, "3: --overwrite: exit %d\n%s" % (r.returncode, r.stderr[-800:]))
        ids = {ckptlib.manifest(os.path.join(d, "step_%d" % s))["run"]["id"] for s in ckptlib.published(d)}
        old = ckptlib.manifest(os.path.join(ck0, "step_10"))["run"]["id"]
        with open(os.path.join(d, "run.json")) as f:
            rj = json.load(f)
        lt.check(ckptlib.published(d) == [2, 4, 6, 8, 10] and len(ids) == 1 and old not in ids
                 and rj["id"] in ids and ckptlib.latest(d) == "step_10",
                 "3: after --overwrite: %s, ids %s, latest %s" % (ckptlib.published(d), ids, ckptlib.latest(d)))

        # 4. the manifest: an unsigned edit is a damaged checkpoint
        d = copy(ck0, tmp, "c4", drop=[10], latest=8)

        def swap_keys(man):
            a, b = man["shards"][0], man["shards"][1]
            a["key"], b["key"] = b["key"], a["key"]
        edit_manifest(os.path.join(d, "step_8"), swap_keys, resign=False)
        r, m, p = resume(tmp, "c4", common, d)
        err = r.stdout + r.stderr
        lt.check(r.returncode == 0 and resumed_from(err) == ("step_6", 6) and "own SHA-256 does not match" in err,
                 "4: unsigned edit: exit %d, resumed from %s\n%s" % (r.returncode, resumed_from(err), err[-800:]))
        same_as_straight("4", straight, m, p)
        lt.check(ckptlib.verifies(os.path.join(d, "step_8")), "4: the edited step_8 was not written again")
        # re-signed edits: the rank files' own account refuses them
        cases = [("keys swapped", swap_keys, "does not belong to these files"),
                 ("step", lambda man: man.update(step=6), "written at step 8"),
                 ("optimizer_steps", lambda man: man.update(optimizer_steps=7), "optimizer step 8"),
                 ("2^40 elements", lambda man: man["tensors"][sorted(man["tensors"])[0]].update(
                     shape=[1048576, 1048576]), "manifest.json")]
        for i, (label, fn, want) in enumerate(cases):
            e = copy(ck0, tmp, "c4_%d" % i, drop=[10], latest=8)
            edit_manifest(os.path.join(e, "step_8"), fn)
            r, _, _ = resume(tmp, "c4_%d" % i, common, os.path.join(e, "step_8"))
            lt.check(r.returncode == 65 and want in r.stderr,
                     "4: re-signed %s: exit %d, want 65 and '%s'\n%s" % (label, r.returncode, want, r.stderr[-800:]))
            print("4: re-signed %s: exit %d: %s" % (label, r.returncode, r.stderr.strip().splitlines()[-1][:200]))
    lt.done()


if __name__ == "__main__":
    main()
