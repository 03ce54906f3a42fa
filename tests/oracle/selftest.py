#!/usr/bin/python3
"""Self-test of the oracle checker, no loom needed.

Cases (each runs make_fake_dump.py then check_oracle.py as separate processes):
  pass      float32-torch dump                       -> exit 0, "N passed, 0 failed"
  pass-big  same with T = n_positions, 3 layers      -> exit 0
  fail      one gradient perturbed by 1e-3 relative  -> exit 1, exactly that tensor FAILs
  missing   one parameter tensor left out            -> exit 2, message names it
  truncated file cut short                           -> exit 2
Also round-trips every supported dtype through st.py, and cross-checks
torch_gpt2.forward against a GPT-2 assembled from torch.nn.TransformerEncoderLayer
(PyTorch's own attention; pre-LN, tanh GELU) in float64. Exit 0 if all cases behave.
"""

import os
import re
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PY = "/usr/bin/python3"
sys.path.insert(0, HERE)
import st  # noqa: E402

failures = []


def run(*args):
    p = subprocess.run([PY] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True)
    return p.returncode, p.stdout


def expect(case, cond, out=""):
    print("%-10s %s" % (case, "ok" if cond else "FAILED"))
    if not cond:
        failures.append(case)
        print(out)


def make(path, *extra):
    rc, out = run(os.path.join(HERE, "make_fake_dump.py"), path, *extra)
    if rc != 0:
        print(out)
        sys.exit("selftest: make_fake_dump.py %s failed (exit %d)" % (" ".join(extra), rc))


def check(path):
    return run(os.path.join(HERE, "check_oracle.py"), path)


def roundtrip(tmp):
    rng = np.random.default_rng(0)
    tensors = {
        "f64": rng.normal(size=(2, 3)), "f32": rng.normal(size=(4,)).astype(np.float32),
        "f16": rng.normal(size=(3, 1, 2)).astype(np.float16),
        "i32": rng.integers(-5, 5, size=(5,), dtype=np.int32),
        "i64": np.array(7, dtype=np.int64), "u16": np.arange(6, dtype=np.uint16).reshape(2, 3),
        "u8": np.arange(3, dtype=np.uint8), "empty": np.zeros((0, 4), np.float32),
    }
    path = os.path.join(tmp, "rt.safetensors")
    st.save(path, tensors, {"k": "v"})
    got, meta = st.load(path)
    ok = meta == {"k": "v"} and set(got) == set(tensors)
    ok = ok and all(got[k].dtype == v.dtype and got[k].shape == v.shape and np.array_equal(got[k], v)
                    for k, v in tensors.items())
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
    expect("roundtrip", ok and n % 8 == 0)


def crosscheck():
    """torch_gpt2.forward vs the same weights in nn.TransformerEncoderLayer blocks."""
    import torch
    import torch.nn.functional as F
    import torch_gpt2
    torch.manual_seed(0)
    cfg = torch_gpt2.Config(n_layer=2, n_head=4, n_embd=32, vocab_size=41, n_positions=20)
    arrs = torch_gpt2.init_params(cfg, seed=5, dtype=np.float64, random_affine=True)
    p = torch_gpt2.params_from_numpy(arrs, cfg, torch.float64, requires_grad=False)
    B, T, C = 2, 17, cfg.n_embd
    idx = torch.randint(0, cfg.vocab_size, (B, T))
    ours, _ = torch_gpt2.forward(p, cfg, idx)

    x = p["wte.weight"][idx] + p["wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    for i in range(cfg.n_layer):
        h = "h.%d." % i
        layer = torch.nn.TransformerEncoderLayer(
            C, cfg.n_head, dim_feedforward=4 * C, dropout=0.0, layer_norm_eps=1e-5,
            activation=lambda t: F.gelu(t, approximate="tanh"), batch_first=True,
            norm_first=True).double()
        with torch.no_grad():  # nn.Linear stores (out, in): transpose the Conv1D weights
            layer.self_attn.in_proj_weight.copy_(p[h + "attn.c_attn.weight"].t())
            layer.self_attn.in_proj_bias.copy_(p[h + "attn.c_attn.bias"])
            layer.self_attn.out_proj.weight.copy_(p[h + "attn.c_proj.weight"].t())
            layer.self_attn.out_proj.bias.copy_(p[h + "attn.c_proj.bias"])
            layer.linear1.weight.copy_(p[h + "mlp.c_fc.weight"].t())
            layer.linear1.bias.copy_(p[h + "mlp.c_fc.bias"])
            layer.linear2.weight.copy_(p[h + "mlp.c_proj.weight"].t())
            layer.linear2.bias.copy_(p[h + "mlp.c_proj.bias"])
            layer.norm1.weight.copy_(p[h + "ln_1.weight"])
            layer.norm1.bias.copy_(p[h + "ln_1.bias"])
            layer.norm2.weight.copy_(p[h + "ln_2.weight"])
            layer.norm2.bias.copy_(p[h + "ln_2.bias"])
            x = layer(x, src_mask=mask)
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    theirs = x @ p["wte.weight"].t()
    err = float((ours - theirs).abs().max() / theirs.abs().max())
    expect("crosscheck", err < 1e-12, "max-norm relative error %.3e" % err)


def main():
    with tempfile.TemporaryDirectory(prefix="oracle_selftest_") as tmp:
        roundtrip(tmp)
        crosscheck()

        good = os.path.join(tmp, "good.safetensors")
        make(good)
        rc, out = check(good)
        expect("pass", rc == 0 and re.search(r"^\d+ passed, 0 failed$", out.splitlines()[-1]), out)

        big = os.path.join(tmp, "big.safetensors")
        make(big, "--n-layer", "3", "--n-head", "2", "--n-embd", "48", "--vocab", "50",
             "--n-positions", "40", "-B", "2", "-T", "40", "--seed", "3")
        rc, out = check(big)
        expect("pass-big", rc == 0 and out.splitlines()[-1].endswith(" passed, 0 failed"), out)

        target = "h.1.mlp.c_fc.weight"
        bad = os.path.join(tmp, "bad.safetensors")
        make(bad, "--perturb-grad", target, "--perturb-rel", "1e-3")
        rc, out = check(bad)
        failed = [l.split()[0] for l in out.splitlines() if l.endswith("FAIL")]
        expect("fail", rc == 1 and failed == ["grad." + target]
               and out.splitlines()[-1].endswith(" passed, 1 failed"), out)

        missing = os.path.join(tmp, "missing.safetensors")
        make(missing, "--drop", "param.h.0.attn.c_proj.bias")
        rc, out = check(missing)
        expect("missing", rc == 2 and "param.h.0.attn.c_proj.bias" in out, out)

        trunc = os.path.join(tmp, "trunc.safetensors")
        with open(good, "rb") as f:
            data = f.read()
        with open(trunc, "wb") as f:
            f.write(data[:len(data) // 2])
        rc, out = check(trunc)
        expect("truncated", rc == 2 and "check_oracle:" in out, out)

    if failures:
        print("selftest: %d case(s) misbehaved: %s" % (len(failures), ", ".join(failures)))
        return 1
    print("selftest: all cases behaved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
