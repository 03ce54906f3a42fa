#!/usr/bin/python3
"""Hugging Face directories in and out, through transformers.

usage: check_hf_roundtrip.py LOOM ORACLE_DUMP [--tol 1e-5]

For a Llama (grouped-query attention, untied head), a Mistral (sliding
window), a Qwen2 (q/k/v biases, tied head), a Mixtral (4 experts, top 2)
and a Qwen2-MoE (4 experts, top 2, a shared expert with a sigmoid gate)
made by transformers'
save_pretrained: `loom train --model DIR` trains 3 steps and writes
`--save-params OUT/`; transformers' from_pretrained must load OUT with no
missing, unexpected or mismatched keys, and check_hf_oracle's comparison
(loom reading OUT with --model OUT against transformers' model of OUT:
parameters, logits, loss, every gradient, one AdamW step) must hold within
tol. The trained parameters must also differ from the initial ones (the
directory really holds the trained model). A directory saved in shards
(model-0000K-of-0000N.safetensors + index) passes the same comparison.
Bad directories - no config.json, a model_type loom does not have, weights
whose shapes disagree with the config, an index naming a missing shard -
each exit with one message naming the cause and the documented code (66,
78, 65, 66). A Qwen2-MoE checkpoint exported by `loom export` loads in
from_pretrained and equals --save-params. Exit 1 on any failure.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_hf_oracle  # noqa: E402
import hf_models  # noqa: E402
import st  # noqa: E402

CASES = [
    ("llama", "llama", dict(num_key_value_heads=2)),
    ("mistral", "mistral", dict(num_key_value_heads=2, sliding_window=5)),
    ("qwen2", "qwen2", dict(num_key_value_heads=1, tie_word_embeddings=True)),
    ("mixtral", "mixtral", dict(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)),
    ("qwen2-moe", "qwen2_moe", hf_models.QWEN2_MOE),
]


def run_case(loom, dump_bin, tmp, data, name, arch, keys, tol):
    src = hf_models.make(os.path.join(tmp, name + "-in"), arch, vocab_size=256, **keys)
    out = os.path.join(tmp, name + "-out") + "/"
    p = subprocess.run([loom, "train", "--model", src, "--data", data, "--steps", "3", "--batch", "4", "--seq",
                        "16", "--lr", "1e-3", "--no-progress", "--quiet", "--save-params", out],
                       capture_output=True, text=True)
    if p.returncode != 0:
        print("%s: loom train failed (%d)\n%s%s" % (name, p.returncode, p.stdout, p.stderr))
        return 0, 1
    model, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    before = transformers.AutoModelForCausalLM.from_pretrained(src)
    moved = max(float((a - b).abs().max()) for a, b in zip(model.parameters(), before.parameters()))
    ok = fail = 0
    for what, good in (("loads with no missing/unexpected keys %s" % (bad or ""), not bad),
                       ("trained (max parameter change %.2e)" % moved, moved > 1e-4)):
        print("%-22s %-60s %s" % (name, what, "ok" if good else "FAIL"))
        ok += good
        fail += not good
    a, b = check_hf_oracle.check_dir(dump_bin, tmp, name, out, tol)
    return ok + a, fail + b


def sharded(dump_bin, tmp, tol):
    """A directory saved in 6 shards + model.safetensors.index.json: loom reads
    it as transformers does (check_hf_oracle's comparison on it)."""
    src = hf_models.make(os.path.join(tmp, "one-file"), "llama", num_key_value_heads=2, vocab_size=256)
    d = os.path.join(tmp, "sharded")
    transformers.AutoModelForCausalLM.from_pretrained(src).save_pretrained(d, max_shard_size="20KB",
                                                                           safe_serialization=True)
    n = len([f for f in os.listdir(d) if f.startswith("model-0000")])
    print("%-22s %-60s %s" % ("sharded", "%d shards written" % n, "ok" if n > 1 else "FAIL"))
    ok, bad = check_hf_oracle.check_dir(dump_bin, tmp, "sharded", d, tol)
    return ok + (n > 1), bad + (n <= 1), d


def bad_inputs(loom, tmp, data, shards):
    """Each bad directory: one message naming the cause, its exit code."""
    good = os.path.join(tmp, "llama-in")
    cases = []
    empty = os.path.join(tmp, "no-config")
    os.makedirs(empty)
    cases.append(("a directory without config.json", empty, 66, "without config.json"))
    arch = os.path.join(tmp, "gptj")
    shutil.copytree(good, arch)
    edit_config(arch, model_type="gptj")
    cases.append(("an architecture loom does not have", arch, 78, 'model_type "gptj"'))
    shape = os.path.join(tmp, "shape")
    shutil.copytree(good, shape)
    edit_config(shape, intermediate_size=64)
    cases.append(("weights whose shapes disagree", shape, 65, "needs [32, 64]"))
    missing = os.path.join(tmp, "missing-shard")
    shutil.copytree(shards, missing)
    gone = sorted(f for f in os.listdir(missing) if f.startswith("model-0000"))[1]
    os.remove(os.path.join(missing, gone))
    cases.append(("an index naming a missing file", missing, 66, gone))
    ok = fail = 0
    for what, d, code, needle in cases:
        p = subprocess.run([loom, "train", "--model", d, "--data", data, "--steps", "1", "--seq", "16",
                            "--no-progress"], capture_output=True, text=True)
        good_exit = p.returncode == code and needle in p.stderr and p.stderr.count("error:") == 1
        print("%-22s %-60s %s" % ("bad input", "%s: exit %d" % (what, p.returncode), "ok" if good_exit else "FAIL"))
        if not good_exit:
            print(p.stderr)
        ok += good_exit
        fail += not good_exit
    return ok, fail


def export_case(loom, tmp, data):
    """A Qwen2-MoE checkpoint (loom train --save-dir) exported by `loom export`
    loads in from_pretrained with no missing/unexpected keys, and holds the
    --save-params tensors bit for bit."""
    src = hf_models.make(os.path.join(tmp, "export-in"), "qwen2_moe", vocab_size=256, **hf_models.QWEN2_MOE)
    ck, saved, out = os.path.join(tmp, "ck"), os.path.join(tmp, "saved.safetensors"), os.path.join(tmp, "exported")
    p = subprocess.run([loom, "train", "--model", src, "--data", data, "--steps", "2", "--batch", "4", "--seq", "16",
                        "--no-progress", "--quiet", "--save-dir", ck, "--save-params", saved],
                       capture_output=True, text=True)
    os.makedirs(out)
    q = subprocess.run([loom, "export", ck, os.path.join(out, "model.safetensors")], capture_output=True, text=True)
    if p.returncode or q.returncode:
        print("export: loom failed\n%s%s%s%s" % (p.stdout, p.stderr, q.stdout, q.stderr))
        return 0, 1
    model, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    a, _ = st.load(saved)
    b, _ = st.load(os.path.join(out, "model.safetensors"))
    same = sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    ok = fail = 0
    for what, good in (("exported checkpoint loads (%s) %s" % (type(model).__name__, bad or ""), not bad),
                       ("exported tensors equal --save-params'", same)):
        print("%-22s %-60s %s" % ("export", what, "ok" if good else "FAIL"))
        ok += good
        fail += not good
    return ok, fail


def edit_config(d, **keys):
    path = os.path.join(d, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg.update(keys)
    with open(path, "w") as f:
        json.dump(cfg, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("loom")
    ap.add_argument("oracle_dump")
    ap.add_argument("--tol", type=float, default=1e-5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "train.bin")
        subprocess.run([args.loom, "data", "--input", "/usr/share/common-licenses/GPL-3", "--out", data, "--val",
                        ""], check=True, capture_output=True)
        for name, arch, keys in CASES:
            ok, bad = run_case(args.loom, args.oracle_dump, tmp, data, name, arch, keys, args.tol)
            passed += ok
            failed += bad
        ok, bad, shards = sharded(args.oracle_dump, tmp, args.tol)
        ok2, bad2 = bad_inputs(args.loom, tmp, data, shards)
        ok3, bad3 = export_case(args.loom, tmp, data)
        passed += ok + ok2 + ok3
        failed += bad + bad2 + bad3
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
