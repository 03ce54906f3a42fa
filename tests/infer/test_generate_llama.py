#!/usr/bin/python3
"""test_generate_llama.py - `loom generate` of Llama-family directories
against transformers' generate.

Tiny random models saved by transformers' save_pretrained - a Llama (4
query heads over 2 key/value heads, untied head), a Mistral whose sliding
window (6) is shorter than the sequences, a Mixtral (4 experts, top 2) and
a Qwen2-MoE (4 experts, top 2, a shared expert) -
continue 6 prompts of 3..20 ids for 24 greedy tokens with `loom generate
--model DIR` (its weights loaded as from_pretrained does): the tokens must equal transformers'
generate(do_sample=False) (float64, eager attention), and the last-position
logits of each prompt must agree within 1e-4 (absolute). The same runs at
tp 2 (the key/value heads split), tp 4 (replicated), pp 2 and, for Mixtral,
ep 2 give the same tokens as one rank.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import loomtest as lt  # noqa: E402

sys.path.insert(0, os.path.join(lt.SRC, "tests", "oracle"))
import hf_models  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

NEW, V = 24, 256
CASES = [  # name, arch, config keys, layouts (ranks, flags)
    ("llama", "llama", dict(num_key_value_heads=2),
     [(2, ["--tp", 2]), (4, ["--tp", 4]), (2, ["--pp", 2])]),
    ("mistral", "mistral", dict(num_key_value_heads=2, sliding_window=6), [(2, ["--tp", 2])]),
    ("mixtral", "mixtral", dict(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
     [(2, ["--ep", 2]), (2, ["--tp", 2])]),
    ("qwen2-moe", "qwen2_moe", hf_models.QWEN2_MOE, [(2, ["--tp", 2])]),
]


def prompts():
    rng = np.random.default_rng(3)
    return [list(rng.integers(0, V, size=n)) for n in (3, 5, 8, 11, 16, 20)]


def loom_generate(tmp, d, ps, np_=None, flags=()):
    args = ["generate", "--model", d, "--max-tokens", NEW, "--format", "ids", "--stop",
            "none", "--logits-out", os.path.join(tmp, "logits.bin")] + list(flags)
    for p in ps:
        args += ["--ids", ",".join(str(int(t)) for t in p)]
    out = lt.run(args, np=np_).stdout.strip().splitlines()
    logits = np.fromfile(os.path.join(tmp, "logits.bin"), dtype=np.float32).reshape(len(ps), -1)
    return [[int(t) for t in line.split()] for line in out], logits


def torch_generate(d, ps):
    model = hf_models.load(d)
    model.generation_config.eos_token_id = None  # every token, as loom's --stop none
    toks, last = [], []
    with torch.no_grad():
        for p in ps:
            ids = torch.tensor([p], dtype=torch.int64)
            # the mask said outright: generate would infer one from a pad id, and 0 is a token here
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False,
                                 pad_token_id=0)
            toks.append([int(t) for t in out[0, len(p):]])
            last.append(model(ids).logits[0, -1].numpy())
    return toks, np.array(last)


def main():
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)  # transformers' float64 masks need it under torch 1.13
    ps = prompts()
    with tempfile.TemporaryDirectory() as tmp:
        for name, arch, keys, layouts in CASES:
            d = hf_models.make(os.path.join(tmp, name), arch, vocab_size=V, **keys)
            ref, ref_logits = torch_generate(d, ps)
            got, logits = loom_generate(tmp, d, ps)
            lt.check(got == ref, "%s: greedy tokens differ from transformers:\n%s\n%s" % (name, got, ref))
            err = float(np.max(np.abs(logits - ref_logits)))
            lt.check(err <= 1e-4, "%s: last-position logits differ by %.2e" % (name, err))
            print("%s: %d prompts x %d tokens as transformers, logits within %.2e" % (name, len(ps), NEW, err))
            for np_, flags in layouts:
                run, _ = loom_generate(tmp, d, ps, np_, flags)
                label = "%s %s" % (name, " ".join(str(f) for f in flags))
                lt.check(run == got, "%s: tokens differ from one rank" % label)
                print("%s: same tokens as one rank" % label)
    lt.done()


if __name__ == "__main__":
    main()
