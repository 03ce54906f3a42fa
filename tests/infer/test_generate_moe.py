#!/usr/bin/python3
"""test_generate_moe.py - `loom generate` on Mixture-of-Experts models against
the PyTorch oracle and across layouts (the block forward training runs).

Two MoE models are trained 200 steps by `loom train` on GPL-3 text and saved
as safetensors: the built-in tiny-moe (4 experts, top-2, renormalised gates,
every block MoE) and a config.json with Mixtral's keys (num_local_experts 4,
num_experts_per_tok 1, moe_layer_freq 2, moe_intermediate_size 48,
norm_topk_prob false: one dense and one MoE block). For 12 prompts of real
text and 32 greedy tokens each:
  - the oracle (tests/oracle/torch_gpt2.py, float64, dropless routing: the
    whole sequence recomputed for every new token) picks the same tokens, and
    its last-prompt-position logits agree with loom's within 1e-4;
  - the KV-cached decode agrees with recomputing each sequence (--check-kv)
    within 1e-4;
  - ep=2, tp=2, pp=2, ep=2 x tp=2 and ep=2 x pp=2 under mpirun give the same
    tokens as one rank, and logits within 1e-4;
  - bad input: --ep 2 on a dense model, and --ep 3 that does not divide 4
    experts, exit 64 naming the numbers.
"""
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import loomtest as lt  # noqa: E402

import numpy as np  # noqa: E402

N_PROMPTS, NEW, V = 12, 32, 256
MIXTRAL = {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": V, "n_positions": 128,
           "num_local_experts": 4, "num_experts_per_tok": 1, "moe_layer_freq": 2, "moe_intermediate_size": 48,
           "norm_topk_prob": False, "router_aux_loss_coef": 0.01}


def prompts():
    text = open("/usr/share/common-licenses/GPL-3", "rb").read()
    return [list(text[700 + i * 1301:700 + i * 1301 + 6 + (i * 7) % 31]) for i in range(N_PROMPTS)]


def generate(tmp, model, params, ids_file, np_=None, extra=(), tag="r"):
    logits = os.path.join(tmp, "logits_%s.bin" % tag)
    p = lt.run(["generate", "--model", model, "--load-params", params, "--ids-file", ids_file, "--max-tokens", NEW,
                "--format", "ids", "--logits-out", logits, "--threads", 1] + list(extra), np=np_)
    ids = [[int(t) for t in line.split()] for line in p.stdout.strip().splitlines()]
    return ids, np.fromfile(logits, dtype=np.float32).reshape(-1, V), p.stderr


def oracle(params, cfg_kw):
    """Greedy continuation and last-prompt logits from the float64 oracle."""
    import torch
    import torch_gpt2 as tg
    keys = {"n_layer", "n_head", "n_embd", "vocab_size", "n_positions"}
    cfg = tg.Config(**{k: v for k, v in cfg_kw.items() if k in keys}, **cfg_kw.get("moe", {}))
    p = tg.params_from_numpy(lt.st.load(params)[0], cfg, dtype=torch.float64, requires_grad=False)

    def run(prompt):
        seq, first = list(prompt), None
        with torch.no_grad():
            for _ in range(NEW):
                logits, _ = tg.forward(p, cfg, torch.tensor([seq]))
                last = logits[0, -1]
                first = last.numpy() if first is None else first
                seq.append(int(torch.argmax(last)))
        return seq[len(prompt):], first
    return run


def check_model(tmp, data, name, model, cfg_kw):
    params = os.path.join(tmp, name + ".safetensors")
    lt.run(["train", "--model", model, "--data", data, "--steps", 200, "--lr", "3e-3", "--warmup", 20, "--batch", 8,
            "--seq", 64, "--threads", 1, "--save-params", params])
    ps = prompts()
    ids_file = os.path.join(tmp, name + "_prompts.txt")
    with open(ids_file, "w") as f:
        f.write("".join(",".join(map(str, q)) + "\n" for q in ps))
    ids1, logits1, err = generate(tmp, model, params, ids_file, extra=["--check-kv"], tag=name + "1")
    lt.check(len(ids1) == N_PROMPTS and all(len(x) == NEW for x in ids1), "%s: %d outputs" % (name, len(ids1)))
    m = re.search(r"logit difference ([0-9.e+-]+|nan)", err)
    kv = float(m.group(1)) if m else float("nan")
    print("%s: KV-cached decode vs recomputed prefix: max |logit diff| %.3g" % (name, kv))
    lt.check(kv <= 1e-4, "%s: KV decode differs from recomputing the prefix by %g" % (name, kv))

    run = oracle(params, cfg_kw)
    same, worst = 0, 0.0
    for j, q in enumerate(ps):
        ref, ref_logits = run(q)
        worst = max(worst, float(np.max(np.abs(ref_logits - logits1[j]))))
        same += ref == ids1[j]
        if ref != ids1[j]:
            print("prompt %d: oracle %s\n          loom   %s" % (j, ref[:16], ids1[j][:16]))
    print("%s: greedy tokens identical to the PyTorch oracle on %d/%d prompts; last-position logits max |diff| %.3g"
          % (name, same, N_PROMPTS, worst))
    lt.check(same == N_PROMPTS, "%s: greedy tokens differ from the oracle on %d prompts" % (name, N_PROMPTS - same))
    lt.check(worst <= 1e-4, "%s: last-position logits differ from the oracle by %g" % (name, worst))
    distinct = len({tuple(x) for x in ids1})
    lt.check(distinct >= 3, "%s: only %d distinct continuations: the test would not discriminate" % (name, distinct))

    for np_, extra in ((2, ["--ep", "2"]), (2, ["--tp", "2"]), (2, ["--pp", "2"]), (4, ["--ep", "2", "--tp", "2"]),
                       (4, ["--ep", "2", "--pp", "2"])):
        tag = name + "_" + "_".join(extra).replace("-", "")
        ids, logits, _ = generate(tmp, model, params, ids_file, np_=np_, extra=extra, tag=tag)
        diff = float(np.max(np.abs(logits - logits1))) if logits.shape == logits1.shape else float("inf")
        print("%s %s: tokens %s one rank's; logits max |diff| %.3g" % (name, " ".join(extra),
                                                                      "identical to" if ids == ids1 else "DIFFER from",
                                                                      diff))
        lt.check(ids == ids1, "%s %s: tokens differ from one rank" % (name, " ".join(extra)))
        lt.check(diff <= 1e-4, "%s %s: logits differ from one rank by %g" % (name, " ".join(extra), diff))
    return params, ids_file


def main():
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, os.path.join(lt.SRC, "tests", "oracle"))
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        base = {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": V, "n_positions": 128}
        params, ids_file = check_model(tmp, data, "tiny-moe", "tiny-moe", dict(base, moe={
            "n_expert": 4, "top_k": 2, "norm_topk": True}))
        cfg = os.path.join(tmp, "mixtral_keys.json")
        with open(cfg, "w") as f:
            json.dump(MIXTRAL, f)
        check_model(tmp, data, "mixtral-keys", cfg, dict(base, moe={
            "n_expert": 4, "top_k": 1, "moe_every": 2, "expert_hidden": 48, "norm_topk": False}))

        dense = os.path.join(tmp, "tiny.safetensors")
        lt.run(["train", "--model", "tiny", "--data", data, "--steps", 2, "--batch", 8, "--seq", 32, "--threads", 1,
                "--save-params", dense])
        for model, p, np_, ep, want in (("tiny", dense, 2, "2", "--ep 2 needs a Mixture-of-Experts model"),
                                        ("tiny-moe", params, 3, "3", "--ep 3 does not divide num_local_experts=4")):
            r = lt.run(["generate", "--model", model, "--load-params", p, "--ids-file", ids_file, "--max-tokens", 2,
                        "--ep", ep, "--threads", 1], np=np_, check_ok=False)
            lt.check(r.returncode == 64 and want in r.stderr, "--ep %s on %s: exit %d, %r" % (
                ep, model, r.returncode, r.stderr[-300:]))
    lt.done()


if __name__ == "__main__":
    main()
