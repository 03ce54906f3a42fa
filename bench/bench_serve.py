#!/usr/bin/python3
"""Serving benchmark on loopback: a load generator against `loom serve`, and
single-stream decode speed against transformers' generate.

usage: bench/bench_serve.py [--loom build/loom] [--model mini] [--rates 5,20,80]
                            [--requests 40] [--prompt-len 32] [--max-tokens 32]
                            [--seconds 60] [--skip-hf]
       bench/bench_serve.py --tradeoff [--ranks 2,4] [--concurrency 1,8,32] [--runs 3] [--json FILE] ...
       bench/bench_serve.py --prefix [--prefix-len 512] [--prefix-requests 32]

1. Single stream: one prompt of --prompt-len tokens, 128 new greedy tokens,
   one thread on both sides (loom generate --threads 1; torch.set_num_threads(1),
   GPT2LMHeadModel.generate with the same weights, min_new_tokens = 128 so
   both produce exactly 128). Reported: new tokens / wall seconds of the
   generate call (prefill included; loom's from the time `loom generate`
   logs around loom_generate, model loading excluded on both sides), and the
   ratio loom / transformers.
2. Serving, for each layout
     tp=1        1 rank, 1 thread
     tp=2        2 ranks (scripts/loomrun), 1 thread each
     dp=2        2 ranks, `loom serve --dp 2`: two tp=1 replicas in one job,
                 each on its own port; requests alternate between them (the
                 client is the load balancer)
   and each request rate in --rates: --requests requests with Poisson arrivals
   (seeded), streaming, prompt --prompt-len tokens, --max-tokens new tokens at
   temperature 0.8. Bounded: a rate stops after --seconds. Client-side
   figures: TTFT (request sent -> first token event), inter-token latency
   (gaps between token events), p50 / p95, completion tokens / wall seconds.
3. --tradeoff (instead of 1 and 2): on each of --ranks R, tp=R, dp=R replicas
   and (R = 4) tp=2 x dp=2, each at every --concurrency C: C closed-loop
   clients (each sends its next request when its last ended; 4 C requests,
   at least 16): end-to-end latency and TTFT p50/p95/p99, completion tokens
   per wall second, the KV capacity the replicas' /health report; --runs
   rounds, each layout once per round in turn, so the machine's load falls
   on all alike: median and range. Then `loom plan --mode serve --batch C`
   with a cluster file `loom calibrate` measured on R ranks here, given the
   machine's other work as background_runnable (the median load average
   sampled before each closed loop, less R + 1): its order
   of these layouts by tokens/s and by end-to-end latency (TTFT + max_tokens
   x TPOT) against the measured medians, and against every pair of layouts
   the measurement separates (one better than the other in every round). --json FILE keeps the
   runs and the cluster files (tests/plan/serve_tradeoff.json is one, which
   ctest plan_serve_ranking checks the plan against).
4. --prefix (instead of 1 to 3): prefix caching with the paged KV cache. A
   server with the cache and one with --no-prefix-cache (1 rank, 1 thread;
   the same weights of a mini-sized model with 1024 positions), one after
   the other in this run, each get --prefix-requests streamed requests whose
   prompts share a --prefix-len-token prefix (each its own 8-token suffix,
   8 new tokens): half one after another, then half at once. Reported: the
   prompt tokens each server computed and took from the cache
   (/metrics), the mean and p50 client-side TTFT of the sequential ones
   after the first and of the concurrent ones, and the ratios on / off.
The model (random weights from `loom train --steps 1`, --model) only fixes
the cost per token. Numbers on a shared machine are noisy; run it alone.
"""
import argparse
import http.client
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import benchlib  # noqa: E402

SRC = os.path.join(HERE, "..")
LOOMRUN = os.path.join(SRC, "scripts", "loomrun")


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(q * len(xs) + 0.5)) - 1))]


def stream_request(port, prompt, max_tokens, seed, out):
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": prompt, "max_tokens": max_tokens,
                                                          "temperature": 0.8, "seed": seed, "stream": True}))
    r = c.getresponse()
    if r.status != 200:
        out.append({"status": r.status})
        r.read()
        c.close()
        return
    times = []
    for line in r:
        if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
            times.append(time.perf_counter())
    c.close()
    out.append({"status": 200, "ttft": times[0] - t0 if times else None, "e2e": time.perf_counter() - t0,
                "gaps": [b - a for a, b in zip(times, times[1:])], "tokens": len(times)})


def run_load(ports, rate, n, prompt_len, max_tokens, seconds, seed=1):
    rng = random.Random(seed)
    out, threads = [], []
    start = time.perf_counter()
    t = 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        if t > seconds:
            break
        delay = start + t - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        prompt = [rng.randrange(32, 127) for _ in range(prompt_len)]
        th = threading.Thread(target=stream_request, args=(ports[i % len(ports)], prompt, max_tokens, i, out))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    wall = time.perf_counter() - start
    ok = [o for o in out if o["status"] == 200 and o["ttft"] is not None]
    ttft = [o["ttft"] for o in ok]
    gaps = [g for o in ok for g in o["gaps"]]
    return {"requests": len(out), "ok": len(ok), "ttft_p50": pct(ttft, 0.5), "ttft_p95": pct(ttft, 0.95),
            "itl_p50": pct(gaps, 0.5), "itl_p95": pct(gaps, 0.95), "tok_s": sum(o["tokens"] for o in ok) / wall}


def closed_loop(ports, conc, n, prompt_len, max_tokens, seed=2):
    """conc clients, each sending its next request when the last one ended,
    n requests in all, spread over the replicas' ports."""
    out, lock, nxt = [], threading.Lock(), [0]

    def client():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= n:
                return
            rng = random.Random(seed * 100003 + i)
            prompt = [rng.randrange(32, 127) for _ in range(prompt_len)]
            stream_request(ports[i % len(ports)], prompt, max_tokens, i, out)

    start = time.perf_counter()
    ths = [threading.Thread(target=client) for _ in range(conc)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    wall = time.perf_counter() - start
    ok = [o for o in out if o["status"] == 200 and o["ttft"] is not None]
    lat, ttft = [o["e2e"] for o in ok], [o["ttft"] for o in ok]
    return {"requests": len(out), "ok": len(ok), "lat": [pct(lat, q) for q in (0.5, 0.95, 0.99)],
            "ttft": [pct(ttft, q) for q in (0.5, 0.95, 0.99)], "tok_s": sum(o["tokens"] for o in ok) / wall}


def kv_capacity(ports):
    """(sequences, positions) the replicas' KV caches hold at once, from /health."""
    seqs = positions = 0
    for port in ports:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("GET", "/health")
        kv = json.loads(c.getresponse().read())["kv_cache"]
        c.close()
        seqs += kv["slots"]
        positions += kv["positions"]
    return seqs, positions


def plan_predict(loom, model, ranks, conc, prompt_len, max_tokens, cluster, names):
    """loom plan --mode serve's figures for the measured layouts (names: "tp=2", "dp=2", "tp=2,dp=2"):
    {name: (tokens/s of the whole job, end-to-end latency s = TTFT + max_tokens x TPOT)}."""
    p = benchlib.run([loom, "plan", "--model", model, "--mode", "serve", "--cluster", cluster, "--gpus", ranks,
                      "--batch", conc, "--seq", prompt_len, "--gen", max_tokens, "--precision", "fp32", "--top", 1000,
                      "--json"], what="loom plan")
    pred = {}
    for r in json.loads(p.stdout)["layouts"]:
        lay = dict(kv.split("=", 1) for kv in r["layout"].split(","))
        d = {k: int(lay.get(k, 1)) for k in ("dp", "tp", "pp", "cp", "ep")}
        if d["pp"] != 1 or d["cp"] != 1 or d["ep"] != 1:
            continue
        name = ",".join(x for x in (("tp=%d" % d["tp"]) if d["tp"] > 1 else "", ("dp=%d" % d["dp"]) if d["dp"] > 1
                                    else "") if x)
        if name in names and name not in pred and r.get("feasible", True):
            pred[name] = (r["tokens_per_s_per_device"] * ranks, r["ttft_s"] + max_tokens * r["tpot_s"])
    return pred


def separated(runs, better_high):
    """Pairs (a, b) of layouts the measurement separates, a the better: a beats b in every round (the runs of
    one round ran one after another, under the same load; runs: {name: [value per round]})."""
    out = []
    for a in runs:
        for b in runs:
            if a != b and all(p > q if better_high else p < q for p, q in zip(runs[a], runs[b])):
                out.append((a, b))
    return out


def compare(measured, pred, what):
    """The measured order by median, the plan's, and whether the plan orders every separated pair as measured."""
    hi = what == "tok_s"
    med = {n: statistics.median(v) for n, v in measured.items()}
    got = sorted(med, key=lambda n: -med[n] if hi else med[n])
    idx = 0 if hi else 1
    plan = sorted(pred, key=lambda n: -pred[n][idx] if hi else pred[n][idx])
    pairs = separated(measured, hi)
    wrong = [(a, b) for a, b in pairs if plan.index(a) > plan.index(b)]
    return got, plan, pairs, wrong


def tradeoff(a, params, tmp):
    """The seeds' trade-off: on --ranks R, tp=R vs dp=R replicas vs tp x dp, closed-loop clients at each
    --concurrency, --runs rounds (each layout once per round, in turn); latency and TTFT p50/p95/p99,
    tokens/s, KV capacity; and loom plan --mode serve's ranking from a cluster file `loom calibrate`
    measures here, checked on every pair of layouts whose runs do not overlap."""
    concs = [int(c) for c in a.concurrency.split(",")]
    record = {"model": a.model, "prompt": a.prompt_len, "max_tokens": a.max_tokens, "runs": a.runs,
              "cpu": benchlib.cpu_model(), "cores": os.cpu_count(), "ranks": {}}
    for ranks in [int(r) for r in a.ranks.split(",")]:
        layouts = [("tp=%d" % ranks, ["--tp", ranks], 1), ("dp=%d" % ranks, ["--dp", ranks], ranks)]
        if ranks == 4:
            layouts.append(("tp=2,dp=2", ["--tp", 2, "--dp", 2], 2))
        cluster = os.path.join(tmp, "cluster%d.json" % ranks)
        benchlib.run([LOOMRUN, "-np", ranks, a.loom, "calibrate", "--out", cluster, "--quiet"], what="loom calibrate")
        print("\ntrade-off on %d ranks (1 thread each, %d cores): prompt %d, %d new tokens, streaming, closed loop" % (
            ranks, os.cpu_count(), a.prompt_len, a.max_tokens))
        print("%-10s %4s %3s %5s %27s %27s %9s %16s %s" % ("layout", "conc", "run", "ok", "latency p50/p95/p99 ms",
                                                         "ttft p50/p95/p99 ms", "tok/s", "KV seqs/positions",
                                                         "load"))
        rows = {n: {c: {"tok_s": [], "lat_p50": [], "ttft_p50": [], "lat_p99": []} for c in concs}
                for n, _, _ in layouts}
        loads = []
        for run in range(a.runs):
            for li, (name, extra, replicas) in enumerate(layouts):
                proc, ports = start_server(a.loom, ["--model", a.model, "--load-params", params] +
                                           [str(x) for x in extra], ranks, tmp, "t%d_%d_%d" % (ranks, li, run),
                                           replicas)
                try:
                    seqs, positions = kv_capacity(ports)
                    for conc in concs:
                        load = open("/proc/loadavg").read().split()[0]
                        loads.append(float(load))
                        r = closed_loop(ports, conc, max(4 * conc, 16), a.prompt_len, a.max_tokens)
                        cell = rows[name][conc]
                        cell["tok_s"].append(r["tok_s"])
                        cell["lat_p50"].append(r["lat"][0])
                        cell["lat_p99"].append(r["lat"][2])
                        cell["ttft_p50"].append(r["ttft"][0])
                        print("%-10s %4d %3d %2d/%-2d %8.1f/%8.1f/%8.1f %8.1f/%8.1f/%8.1f %9.1f %7d/%-8d %s" % (
                            name, conc, run, r["ok"], r["requests"], *[1e3 * x for x in r["lat"]],
                            *[1e3 * x for x in r["ttft"]], r["tok_s"], seqs, positions, load), flush=True)
                finally:
                    stop(proc)
        names = [n for n, _, _ in layouts]
        print("\nmedian [range] over %d runs; load average %.1f-%.1f during them" % (a.runs, min(loads), max(loads)))
        for conc in concs:
            for n in names:
                c = rows[n][conc]
                print("%-10s %4d  tok/s %8.1f [%7.1f-%7.1f]  latency p50 %8.1f ms [%7.1f-%7.1f]" % (
                    n, conc, statistics.median(c["tok_s"]), min(c["tok_s"]), max(c["tok_s"]),
                    1e3 * statistics.median(c["lat_p50"]), 1e3 * min(c["lat_p50"]), 1e3 * max(c["lat_p50"])))
        # the other work on the machine: the load average sampled before each closed loop, less this job's
        # own runnable threads (its ranks and the load generator)
        with open(cluster) as f:
            cl = json.load(f)
        cl["background_runnable"] = round(max(0.0, statistics.median(loads) - ranks - 1), 1)
        with open(cluster, "w") as f:
            json.dump(cl, f, indent=1)
        print("background_runnable %.1f (median load average %.1f less %d ranks and the load generator)" % (
            cl["background_runnable"], statistics.median(loads), ranks))
        record["ranks"][str(ranks)] = {"cluster": cl, "load": [min(loads), max(loads)], "rows": rows}
        for conc in concs:
            pred = plan_predict(a.loom, a.model, ranks, conc, a.prompt_len, a.max_tokens, cluster, names)
            for what in ("tok_s", "lat_p50"):
                got, plan, pairs, wrong = compare({n: rows[n][conc][what] for n in names}, pred, what)
                print("ranks %d, concurrency %2d, %-7s: measured (median) %s; loom plan --mode serve %s; "
                      "%d pairs apart in every round, %s" % (
                          ranks, conc, what, " > ".join(got), " > ".join(plan), len(pairs),
                          "the plan orders all as measured" if not wrong else
                          "the plan DISAGREES on " + ", ".join("%s > %s" % p for p in wrong)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")


def start_server(loom, args, np_, tmp, tag, replicas=1):
    """Start `loom serve`; return the process and the port of each replica."""
    port_file = os.path.join(tmp, "port_" + tag)
    files = [port_file] + ["%s.%d" % (port_file, r) for r in range(1, replicas)]
    cmd = ([LOOMRUN, "-np", str(np_)] if np_ > 1 else []) + [loom, "serve", "--port", "0", "--port-file", port_file,
                                                            "--threads", "1", "--max-seqs", "16", "--queue", "256"]
    p = subprocess.Popen(cmd + args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"))
    for _ in range(600):
        if all(os.path.exists(f) and open(f).read().strip() for f in files):
            return p, [int(open(f).read()) for f in files]
        if p.poll() is not None:
            raise benchlib.BenchError("loom serve exited with %d" % p.returncode)
        time.sleep(0.1)
    raise benchlib.BenchError("loom serve did not start")


def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def single_stream(loom, model, params, prompt_len, skip_hf):
    prompt = list(range(65, 65 + prompt_len))
    new = 128
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    best = None
    for _ in range(3):
        p = benchlib.run([loom, "generate", "--model", model, "--load-params", params, "--ids",
                          ",".join(map(str, prompt)), "--max-tokens", new, "--threads", 1, "--stop", "",
                          "--format", "ids"], env=env, what="loom generate")
        m = re.search(r"generated (\d+) tokens .* in ([0-9.]+) s", p.stderr)
        if not m or int(m.group(1)) != new:
            raise benchlib.BenchError("loom generate did not report %d tokens: %s" % (new, p.stderr[-300:]))
        dt = float(m.group(2))
        best = dt if best is None else min(best, dt)
    loom_tps = new / best
    print("single stream, %d-token prompt, %d new tokens, 1 thread:" % (prompt_len, new))
    print("  loom generate   %8.1f tokens/s (best of 3, loom_generate call: prefill + decode)" % loom_tps)
    if skip_hf:
        return
    import numpy as np
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    sys.path.insert(0, os.path.join(SRC, "tests", "oracle"))
    import st
    torch.set_num_threads(1)
    tensors = st.load(params)[0]
    C = tensors["wte.weight"].shape[1]
    L = 1 + max(int(k.split(".")[1]) for k in tensors if k.startswith("h."))
    V, T = tensors["wte.weight"].shape[0], tensors["wpe.weight"].shape[0]
    heads = {"tiny": 4, "mini": 4, "gpt2-small": 12, "gpt2": 12}[model]  # loom's built-in configs
    cfg = GPT2Config(vocab_size=V, n_positions=T, n_embd=C, n_layer=L, n_head=heads,
                     activation_function="gelu_new", resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    m = GPT2LMHeadModel(cfg).eval()
    m.load_state_dict({"transformer." + k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()},
                      strict=False)
    m.tie_weights()
    x = torch.tensor([prompt])
    best = None
    with torch.no_grad():
        for _ in range(3):
            t0 = time.perf_counter()
            out = m.generate(x, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                             attention_mask=torch.ones_like(x))
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
    assert out.shape[1] == prompt_len + new
    hf_tps = new / best
    print("  transformers    %8.1f tokens/s (best of 3, generate() call only)" % hf_tps)
    print("  ratio loom / transformers: %.2fx" % (loom_tps / hf_tps))


def prefix_workload(port, prompts):
    """Streamed requests (8 new tokens), the first half one after another, the rest at once; client TTFTs (s)."""
    ttft = [None] * len(prompts)

    def one(i):
        out = []
        stream_request(port, prompts[i], 8, i, out)
        ttft[i] = out[0].get("ttft")
        if out[0]["status"] != 200:
            print("request %d: status %d" % (i, out[0]["status"]), flush=True)
    half = len(prompts) // 2
    for i in range(half):
        one(i)
    ths = [threading.Thread(target=one, args=(i,)) for i in range(half, len(prompts))]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return ttft


def prefix_bench(a, tmp, data):
    """--prefix: prefill work and TTFT with and without prefix caching, measured in one run."""
    cfg = os.path.join(tmp, "long.json")
    with open(cfg, "w") as f:
        json.dump({"n_layer": 4, "n_head": 4, "n_embd": 256, "vocab_size": 256, "n_positions": 1024}, f)
    params = os.path.join(tmp, "long.safetensors")
    benchlib.run([a.loom, "train", "--model", cfg, "--steps", 1, "--batch", 1, "--seq", 16, "--threads", 1,
                  "--save-params", params, "--data", data], what="loom train")
    text = open("/usr/share/common-licenses/GPL-3", "rb").read()
    prefix = list(text[2000:2000 + a.prefix_len])
    prompts = [prefix + [65 + i % 26] + list(text[9000 + 50 * i:9000 + 50 * i + 7])
               for i in range(a.prefix_requests)]
    half = len(prompts) // 2
    print("prefix caching: %d requests, a %d-token shared prefix + 8 own tokens, 8 new tokens each; %d one after "
          "another, then %d at once; 1 rank, 1 thread" % (len(prompts), a.prefix_len, half, len(prompts) - half))
    res = {}
    for tag, extra in (("on", []), ("off", ["--no-prefix-cache"])):
        proc, ports = start_server(a.loom, ["--model", cfg, "--load-params", params] + extra, 1, tmp, "prefix_" + tag)
        try:
            ttft = prefix_workload(ports[0], prompts)
            c = http.client.HTTPConnection("127.0.0.1", ports[0], timeout=30)
            c.request("GET", "/metrics")
            text_m = c.getresponse().read().decode()
            c.close()
        finally:
            stop(proc)
        m = {k: float(re.search(r"^%s\{[^}]*\} (\S+)$" % k, text_m, re.M).group(1))
             for k in ("loom_prefill_tokens_total", "loom_prefix_cache_hit_tokens_total")}
        res[tag] = (ttft, m)
    print("%-4s %16s %16s %8s %18s %18s" % ("", "prompt computed", "from the cache", "answered", "TTFT seq mean/p50",
                                           "TTFT conc mean/p50"))
    mean = {}
    for tag in ("on", "off"):
        ttft, m = res[tag]
        seq, conc = [x for x in ttft[1:half] if x], [x for x in ttft[half:] if x]
        mean[tag] = (statistics.mean(seq), statistics.mean(conc))
        print("%-4s %16d %16d %5d/%-2d %9.2f/%6.2fms %9.2f/%6.2fms" % (
            tag, m["loom_prefill_tokens_total"], m["loom_prefix_cache_hit_tokens_total"], sum(1 for x in ttft if x),
            len(ttft), 1e3 * mean[tag][0], 1e3 * pct(seq, 0.5), 1e3 * mean[tag][1], 1e3 * pct(conc, 0.5)))
    print("ratio on/off: prompt tokens computed %.3f, TTFT mean sequential %.3f, concurrent %.3f" % (
        res["on"][1]["loom_prefill_tokens_total"] / res["off"][1]["loom_prefill_tokens_total"],
        mean["on"][0] / mean["off"][0], mean["on"][1] / mean["off"][1]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", default=os.path.join(SRC, "build", "loom"))
    ap.add_argument("--model", default="mini")
    ap.add_argument("--rates", default="5,20,80")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--tradeoff", action="store_true",
                    help="only the tp vs dp trade-off (--ranks, --concurrency), not the single stream and rates")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--runs", type=int, default=3, help="--tradeoff: rounds over the layouts (default 3)")
    ap.add_argument("--json", default="", help="--tradeoff: write the measured table and cluster files here")
    ap.add_argument("--prefix", action="store_true",
                    help="only prefix caching on vs off (--prefix-len, --prefix-requests)")
    ap.add_argument("--prefix-len", type=int, default=512)
    ap.add_argument("--prefix-requests", type=int, default=32)
    a = ap.parse_args()
    print("cpu: %s, %d cores" % (benchlib.cpu_model(), os.cpu_count()))
    with tempfile.TemporaryDirectory() as tmp:
        params, data = os.path.join(tmp, "p.safetensors"), os.path.join(tmp, "d.bin")
        benchlib.run([a.loom, "data", "--input", "/usr/share/common-licenses/GPL-3", "--out", data, "--val", ""],
                     what="loom data")
        benchlib.run([a.loom, "train", "--model", a.model, "--steps", 1, "--batch", 1, "--seq", 16, "--threads", 1,
                      "--save-params", params, "--data", data], what="loom train")
        if a.tradeoff:
            tradeoff(a, params, tmp)
            return
        if a.prefix:
            prefix_bench(a, tmp, data)
            return
        single_stream(a.loom, a.model, params, a.prompt_len, a.skip_hf)
        base = ["--model", a.model, "--load-params", params]
        layouts = [("tp=1", 1, []), ("tp=2", 1, ["--tp", "2"]), ("dp=2", 2, ["--dp", "2"])]
        print("\nserving: %d requests per rate, prompt %d, %d new tokens, streaming" % (a.requests, a.prompt_len,
                                                                                         a.max_tokens))
        print("%-11s %6s %5s %10s %10s %9s %9s %9s" % ("layout", "rate", "ok", "ttft p50", "ttft p95", "itl p50",
                                                        "itl p95", "tok/s"))
        for li, (name, replicas, extra) in enumerate(layouts):
            proc, ports = start_server(a.loom, base + extra, 2 if extra else 1, tmp, str(li), replicas)
            try:
                for rate in [float(r) for r in a.rates.split(",")]:
                    r = run_load(ports, rate, a.requests, a.prompt_len, a.max_tokens, a.seconds)
                    print("%-11s %6.1f %2d/%-2d %8.1fms %8.1fms %7.2fms %7.2fms %9.1f" % (
                        name, rate, r["ok"], r["requests"], 1e3 * r["ttft_p50"], 1e3 * r["ttft_p95"],
                        1e3 * r["itl_p50"], 1e3 * r["itl_p95"], r["tok_s"]), flush=True)
            finally:
                stop(proc)


main()
