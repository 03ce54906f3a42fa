#!/usr/bin/env python3
"""Invariant 5: bad input never crashes and never destroys.

Every bad layout, flag, data file, config, parameter file and numerical
blow-up given to the real `loom` binary (on one rank, and on several ranks
under the project's launcher) must
  - exit with the documented sysexits code (64 usage, 65 bad data, 66 missing
    input, 73 cannot create output, 78 bad config),
  - print one error line naming the problem (the flag, file, key, tensor and
    the numbers involved), once, however many ranks there are,
  - not crash (no signal, no sanitizer report),
and files that existed before (parameters, metrics, data shards) must be
byte-identical afterwards."""
import hashlib
import json
import os
import re
import struct
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402
import numpy as np  # noqa: E402

st = lt.st  # tests/oracle/st.py: numpy safetensors reader/writer

FAST = ["--model", "tiny", "--steps", 1, "--batch", 2, "--seq", 16, "--peak-flops", "1e11",
        "--no-progress"]
CRASH = ("Segmentation", "AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer",
         "runtime error:", "core dumped", "Abort", "SIGSEGV", "SIGABRT", "SIGBUS", "Bus error",
         "signal 11", "signal 6", "MPI_ABORT", "Traceback")
ERROR_TAG = "loom: error:"
WORKERS = 4


def tail(text, n=15):
    return "\n".join(text.splitlines()[-n:])


def no_crash(label, p):
    out = p.stdout + p.stderr
    hits = [c for c in CRASH if c in out]
    lt.check(not hits and p.returncode >= 0 and p.returncode < 128,
             "%s: crashed (exit %d, %s)\n%s" % (label, p.returncode, hits, tail(out)))


def judge(label, p, code, needles, ranks=None):
    """Check one finished run: the exit code, exactly one error line (however
    many ranks) holding every needle, and no crash."""
    err = p.stderr
    lt.check(p.returncode == code, "%s: exit %d, expected %d\n%s" % (label, p.returncode, code, tail(err)))
    errors = [line for line in err.splitlines() if ERROR_TAG in line]
    lt.check(len(errors) == 1, "%s: %d error lines, expected exactly 1 (ranks=%s):\n%s"
             % (label, len(errors), ranks, "\n".join(errors)))
    msg = errors[0] if errors else ""
    for n in needles:
        lt.check(str(n) in msg, "%s: error message lacks %r: %r" % (label, str(n), msg))
    no_crash(label, p)
    return p


def expect(label, args, code, needles, ranks=None):
    """Run loom ARGS (on `ranks` ranks under the launcher) and judge it."""
    return judge(label, lt.run(args, np=ranks, check_ok=False, timeout=120), code, needles, ranks)


def expect_all(cases):
    """Independent cases (label, args, code, needles[, np]) run concurrently -
    an MPI launch costs seconds of waiting, little CPU - and are judged in
    order. Only for cases that neither write nor read each other's files."""
    cases = [c if len(c) == 5 else tuple(c) + (None,) for c in cases]
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        procs = list(pool.map(lambda c: lt.run(c[1], np=c[4], check_ok=False, timeout=120), cases))
    for (label, _, code, needles, ranks), p in zip(cases, procs):
        judge(label, p, code, needles, ranks)
    return procs


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def write_text(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def write_shard(path, tokens, version):
    hdr = np.zeros(256, np.int32)
    hdr[:3] = (20240520, version, len(tokens))
    body = np.asarray(tokens, dtype=np.uint16 if version == 1 else np.uint32)
    with open(path, "wb") as f:
        f.write(hdr.tobytes() + body.tobytes())
    return path


def shard_tokens(path):
    with open(path, "rb") as f:
        return int(np.frombuffer(f.read(12), np.int32)[2])


def model_config(path, **kw):
    cfg = {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "n_positions": 128}
    cfg.update(kw)
    return write_text(path, json.dumps({k: v for k, v in cfg.items() if v is not None}))


# ---- 1. layouts ---------------------------------------------------------

def layouts(data):
    d = ["--data", data] + FAST
    cases = [
        ("dp=3 on 2 ranks", ["train", "--dp", 3] + d, 64, ["dp=3", "has 2 ranks"], 2),
        ("dp=2 on 4 ranks", ["train", "--dp", 2] + d, 64, ["dp=2", "has 4 ranks"], 4),
        ("dp=2 on 1 rank", ["train", "--dp", 2] + d, 64, ["dp=2", "has 1 rank"]),
        ("dp=2 batch 3", ["train"] + d + ["--dp", 2, "--batch", 3], 64, ["dp=2", "--batch 3"], 2),
        ("cp=3 ulysses heads", ["train"] + d + ["--cp", 3, "--seq", 12, "--cp-impl", "ulysses"], 64, ["cp=3", "n_head=4", "tp=1"], 3),
        ("pp=2 x v=2 with 2 layers", ["train", "--pp", 2, "--virtual-stages", 2, "--schedule", "interleaved"] + d, 64, ["pp=2", "2 layers"], 2),
        ("pp=2 unknown schedule", ["train", "--pp", 2, "--schedule", "zigzag"] + d, 64, ["zigzag"], 2),
        ("pp=2 grad-accum", ["train", "--pp", 2, "--grad-accum", 2] + d, 64, ["--grad-accum 2", "--micro-batches"], 2),
        ("interleaved m not divisible", ["train"] + d + ["--model", "mini", "--pp", 2, "--virtual-stages", 2, "--schedule", "interleaved", "--micro-batches", 3, "--batch", 6], 64, ["pp=2", "got 3"], 2),
        ("tp=2 on 1 rank", ["train", "--tp", 2] + d, 64, ["tp=2"]),
        ("tp=3 does not divide n_head", ["train", "--tp", 3, "--dp", 1] + d, 64, ["tp=3", "n_head=4"], 3),
        ("sp without tp", ["train", "--sp"] + d, 64, ["--sp"]),
        ("sp with seq not divisible by tp", ["train", "--tp", 2, "--sp"] + d + ["--seq", 15], 64, ["tp=2", "--seq 15"], 2),
        ("mesh order tp,dp", ["train", "--mesh-order", "tp,dp"] + d, 64, ["tp,dp"]),
        ("mesh order xx", ["train", "--mesh-order", "tp,cp,xx,pp"] + d, 64, ["'xx'"]),
        ("mesh order twice", ["train", "--mesh-order", "tp,dp,dp,pp"] + d, 64, ["dp", "twice"]),
        ("dp=0", ["train", "--dp", 0] + d, 64, ["dp=0"]),
        ("dp=-2", ["train", "--dp", -2] + d, 64, ["dp=-2"]),
        ("ep=3", ["train", "--ep", 3] + d, 64, ["ep=3"]),
        ("ep=2 dense model", ["train", "--dp", 2, "--ep", 2] + d, 64, ["--ep 2", "dense"], 2),
        ("ep=3 does not divide experts", ["train", "--dp", 3, "--ep", 3] + d + ["--model", "tiny-moe"], 64,
         ["--ep 3", "num_local_experts=4"], 3),
        ("moe tp=3", ["train", "--tp", 3] + d + ["--model", "tiny-moe", "--seq", 15], 64,
         ["tp=3"], 3),
        ("dp=1 on 2 ranks", ["train", "--dp", 1] + d, 64, ["dp=1", "= 1 rank, but the job has 2 ranks"], 2),
    ]
    procs = dict(zip([c[0] for c in cases], expect_all(cases)))
    for label, p in procs.items():  # one rank is "1 rank"
        lt.check("1 ranks" not in p.stderr, "%s: says '1 ranks':\n%s" % (label, tail(p.stderr)))


# ---- 2. flags -----------------------------------------------------------

def flags(data):
    d = ["--data", data] + FAST
    expect_all([
        ("unknown flag", ["train", "--bogus"] + d, 64, ["--bogus"]),
        ("unknown flag, 2 ranks", ["train", "--bogus", 1] + d, 64, ["--bogus"], 2),
        ("missing value", ["train"] + d + ["--steps"], 64, ["--steps", "needs a value"]),
        ("non-numeric steps", ["train"] + d + ["--steps", "abc"], 64, ["--steps", "abc"]),
        ("steps out of range", ["train"] + d + ["--steps", "99999999999"], 64, ["--steps", "99999999999"]),
        ("steps 0", ["train"] + d + ["--steps", 0], 64, ["--steps 0"]),
        ("lr nan", ["train"] + d + ["--lr", "nan"], 64, ["--lr", "nan"]),
        ("lr negative", ["train"] + d + ["--lr", "-1"], 64, ["--lr -1"]),
        ("seq > n_positions", ["train"] + d + ["--seq", 1000], 64, ["--seq 1000", "n_positions=128"]),
        ("unknown model", ["train"] + d + ["--model", "nosuch"], 64,
             ["nosuch", "tiny", "mini", "gpt2-small", "gpt2-xl"]),
        ("flag with a value", ["train"] + d + ["--no-progress=yes"], 64, ["--no-progress", "yes"]),
        ("negative threads", ["train"] + d + ["--threads", -1], 64, ["--threads -1"]),
        ("negative peak flops", ["train"] + d + ["--peak-flops", -5], 64, ["--peak-flops -5"]),
        ("stray argument", ["train", "extra"] + d, 64, ["'extra'"]),
        ("eval unknown flag", ["eval", "--bogus"], 64, ["--bogus"]),
        ("data unknown flag", ["data", "--bogus"], 64, ["--bogus"]),
        ("unknown command", ["frobnicate"], 64, ["frobnicate", "train"]),
    ])


# ---- 3. data ------------------------------------------------------------

def data_files(tmp, data):
    raw = open(data, "rb").read()
    n = shard_tokens(data)
    cut = 7
    trunc = os.path.join(tmp, "trunc.bin")
    open(trunc, "wb").write(raw[:-cut])
    magic = os.path.join(tmp, "magic.bin")
    open(magic, "wb").write(struct.pack("<i", 12345) + raw[4:])
    short = write_shard(os.path.join(tmp, "short.bin"), list(range(10)), 1)
    toks = list(np.arange(200) % 256)
    toks[77] = 300
    vocab = write_shard(os.path.join(tmp, "vocab.bin"), toks, 2)
    negative = os.path.join(tmp, "negative.bin")
    with open(negative, "wb") as f:
        f.write(np.array([20240520, 1, -5] + [0] * 253, np.int32).tobytes() + b"\0" * 20)
    garbage = os.path.join(tmp, "garbage.bin")
    open(garbage, "wb").write(b"hello")
    missing = os.path.join(tmp, "nosuch.bin")

    def tr(path):
        return ["train", "--data", path] + FAST

    out = os.path.join(tmp, "never.bin")
    empty = os.path.join(tmp, "emptydir")  # a directory is read for its files: none is an error
    os.makedirs(empty, exist_ok=True)
    expect_all([
        ("missing data", tr(missing), 66, [missing]),
        ("truncated data", tr(trunc), 65, [trunc, 2 * n, 2 * n - cut]),
        ("truncated data, 2 ranks", tr(trunc) + ["--dp", 2], 65, [trunc, 2 * n, 2 * n - cut], 2),
        ("bad magic", tr(magic), 65, [magic, "12345", "20240520"]),
        ("short shard", tr(short), 65, [short, "10 tokens", "17"]),
        ("token >= vocab", tr(vocab), 65, [vocab, "300", "256"]),
        ("token >= vocab, 2 ranks", tr(vocab) + ["--dp", 2], 65, [vocab, "300"], 2),
        ("garbage shard", tr(garbage), 65, [garbage, "5 bytes"]),
        ("negative token count", tr(negative), 65, [negative, "-5 tokens"]),
        ("data is a directory", tr(tmp), 66, [tmp]),
        ("data missing input", ["data", "--input", "/nonexistent", "--out", out, "--val", ""], 66,
         ["/nonexistent"]),
        ("data input is an empty directory", ["data", "--input", empty, "--out", out, "--val", ""], 66,
         [empty, "no files"]),
        ("data empty input", ["data", "--input", "/dev/null", "--out", out, "--val", ""], 65, ["no bytes"]),
        ("data val-fraction 2", ["data", "--input", data, "--out", out, "--val-fraction", 2], 64,
         ["--val-fraction 2"]),
    ])
    lt.check(not os.path.exists(out) and not os.path.exists(out + ".tmp"), "failed loom data left a file behind")


# ---- 4. configs ---------------------------------------------------------

def configs(tmp, data):
    d = ["train", "--data", data] + FAST
    unknown = write_text(os.path.join(tmp, "unknown.json"), '{"steps": 1, "bogus": 3}')
    wrong = write_text(os.path.join(tmp, "wrong.json"), '{"steps": "ten"}')
    notjson = write_text(os.path.join(tmp, "notjson.json"), "steps = 10\n")
    trailing = write_text(os.path.join(tmp, "trailing.json"), '{"steps": 1} and more\n')
    twice = write_text(os.path.join(tmp, "twice.json"), '{"steps": 1, "steps": 2}')
    badlayout = write_text(os.path.join(tmp, "layout.json"), '{"dp": 3}')
    missing = os.path.join(tmp, "nosuch.json")
    expect_all([
        ("config unknown key", d + ["--config", unknown], 78, [unknown, '"bogus"']),
        ("config unknown key, 2 ranks", d + ["--config", unknown], 78, [unknown, '"bogus"'], 2),
        ("config wrong type", d + ["--config", wrong], 78, [wrong, '"steps"']),
        ("config not JSON", d + ["--config", notjson], 78, [notjson, "line 1"]),
        ("config trailing text", d + ["--config", trailing], 78, [trailing]),
        ("config key twice", d + ["--config", twice], 78, [twice, '"steps"', "twice"]),
        ("config missing", d + ["--config", missing], 66, [missing]),
        ("config is a directory", d + ["--config", tmp], 66, [tmp]),
        ("config layout", d + ["--config", badlayout], 64, ["dp=3", "has 2 ranks"], 2),
    ])

    m_topk = model_config(os.path.join(tmp, "m_topk.json"), num_local_experts=4, num_experts_per_tok=5)
    m_cap = model_config(os.path.join(tmp, "m_cap.json"), num_local_experts=4, capacity_factor=-1)
    expect_all([
        ("moe top-k > experts", d + ["--model", m_topk], 78, [m_topk, "num_experts_per_tok=5",
                                                           "num_local_experts=4"]),
        ("moe negative capacity", d + ["--model", m_cap], 78, [m_cap, '"capacity_factor"']),
    ])
    m_head = model_config(os.path.join(tmp, "m_head.json"), n_head=3)
    m_layer = model_config(os.path.join(tmp, "m_layer.json"), n_layer=None)
    m_key = model_config(os.path.join(tmp, "m_key.json"), foo=1)
    m_type = model_config(os.path.join(tmp, "m_type.json"), n_embd="64")
    good = open(model_config(os.path.join(tmp, "m_good.json"))).read()
    m_trail = write_text(os.path.join(tmp, "m_trail.json"), good + ' {"n_layer": 3}\n')
    m_twice = write_text(os.path.join(tmp, "m_twice.json"), good[:-1] + ', "n_layer": 3}')
    m_ctx = model_config(os.path.join(tmp, "m_ctx.json"), n_ctx=64)
    m_ctx0 = model_config(os.path.join(tmp, "m_ctx0.json"), n_ctx=0)
    m_ctx_ok = model_config(os.path.join(tmp, "m_ctx_ok.json"), n_ctx=128)
    m_nul = write_text(os.path.join(tmp, "m_nul.json"), good + '\0{"n_layer": 3}')
    # sizes past the bounds that keep 64-bit size arithmetic safe (never allocated)
    m_layers = model_config(os.path.join(tmp, "m_layers.json"), n_layer=1025)
    m_embd = model_config(os.path.join(tmp, "m_embd.json"), n_embd=65540)
    m_vocab = model_config(os.path.join(tmp, "m_vocab.json"), vocab_size=(1 << 24) + 1)
    m_pos = model_config(os.path.join(tmp, "m_pos.json"), n_positions=(1 << 20) + 1)
    d = ["train", "--data", data] + FAST
    expect_all([
        ("model trailing text", d + ["--model", m_trail], 78, [m_trail]),
        ("model key twice", d + ["--model", m_twice], 78, [m_twice, '"n_layer"', "twice"]),
        ("model n_ctx != n_positions", d + ["--model", m_ctx], 78, [m_ctx, '"n_ctx"=64', '"n_positions"=128']),
        ("model n_ctx 0", d + ["--model", m_ctx0], 78, [m_ctx0, '"n_ctx"']),
        ("model NUL byte", d + ["--model", m_nul], 78, [m_nul, "NUL"]),
        ("model n_layer too large", d + ["--model", m_layers], 78, [m_layers, "n_layer=1025", "1024"]),
        ("model n_embd too large", d + ["--model", m_embd], 78, [m_embd, "n_embd=65540", "65536"]),
        ("model vocab too large", d + ["--model", m_vocab], 78, [m_vocab, "vocab_size=16777217", "16777216"]),
        ("model n_positions too large", d + ["--model", m_pos], 78, [m_pos, "n_positions=1048577", "1048576"]),
        ("model n_layer too large, 2 ranks", d + ["--model", m_layers, "--dp", 2], 78, ["n_layer=1025"], 2),
        ("model config is a directory", d + ["--model", tmp + "/"], 66, [tmp, "directory"]),
    ])
    p = lt.run(d + ["--model", m_ctx_ok], check_ok=False)
    lt.check(p.returncode == 0, "model with n_ctx == n_positions: exit %d\n%s" % (p.returncode, tail(p.stderr)))
    expect_all([
        ("model n_head", d + ["--model", m_head], 78, [m_head, "n_head=3", "n_embd=64"]),
        ("model n_head, 2 ranks", d + ["--model", m_head, "--dp", 2], 78, ["n_head=3", "n_embd=64"], 2),
        ("model missing n_layer", d + ["--model", m_layer], 78, [m_layer, '"n_layer"']),
        ("model unknown key", d + ["--model", m_key], 78, [m_key, '"foo"']),
        ("model wrong type", d + ["--model", m_type], 78, [m_type, '"n_embd"']),
        ("model config missing", d + ["--model", os.path.join(tmp, "nosuch_model.json")], 66,
             ["nosuch_model.json"]),
    ])


# ---- 5. numerical blow-up, 6. nothing destroyed ---------------------------

def blowup_and_outputs(tmp, data, params):
    P = os.path.join(tmp, "keep.safetensors")
    M = os.path.join(tmp, "keep.jsonl")
    lt.run(["train", "--data", data, "--save-params", P, "--metrics", M] + FAST)
    before = (sha(P), sha(M))
    blow = ["--lr", "1e30", "--grad-clip", 0, "--steps", 3]
    p = expect("lr 1e30 blows up", ["train", "--data", data, "--save-params", P, "--metrics", M] + FAST + blow,
               65, ["non-finite", "step 2"])
    lt.check("step 1/3" in p.stderr, "blow-up: the first step should have run:\n" + tail(p.stderr))
    lt.check((sha(P), sha(M)) == before, "blow-up on 1 rank changed the existing params / metrics")
    expect("lr 1e30 blows up, 2 ranks",
           ["train", "--data", data, "--save-params", P, "--metrics", M, "--dp", 2] + FAST + blow,
           65, ["non-finite", "step 2"], ranks=2)
    lt.check((sha(P), sha(M)) == before, "blow-up on 2 ranks changed the existing params / metrics")
    lt.check(not os.path.exists(P + ".tmp"), "a failed run left %s.tmp" % P)

    # a NaN weight: refused while loading, naming the tensor; nothing written
    tensors, meta = st.load(params)
    w = tensors["wte.weight"].copy()
    w[3, 5] = np.nan
    tensors["wte.weight"] = w
    nan_st = os.path.join(tmp, "nan.safetensors")
    st.save(nan_st, tensors, meta)
    expect("NaN weight", ["train", "--data", data, "--load-params", nan_st, "--save-params", P,
                          "--metrics", M] + FAST, 65, ["non-finite", "wte.weight"])
    lt.check((sha(P), sha(M)) == before, "NaN-weight run changed the existing params / metrics")
    ev = ["eval", "--model", "tiny", "--load-params", nan_st, "--data", data, "--batch", 2, "--seq", 16]
    # finite weights so large that the logits overflow: the loss itself is
    # non-finite, which eval must report instead of printing "loss nan"
    tensors, meta = st.load(params)
    tensors = dict(tensors)
    tensors["ln_f.weight"] = np.full_like(tensors["ln_f.weight"], 1e30)
    tensors["wte.weight"] = tensors["wte.weight"] * np.float32(1e10)
    huge_st = os.path.join(tmp, "huge.safetensors")
    st.save(huge_st, tensors, meta)
    ev_huge = ["eval", "--model", "tiny", "--load-params", huge_st, "--data", data, "--batch", 2, "--seq", 16]
    expect_all([
        ("eval NaN weight", ev, 65, ["non-finite", nan_st]),
        ("eval NaN weight, 2 ranks", ev, 65, ["non-finite", nan_st], 2),
        ("eval overflowing loss", ev_huge, 65, ["non-finite loss", huge_st, data]),
        ("eval overflowing loss, 2 ranks", ev_huge, 65, ["non-finite loss", huge_st, data], 2),
    ])

    # failures detected up front: bad data, bad params with the same outputs
    trunc = os.path.join(tmp, "trunc.bin")
    expect("bad data keeps outputs", ["train", "--data", trunc, "--save-params", P, "--metrics", M] + FAST,
           65, [trunc])
    lt.check((sha(P), sha(M)) == before, "a bad-data run changed the existing params / metrics")

    # outputs that cannot be written fail before training
    nodir = os.path.join(tmp, "no", "such", "dir")
    procs = expect_all([
        ("save-params into a missing directory",
         ["train", "--data", data, "--save-params", os.path.join(nodir, "p.safetensors")] + FAST,
         73, ["--save-params", nodir]),
        ("metrics into a missing directory",
         ["train", "--data", data, "--metrics", os.path.join(nodir, "m.jsonl")] + FAST,
         73, ["--metrics", nodir]),
        ("save-params into a missing directory, 2 ranks",
         ["train", "--data", data, "--dp", 2, "--save-params", os.path.join(nodir, "p.safetensors")] + FAST,
         73, [nodir], 2),
    ])
    for p in procs:
        lt.check("step 1" not in p.stderr, "output into a missing directory: trained before failing:\n"
                 + tail(p.stderr))

    # --metrics naming a directory: the final rename could only fail, so the
    # run fails before training (it used to train, then log the failed
    # rename and exit 0)
    mdir = os.path.join(tmp, "metrics_dir")
    os.mkdir(mdir)
    write_text(os.path.join(mdir, "keep.txt"), "keep")
    procs = expect_all([
        ("metrics is a directory", ["train", "--data", data, "--metrics", mdir] + FAST, 73,
         ["--metrics", mdir, "directory"]),
        ("metrics is a directory, 2 ranks", ["train", "--data", data, "--metrics", mdir, "--dp", 2] + FAST, 73,
         ["--metrics", mdir, "directory"], 2),
    ])
    for p in procs:
        lt.check("step 1" not in p.stderr, "--metrics DIR: trained before failing:\n" + tail(p.stderr))
    lt.check(os.listdir(mdir) == ["keep.txt"] and not os.path.exists(mdir + ".tmp"),
             "--metrics DIR: the directory changed or a tmp file was left")

    # an output naming an input or the other output is refused, nothing touched
    data_sha = sha(data)
    expect("save-params over the data", ["train", "--data", data, "--save-params", data] + FAST, 64,
           ["--save-params", "--data", data])
    lt.check(sha(data) == data_sha, "--save-params over --data changed the data shard")
    expect("metrics over params", ["train", "--data", data, "--save-params", P, "--metrics", P] + FAST, 64,
           ["--save-params", "--metrics", P])
    expect("metrics over load-params", ["train", "--data", data, "--load-params", P, "--metrics", P] + FAST,
           64, ["--metrics", "--load-params", P])
    lt.check((sha(P), sha(M)) == before, "refused runs changed the existing params / metrics")

    # loom data never replaces an existing shard unless it wrote a complete one
    shard = os.path.join(tmp, "existing.bin")
    with open(shard, "wb") as f:
        f.write(open(data, "rb").read())
    expect("data missing input keeps --out", ["data", "--input", "/nonexistent", "--out", shard, "--val", ""],
           66, ["/nonexistent"])
    lt.check(sha(shard) == data_sha, "loom data with a missing input changed the existing --out")
    expect("data --out == --val", ["data", "--input", "/usr/share/common-licenses/GPL-3", "--out", shard,
                                   "--val", shard], 64, ["--out", "--val", shard])
    lt.check(sha(shard) == data_sha, "loom data --out == --val changed the existing --out")
    expect("data --out == --input", ["data", "--input", shard, "--out", shard, "--val", ""], 64,
           ["--out", shard])
    lt.check(sha(shard) == data_sha, "loom data --out == --input changed the input")
    expect("data --out empty", ["data", "--input", shard, "--out", "", "--val", ""], 64, ["--out"])
    expect("data --out directory", ["data", "--input", shard, "--out", tmp, "--val", ""], 73, ["--out", tmp])
    lt.check(not os.path.exists(shard + ".tmp"), "loom data left %s.tmp" % shard)


# ---- 7. --load-params ---------------------------------------------------

def load_params(tmp, data, params):
    tensors, meta = st.load(params)
    d = ["train", "--data", data] + FAST
    shape = dict(tensors)
    shape["h.0.attn.c_attn.weight"] = np.zeros((64, 100), np.float32)
    shape_st = os.path.join(tmp, "shape.safetensors")
    st.save(shape_st, shape, meta)
    miss = dict(tensors)
    del miss["h.1.mlp.c_fc.bias"]
    miss_st = os.path.join(tmp, "miss.safetensors")
    st.save(miss_st, miss, meta)
    garbage = os.path.join(tmp, "garbage.safetensors")
    with open(garbage, "wb") as f:
        f.write(b"this is not a safetensors file at all " * 10)
    empty = os.path.join(tmp, "empty.safetensors")
    open(empty, "wb").close()
    trunc = os.path.join(tmp, "trunc.safetensors")
    with open(trunc, "wb") as f:
        f.write(open(params, "rb").read()[:-100])
    missing = os.path.join(tmp, "nosuch.safetensors")
    expect_all([
        ("load missing", d + ["--load-params", missing], 66, [missing]),
        ("load wrong shape", d + ["--load-params", shape_st], 65,
             [shape_st, "h.0.attn.c_attn.weight", "[64, 100]", "[64, 192]"]),
        ("load wrong shape, 2 ranks", d + ["--load-params", shape_st, "--dp", 2], 65,
             ["h.0.attn.c_attn.weight", "[64, 100]", "[64, 192]"], 2),
        ("load missing tensor", d + ["--load-params", miss_st], 65, [miss_st, "h.1.mlp.c_fc.bias"]),
        ("load garbage", d + ["--load-params", garbage], 65, [garbage]),
        ("load empty", d + ["--load-params", empty], 65, [empty]),
        ("load truncated", d + ["--load-params", trunc], 65, [trunc]),
        ("load into another model", ["train", "--data", data, "--load-params", params] + FAST +
             ["--model", "mini"], 65, ["wte.weight", "[256, 64]", "[256, 256]"]),
    ])


# ---- 8. eval ------------------------------------------------------------

def evals(data, params):
    ev = ["eval", "--model", "tiny", "--load-params", params, "--data", data, "--batch", 2, "--seq", 16]
    p = lt.run(ev, check_ok=False)
    lines = p.stdout.strip().splitlines()
    lt.check(p.returncode == 0, "eval: exit %d\n%s" % (p.returncode, tail(p.stderr)))
    lt.check(bool(lines) and re.fullmatch(r"loss [0-9]+\.[0-9]+", lines[-1]) is not None,
             "eval: last stdout line %r is not `loss <value>`" % (lines[-1] if lines else ""))
    if lines and lines[-1].startswith("loss "):
        v = float(lines[-1].split()[1])
        lt.check(0 < v < 10, "eval: loss %g of a byte-level model is not plausible" % v)
    no_crash("eval", p)
    p = lt.run(ev + ["--batch", 4], np=2, check_ok=False)
    lt.check(p.returncode == 0 and p.stdout.count("loss ") == 1,
             "eval on 2 ranks: exit %d, %d loss lines" % (p.returncode, p.stdout.count("loss ")))
    n = shard_tokens(data)
    expect_all([
        ("eval too many batches", ev + ["--batches", 100000], 65, [data, str(n), "3200001"]),
        ("eval token count overflows", ev + ["--batch", 2000000000, "--batches", 2000000000], 64,
         ["--batch 2000000000", "--batches 2000000000", "--seq 16"]),
        ("eval without params", ["eval", "--model", "tiny", "--data", data], 64, ["--load-params"]),
        ("eval batch not divisible", ev + ["--batch", 3], 64, ["2 ranks", "--batch 3"], 2),
        ("eval missing data", ev + ["--data", data + ".nosuch"], 66, [data + ".nosuch"]),
        ("eval missing params", ev + ["--load-params", params + ".nosuch"], 66, [params + ".nosuch"]),
        ("eval wrong model", ev + ["--model", "mini"], 65, ["wte.weight", "[256, 64]", "[256, 256]"]),
    ])


# ---- 9. help ------------------------------------------------------------

def helps():
    want = {
        "train": ["--model", "--data", "--steps", "--batch", "--seq", "--lr", "--dp", "--tp", "--pp",
                  "--cp", "--cp-impl", "--ep", "--mesh-order", "--metrics", "--save-params", "--load-params",
                  "--config", "--no-progress"],
        "eval": ["--model", "--load-params", "--data", "--batch", "--seq", "--batches"],
        "data": ["--input", "--out", "--val", "--val-fraction"],
    }
    for cmd, flags_ in want.items():
        p = lt.run([cmd, "--help"], check_ok=False)
        lt.check(p.returncode == 0, "%s --help: exit %d" % (cmd, p.returncode))
        lt.check(p.stdout.startswith("usage: loom %s" % cmd), "%s --help: no usage line" % cmd)
        for f in flags_:
            lt.check(f in p.stdout, "%s --help does not list %s" % (cmd, f))
        no_crash(cmd + " --help", p)
    p = lt.run(["train", "--help"], np=2, check_ok=False)
    lt.check(p.returncode == 0 and p.stdout.count("usage: loom train") == 1,
             "train --help on 2 ranks: exit %d, printed %d times" % (p.returncode, p.stdout.count("usage: loom train")))
    p = lt.run([], check_ok=False)
    lt.check(p.returncode == 64, "loom with no arguments: exit %d, expected 64" % p.returncode)
    lt.check("usage: loom" in p.stderr, "loom with no arguments: no usage on stderr")
    p = lt.run(["--help"], check_ok=False)
    lt.check(p.returncode == 0 and "exit codes" in p.stdout, "loom --help: exit %d" % p.returncode)
    for code in ("64", "65", "66", "73", "78"):
        lt.check(code in p.stdout, "loom --help does not document exit code %s" % code)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        params = os.path.join(tmp, "good.safetensors")
        lt.run(["train", "--data", data, "--save-params", params] + FAST)
        layouts(data)
        flags(data)
        data_files(tmp, data)
        configs(tmp, data)
        blowup_and_outputs(tmp, data, params)
        load_params(tmp, data, params)
        evals(data, params)
        helps()
    lt.done()


if __name__ == "__main__":
    main()
