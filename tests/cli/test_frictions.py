"""test_frictions.py - the small frictions of issue 36, each fixed:

  unsaved    `loom train` without --save-params / --save-dir warns that the
             trained parameters were not saved; with either it does not;
  inputs     `loom data --input` takes a directory (its files in name order),
             a glob, @LIST and - (standard input), and more than 64 files:
             each gives the same shard as the files named one by one / the
             concatenated bytes;
  quiet      --quiet prints no MoE warnings (errors only), which the same
             run without it prints;
  banner     a one-rank run prints no empty "collectives per step" table; a
             two-rank run prints the table with its rows;
  ids        `loom generate` without a tokenizer shows ids >= 256 as <|id|>,
             never '?': the text equals the ids (bytes below 256);
  port       `loom serve` on a port in use fails with one line naming that
             port and the OS's reason (never "port 0").
"""
import json
import os
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402

FAST = ["--model", "tiny", "--steps", "2", "--batch", "2", "--seq", "16", "--peak-flops", "1e9"]


def errors(text):
    return [line for line in text.splitlines() if line.startswith("loom: error") or "rror" in line]


def unsaved(tmp, data):
    p = lt.run(["train", "--data", data] + FAST)
    lt.check("were not saved" in p.stderr and "--save-params" in p.stderr, "unsaved run warns: %s" % p.stderr[-400:])
    p = lt.run(["train", "--data", data, "--save-params", os.path.join(tmp, "p.safetensors")] + FAST)
    lt.check("not saved" not in p.stderr, "a saved run does not warn")


def shard(path):
    with open(path, "rb") as f:
        return f.read()[1024:]  # the tokens after the 256 x int32 header


def inputs(tmp):
    d = os.path.join(tmp, "texts")
    os.makedirs(d)
    names = []
    for i in range(70):  # more than the 64 --input flags the command took
        n = os.path.join(d, "doc%03d.txt" % i)
        with open(n, "w") as f:
            f.write("document %d: %s\n" % (i, "abc " * (i % 7 + 1)))
        names.append(n)
    want = b"".join(open(n, "rb").read() for n in names)
    lst = os.path.join(tmp, "list.txt")
    with open(lst, "w") as f:
        f.write("# the documents\n\n" + "\n".join(names) + "\n")

    def build(tag, args, stdin=None):
        out = os.path.join(tmp, tag + ".bin")
        p = subprocess.run([lt.LOOM, "data", "--out", out, "--val", ""] + args, input=stdin, capture_output=True,
                           timeout=120)
        lt.check(p.returncode == 0, "loom data %s: exit %d %s" % (tag, p.returncode, p.stderr.decode()[-300:]))
        return shard(out) if p.returncode == 0 else b""

    def as_tokens(b):  # byte-level shards hold uint16 tokens
        return bytes(b[i] for i in range(0, len(b), 2))

    lt.check(as_tokens(build("dir", ["--input", d])) == want, "--input DIR: its files in name order")
    lt.check(as_tokens(build("glob", ["--input", os.path.join(d, "doc0*.txt")])) == want, "--input GLOB")
    lt.check(as_tokens(build("list", ["--input", "@" + lst])) == want, "--input @LIST")
    lt.check(as_tokens(build("stdin", ["--input", "-"], stdin=want)) == want, "--input - (standard input)")
    many = []
    for n in names:
        many += ["--input", n]
    lt.check(as_tokens(build("many", many)) == want, "70 --input flags")
    p = subprocess.run([lt.LOOM, "data", "--out", os.path.join(tmp, "x.bin"), "--input", os.path.join(d, "*.none")],
                       capture_output=True, text=True, timeout=60)
    lt.check(p.returncode == 66 and "matches no file" in p.stderr, "a glob with no match: 66 (%d)" % p.returncode)


def quiet(data):
    moe = ["train", "--data", data, "--model", "tiny-moe", "--steps", "2", "--batch", "2", "--seq", "16",
           "--peak-flops", "1e9", "--moe-warn-imbalance", "1.0"]
    p = lt.run(moe)
    lt.check("warning" in p.stderr, "without --quiet the MoE imbalance warning shows")
    p = lt.run(moe + ["--quiet"])
    lt.check(p.stderr.strip() == "" and p.stdout.strip() == "", "--quiet prints nothing: %r" % p.stderr[-300:])


def banner(data):
    p = lt.run(["train", "--data", data] + FAST)
    lt.check("collectives per step" not in p.stderr, "one rank: no empty collectives table")
    p = lt.run(["train", "--data", data, "--dp", "2"] + FAST, np=2)
    lt.check("collectives per step" in p.stderr and "allreduce" in p.stderr, "two ranks: the table with rows")


def ids(tmp, data):
    cfg = os.path.join(tmp, "v1024.json")
    with open(cfg, "w") as f:
        json.dump({"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 1024,
                   "n_positions": 64}, f)
    params = os.path.join(tmp, "v1024.safetensors")
    lt.run(["train", "--data", data, "--model", cfg, "--steps", "1", "--batch", "2", "--seq", "16",
            "--peak-flops", "1e9", "--save-params", params])
    gen = ["generate", "--model", cfg, "--load-params", params, "--ids", "72,105", "--max-tokens", "24", "--stop",
           "none"]
    got = [int(x) for x in lt.run(gen + ["--format", "ids"]).stdout.split()]
    text = lt.run(gen).stdout.rstrip("\n").encode("latin-1", "replace")
    want = b"".join(bytes([i]) if i < 256 else b"<|%d|>" % i for i in got)
    lt.check(any(i >= 256 for i in got), "the model generated ids >= 256: %s" % got)
    lt.check(text == want and b"?" not in want, "text without a tokenizer: %r, ids %s" % (text[:80], got))


def port(tmp, data):
    params = os.path.join(tmp, "tiny.safetensors")
    lt.run(["train", "--data", data, "--save-params", params] + FAST)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    busy = s.getsockname()[1]
    try:
        p = lt.run(["serve", "--model", "tiny", "--load-params", params, "--port", str(busy)], check_ok=False,
                   timeout=120)
    finally:
        s.close()
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    lt.check(p.returncode == 69, "port in use: exit %d" % p.returncode)
    err = [ln for ln in lines if "listen" in ln or "bind" in ln.lower() or "port" in ln]
    lt.check(len(err) == 1 and str(busy) in err[0] and "in use" in err[0].lower() and "to port 0" not in p.stderr,
             "one line naming port %d and the reason: %s" % (busy, lines))


def main():
    tmp = tempfile.mkdtemp(prefix="loom-frictions-")
    data = lt.make_text_data(tmp)
    unsaved(tmp, data)
    inputs(tmp)
    quiet(data)
    banner(data)
    ids(tmp, data)
    port(tmp, data)
    lt.done()


if __name__ == "__main__":
    main()
