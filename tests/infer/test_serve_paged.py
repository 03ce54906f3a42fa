#!/usr/bin/python3
"""test_serve_paged.py [--model NAME] [LAYOUT...] - the paged KV cache of
`loom serve` when its pool is small (2 ranks: tp=2, or the layout flags
given; model tiny, or e.g. tiny-llama).

A tiny byte-level model is trained briefly and served with 8 sequences at
once but only 24 blocks of 4 positions (96 positions, one long request's
worth), with and without prefix caching. Checked, each way:
  - one request for n=6 greedy choices of a 20-token prompt, then 8
    concurrent greedy requests (prompts of 10 to 31 tokens, half streaming),
    16 new tokens each: every choice gets exactly the tokens `loom generate`
    gives on one rank with a contiguous cache. The six choices need 6 x 9
    blocks (fewer with their 4 shared prompt blocks) when 24 exist, so
    decoding must preempt (`loom_num_preemptions_total` > 0) and the later
    requests wait for blocks;
  - with the cache, blocks are shared (n=6: 5 x 4 full prompt blocks by
    reference) and evicted for reuse (`loom_kv_cache_evictions_total` > 0);
  - afterwards no block is held (`loom_kv_cache_blocks_used` 0, 0 running);
  - a request needing more positions than the pool holds gets 400 naming
    max_tokens; --kv-block-size 0 exits 64 naming the flag.
"""
import json
import os
import sys
import tempfile
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import loomtest as lt  # noqa: E402

NEW = 16


def post(port, body):
    status, data = lt.serve_post(port, body, timeout=600)
    if status != 200:
        return status, data
    if not body.get("stream"):
        return 200, [ch["token_ids"] for ch in json.loads(data)["choices"]]
    evs = [json.loads(e[6:]) for e in data.split("\n\n") if e.startswith("data: {")]
    return 200, [[e["choices"][0]["token_id"] for e in evs if "token_id" in e["choices"][0]]]


def metrics(port):
    return lt.serve_metrics(port, ("loom_num_preemptions_total", "loom_kv_cache_evictions_total",
                                   "loom_kv_cache_blocks_used", "loom_kv_cache_blocks_total",
                                   "loom_prefix_cache_hit_tokens_total", "loom_prefill_tokens_total"))


def main():
    args = sys.argv[1:]
    model = "tiny"
    if "--model" in args:
        i = args.index("--model")
        model = args[i + 1]
        del args[i:i + 2]
    layout = args or ["--tp", "2"]
    print("model %s, layout %s" % (model, " ".join(layout)))
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        params = os.path.join(tmp, "p.safetensors")
        lt.run(["train", "--model", model, "--data", data, "--steps", 60, "--lr", "3e-3", "--batch", 8, "--seq", 64,
                "--threads", 1, "--save-params", params])
        text = open("/usr/share/common-licenses/GPL-3", "rb").read()
        shared = list(text[500:520])
        prompts = [list(text[1000 + 400 * i:1000 + 400 * i + 10 + 3 * i]) for i in range(8)]
        ids_file = os.path.join(tmp, "p.txt")
        with open(ids_file, "w") as f:
            f.write("\n".join(",".join(map(str, p)) for p in [shared] + prompts) + "\n")
        p = lt.run(["generate", "--model", model, "--load-params", params, "--ids-file", ids_file, "--max-tokens",
                    NEW, "--format", "ids", "--threads", 1])
        want = [[int(t) for t in line.split()] for line in p.stdout.strip().splitlines()]
        lt.check(len(want) == 9 and all(len(w) == NEW for w in want), "generate gave %s" % want[:2])

        for tag, extra in (("cache", []), ("nocache", ["--no-prefix-cache"])):
            srv = lt.Server(tmp, ["--model", model, "--load-params", params, "--max-seqs", 8, "--queue", 16,
                                  "--kv-block-size", 4, "--kv-blocks", 24, "--threads", 1] + layout + extra,
                            np=2, tag=tag)
            try:
                st, n6 = post(srv.port, {"prompt": shared, "max_tokens": NEW, "temperature": 0, "n": 6,
                                         "ignore_eos": True})
                m1, _ = metrics(srv.port)
                res = [None] * len(prompts)

                def one(i):
                    res[i] = post(srv.port, {"prompt": prompts[i], "max_tokens": NEW, "temperature": 0,
                                             "ignore_eos": True, "stream": i % 2 == 1})
                ths = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
                for t in ths:
                    t.start()
                for t in ths:
                    t.join()
                m2, h2 = metrics(srv.port)
                big = post(srv.port, {"prompt": prompts[0], "max_tokens": 90, "temperature": 0})
            finally:
                rc = srv.stop(tail=3000)
            lt.check(rc == 0, "%s: the server exited %s after SIGTERM" % (tag, rc))
            same6 = st == 200 and len(n6) == 6 and all(c == want[0] for c in n6)
            same = sum(1 for i, (s, r) in enumerate(res) if s == 200 and r == [want[1 + i]])
            print("%s: n=6 choices equal to loom generate: %s; %d/%d concurrent requests equal; metrics after n=6 %s, "
                  "after all %s" % (tag, same6, same, len(prompts), m1, m2))
            lt.check(same6, "%s: n=6 answers %s, want 6 x %s" % (tag, n6, want[0]))
            lt.check(same == len(prompts), "%s: %d/%d requests differ from loom generate: %s" % (
                tag, len(prompts) - same, len(prompts), [(r, want[1 + i]) for i, r in enumerate(res)
                                                         if r != (200, [want[1 + i]])][:2]))
            lt.check(m1["loom_kv_cache_blocks_total"] == 24 and m1["loom_num_preemptions_total"] > 0,
                     "%s: 6 x 44 positions in 24 blocks of 4 without preemption? %s" % (tag, m1))
            lt.check(m2["loom_kv_cache_blocks_used"] == 0 and h2["running"] == 0 and h2["waiting"] == 0 and
                     h2["kv_cache"]["waiting_for_blocks"] == 0,
                     "%s: blocks still held after every request ended: %s %s" % (tag, m2, h2["kv_cache"]))
            if tag == "cache":
                lt.check(h2["prefix_cache"]["shared_blocks"] >= 5 * 4 and m2["loom_kv_cache_evictions_total"] > 0,
                         "cache: no shared blocks or no eviction: %s %s" % (h2["prefix_cache"], m2))
            else:
                lt.check(m2["loom_prefix_cache_hit_tokens_total"] == 0 and
                         h2["prefix_cache"]["shared_blocks"] == 0, "nocache: cache hits %s" % h2["prefix_cache"])
            lt.check(big[0] == 400 and '"max_tokens"' in big[1], "%s: 10 + 90 positions in a pool of 96: %s" % (
                tag, big))
        p = lt.run(["serve", "--model", model, "--load-params", params, "--kv-block-size", 0, "--port", 0],
                   check_ok=False)
        lt.check(p.returncode == 64 and "--kv-block-size" in p.stdout + p.stderr,
                 "--kv-block-size 0: exit %d %s" % (p.returncode, (p.stdout + p.stderr)[-300:]))
    lt.done()


main()
