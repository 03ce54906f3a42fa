#!/usr/bin/env python3
"""Manifest fuzzer with consistent rank files (issue 31): a checkpoint whose
manifest (and rank files' own accounts) were changed and then made
consistent again - every rank file's SHA-256 and size in the manifest
recomputed, the manifest re-signed - so neither hash catches the change and
only loom's cross-checks can. Every mutation must either load exactly what
the untouched checkpoint loads, or be refused with a clear message
("loom: error: ...") and a documented non-zero exit code; never load other
state with exit 0, never crash.

    ckpt_manifest_fuzz.py [--iterations N] [--resumes M] [--seed S]

(defaults 200, 6, 31: about a minute here; ctest train_ckpt_manifest_fuzz)

A dp2 ZeRO-1 run of a tiny model saves step_2 (of 3 steps). Two oracles,
mutations of run state (step, optimizer step, schedule, data cursor, rng,
layout, run, version, format, a rank file's step) by the second:
 - `loom export CKPT OUT` (parameters): exit 0 must give bytes equal to the
   untouched checkpoint's export;
 - `loom train --resume CKPT` for the last step on one rank (parameters,
   AdamW moments, step, optimizer step, schedule, data cursor): exit 0 must
   give the same final parameters and loss as resuming the untouched one.
Mutations (seeded): a shard's tensor, kind, file, key, numel, range or runs
changed, swapped with another shard's, dropped or duplicated; a tensor's
shape or dtype, or dropped; step, optimizer_steps, lr_schedule, data_cursor,
rng, layout, run id, version; a file entry's size, rank or name; a rank file's account of a key
(tensor, kind, numel, bounds, runs hash) or its step, rewritten in its
safetensors metadata. Not done: changing a manifest shard and the rank
file's account of it the same way, which is as good as writing other data
(the hashes catch damage and edits, they are no signature against a forger).
Before mutating, the harness checks itself: the manifest re-serialized and
re-signed without a change loads equal under both oracles.
"""
import argparse
import copy
import hashlib
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402

REFUSALS = (64, 65, 66, 74)  # usage, data, no input, I/O (loom --help)
TRAIN = ["--model", "tiny", "--seq", "16", "--batch", "4", "--steps", "3", "--no-progress", "--quiet",
         "--peak-flops", "1e11"]
HASH_KEY = "manifest_sha256"
STATE = ("step", "optimizer_steps", "lr_schedule", "data_cursor", "rng", "layout", "run", "version", "format")


def sign(m):
    """The manifest text with its own SHA-256 (of the text with the 64 digits as zeros), last."""
    m = {k: v for k, v in m.items() if k != HASH_KEY}
    m[HASH_KEY] = "0" * 64
    text = json.dumps(m, indent=1)
    return text.replace("0" * 64, hashlib.sha256(text.encode()).hexdigest(), 1) if text.count("0" * 64) == 1 \
        else None


def read_st(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def write_st(path, header, data):
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def write_ckpt(src, dst, manifest, rank_meta):
    """DST: SRC's rank files (those in rank_meta with that metadata) and the
    manifest, every file's SHA-256 and size recomputed, signed."""
    os.makedirs(dst)
    m = copy.deepcopy(manifest)
    for f in os.listdir(src):
        if f.startswith("rank_"):
            if f in rank_meta:
                h, data = read_st(os.path.join(src, f))
                h["__metadata__"] = rank_meta[f]
                write_st(os.path.join(dst, f), h, data)
            else:
                shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    files = m.get("files")
    for e in files if isinstance(files, list) else []:
        p = os.path.join(dst, str(e.get("file", "")))
        if isinstance(e, dict) and os.path.isfile(p) and not e.get("_keep"):
            b = open(p, "rb").read()
            e["sha256"], e["bytes"] = hashlib.sha256(b).hexdigest(), len(b)
        if isinstance(e, dict):
            e.pop("_keep", None)
    text = sign(m)
    if text is None:
        return False
    with open(os.path.join(dst, "manifest.json"), "w") as f:
        f.write(text)
    return True


def perturb(rng, v):
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return rng.choice([v + 1, v - 1, v * 2, 0, -1, 1 << 40])
    if isinstance(v, float):
        return rng.choice([v * 2, v + 1e-3, 0.0, -v])
    if isinstance(v, str):
        return rng.choice([v + "x", "", v[:-1], "s999"])
    if isinstance(v, list) and v:
        v = list(v)
        i = rng.randrange(len(v))
        v[i] = perturb(rng, v[i])
        return v
    return 7


def mutate(rng, m, meta):
    """One mutation of manifest m and rank metadata meta (in place); its name."""
    shards, tensors = m["shards"], m["tensors"]
    kind = rng.randrange(10)
    if kind <= 2:  # one shard field
        s = rng.choice(shards)
        field = rng.choice(["tensor", "kind", "file", "key", "numel", "range", "runs"])
        if field == "tensor":
            s[field] = rng.choice(list(tensors) + ["nope"])
        elif field == "kind":
            s[field] = rng.choice(["param", "exp_avg", "exp_avg_sq", "grad"])
        elif field == "file":
            s[field] = rng.choice(sorted(meta) + ["rank_00009.safetensors"])
        elif field == "key":
            keys = [k for k in meta.get(s["file"], {}) if k.startswith("s")]
            s[field] = rng.choice(keys + ["s999"])
        else:
            s[field] = perturb(rng, s[field]) if field != "runs" else [perturb(rng, r) for r in s[field]]
        return "shard." + field
    if kind == 3:  # swap a field of two shards
        a, b = rng.sample(shards, 2)
        field = rng.choice(["tensor", "kind", "key", "runs", "range", "file"])
        a[field], b[field] = b[field], a[field]
        return "swap." + field
    if kind == 4:  # drop or duplicate a shard
        i = rng.randrange(len(shards))
        if rng.random() < 0.5:
            shards.pop(i)
            return "shard.drop"
        shards.append(copy.deepcopy(shards[i]))
        return "shard.dup"
    if kind == 5:  # a tensor entry
        name = rng.choice(list(tensors))
        r = rng.random()
        if r < 0.2:
            del tensors[name]
            return "tensor.drop"
        if r < 0.4:
            tensors[name]["dtype"] = rng.choice(["F16", "BF16", "F64", "I32"])
            return "tensor.dtype"
        tensors[name]["shape"] = perturb(rng, tensors[name]["shape"])
        return "tensor.shape"
    if kind == 6:  # run state and identity
        key = rng.choice(["step", "optimizer_steps", "lr_schedule", "data_cursor", "rng", "layout", "run",
                          "version", "format"])
        v = m.get(key)
        if isinstance(v, dict):
            sub = rng.choice(list(v))
            v[sub] = perturb(rng, v[sub]) if not isinstance(v[sub], dict) else 3
            return key + "." + sub
        m[key] = perturb(rng, v)
        return key
    if kind == 7:  # a file entry's size or rank (its hash is not recomputed then)
        e = rng.choice(m["files"])
        field = rng.choice(["bytes", "rank", "file"])
        e[field] = perturb(rng, e[field])
        e["_keep"] = True
        return "file." + field
    # a rank file's own account of a key, or its step
    f = rng.choice(sorted(meta))
    md = meta[f]
    k = rng.choice(list(md))
    if k.startswith("s"):
        parts = md[k].split(" ")
        i = rng.randrange(len(parts))
        if i == 0:
            parts[0] = rng.choice(list(tensors))
        elif i == 1:
            parts[1] = rng.choice(["param", "exp_avg", "exp_avg_sq"])
        elif i < 5:
            parts[i] = str(perturb(rng, int(parts[i])))
        else:
            parts[i] = "%016x" % rng.getrandbits(64)
        md[k] = " ".join(parts)
        return "account.%d" % i
    md[k] = str(perturb(rng, int(md[k])) if md[k].lstrip("-").isdigit() else md[k] + "x")
    return "account." + k


def export(ckpt, out):
    r = subprocess.run([lt.LOOM, "export", ckpt, out], capture_output=True, text=True, timeout=120)
    return r.returncode, r.stderr, open(out, "rb").read() if r.returncode == 0 else None


def resume(ckpt, data, tmp, tag):
    p, mt = os.path.join(tmp, tag + ".safetensors"), os.path.join(tmp, tag + ".jsonl")
    r = subprocess.run([lt.LOOM, "train"] + TRAIN + ["--data", data, "--resume", ckpt, "--save-params", p,
                                                     "--metrics", mt], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return r.returncode, r.stderr, None
    rows = [json.loads(l) for l in open(mt) if '"step"' in l]
    return 0, r.stderr, (open(p, "rb").read(), [(x["step"], x.get("loss")) for x in rows])


def judge(label, how, got, want, counts):
    rc, err, out = got
    if rc == 0:
        ok = out == want
        counts["equal" if ok else "WRONG"] += 1
        lt.check(ok, "%s (%s): exit 0 but the state loaded differs from the untouched checkpoint's" % (label, how))
    else:
        clear = rc in REFUSALS and "loom: error:" in err
        counts["refused"] += 1
        lt.check(clear, "%s (%s): exit %d without a clear refusal:\n%s" % (label, how, rc, err[-1500:]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=200, help="mutations judged by an export")
    ap.add_argument("--resumes", type=int, default=6, help="mutations of run state judged by a resume")
    ap.add_argument("--seed", type=int, default=31)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        ck = os.path.join(tmp, "ck")
        lt.run(["train"] + TRAIN + ["--data", data, "--dp", "2", "--zero", "1", "--save-dir", ck,
                                    "--save-every", "2"], np=2)
        src = os.path.join(ck, "step_2")
        manifest = json.load(open(os.path.join(src, "manifest.json")))
        meta = {f: read_st(os.path.join(src, f))[0]["__metadata__"] for f in os.listdir(src) if f.startswith("rank_")}
        lt.check(len(meta) == 2 and len(manifest["shards"]) > 10, "step_2: %d rank files, %d shards"
                 % (len(meta), len(manifest["shards"])))
        ref_export = export(src, os.path.join(tmp, "ref.safetensors"))
        ref_resume = resume(src, data, tmp, "ref")
        lt.check(ref_export[0] == 0 and ref_resume[0] == 0, "the untouched checkpoint: export %d, resume %d\n%s"
                 % (ref_export[0], ref_resume[0], ref_export[1] + ref_resume[1]))
        # the harness itself: re-serialized and re-signed, unchanged, loads equal
        same = os.path.join(tmp, "same")
        lt.check(write_ckpt(src, same, manifest, meta), "re-signing the untouched manifest")
        counts = {"equal": 0, "refused": 0, "WRONG": 0}
        judge("unchanged", "export", export(same, os.path.join(tmp, "x.safetensors")), ref_export[2], counts)
        judge("unchanged", "resume", resume(same, data, tmp, "same"), ref_resume[2], counts)
        lt.check(counts["equal"] == 2, "the re-signed untouched checkpoint did not load equal: %s" % counts)
        kinds, exports, resumes, tries = {}, 0, 0, 0
        while (exports < a.iterations or resumes < a.resumes) and tries < 50 * (a.iterations + a.resumes):
            tries += 1
            m, md = copy.deepcopy(manifest), copy.deepcopy(meta)
            name = mutate(rng, m, md)
            # run state the export does not read (step, schedule, data, rng, run): judged by a resume
            state = name.split(".")[0] in STATE or name in ("account.loom_step", "account.loom_optimizer_steps")
            if (state and resumes >= a.resumes) or (not state and exports >= a.iterations):
                continue
            d = os.path.join(tmp, "m%d" % tries)
            if not write_ckpt(src, d, m, md):
                continue
            label = "mutation %d %s" % (tries, name)
            if state:
                judge(label, "resume", resume(d, data, tmp, "r"), ref_resume[2], counts)
                resumes += 1
            else:
                judge(label, "export", export(d, os.path.join(tmp, "x.safetensors")), ref_export[2], counts)
                exports += 1
            kinds[name] = kinds.get(name, 0) + 1
            shutil.rmtree(d)
        print("%d mutations (%d exported, %d resumed), seed %d: %s" % (sum(kinds.values()), exports, resumes, a.seed,
                                                                    counts))
        print("kinds: %s" % ", ".join("%s %d" % kv for kv in sorted(kinds.items())))
    lt.done()


if __name__ == "__main__":
    main()
