#!/usr/bin/python3
"""test_serve_prefix.py [LAYOUT...] - prefix caching in `loom serve` (tp=2
under scripts/loomrun, or the layout flags given, e.g. --pp 2): 32 requests whose prompts share a 512-token prefix (each
with its own 8-token suffix), 16 one after another and then 16 at once (half
streaming), answered by a server with prefix caching and by one started with
--no-prefix-cache, the same parameters and layout.

Checked:
  - every answer is the same with and without the cache: greedy token ids,
    and each token's log-probability and top-2 alternatives within 1e-5 (a
    position's keys and values depend only on the tokens up to it and the
    copy is exact; the suffix's rows are a shorter prefill chunk than the
    whole prompt's, which moves the first token's log-probability by ~1e-7);
  - the prefill work, from /metrics: without the cache 32 x 520 prompt tokens
    are computed; with it 520 + 31 x 8 (every request after the first takes
    its 512-token prefix from the cache), hits 31 x 512, and each of those 31
    took the prefix's 32 KV blocks (16 positions each) by reference;
  - then one request for n=4 greedy choices of a new suffix: the same
    answers both ways; with the cache the first choice computes its 8-token
    suffix and the other three, which wait for it, share its 32 full blocks,
    copy the 7 positions of its partly filled block and compute 1 token each
    (11 in all, against 4 x 520);
  - the TTFT of the 31 requests after the first, both ways, is printed with
    its ratio (a measurement, not asserted: timings are not tests here).
"""
import http.client
import json
import os
import sys
import tempfile
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import loomtest as lt  # noqa: E402

PREFIX, SUFFIX, N = 512, 8, 32


def request(port, body):
    status, data = lt.serve_post(port, body)
    lt.check(status == 200, "status %d: %s" % (status, data[:300]))
    if not body.get("stream"):
        ch = json.loads(data)["choices"][0]
        return ch["token_ids"], ch["logprobs"]["token_logprobs"], ch["logprobs"]["top_logprobs"], \
            json.loads(data)["timing"]["ttft_ms"]
    evs = [json.loads(e[6:]) for e in data.split("\n\n") if e.startswith("data: {")]
    toks = [e["choices"][0] for e in evs if "token_id" in e["choices"][0]]
    return [t["token_id"] for t in toks], [t["logprobs"]["token_logprobs"][0] for t in toks], \
        [t["logprobs"]["top_logprobs"][0] for t in toks], None


def counters(port):
    val, health = lt.serve_metrics(port, ("loom_prefill_tokens_total", "loom_prefix_cache_hit_tokens_total"))
    return val, health["prefix_cache"]


def workload(port, prompts):
    out = [None] * len(prompts)
    half = len(prompts) // 2
    for i in range(half):  # one after another
        out[i] = request(port, {"prompt": prompts[i], "max_tokens": 8, "temperature": 0, "logprobs": 2})

    def one(i):
        out[i] = request(port, {"prompt": prompts[i], "max_tokens": 8, "temperature": 0, "logprobs": 2,
                                "stream": i % 2 == 1})
    ths = [threading.Thread(target=one, args=(i,)) for i in range(half, len(prompts))]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return out


def main():
    layout = sys.argv[1:] or ["--tp", "2"]
    print("layout:", " ".join(layout))
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "long.json")
        with open(cfg, "w") as f:
            json.dump({"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "n_positions": 1024}, f)
        data = lt.make_text_data(tmp)
        params = os.path.join(tmp, "long.safetensors")
        lt.run(["train", "--model", cfg, "--data", data, "--steps", 10, "--lr", "3e-3", "--batch", 4, "--seq", 64,
                "--threads", 1, "--save-params", params])
        text = open("/usr/share/common-licenses/GPL-3", "rb").read()
        prefix = list(text[2000:2000 + PREFIX])
        prompts = [prefix + [65 + i] + list(text[9000 + 50 * i:9000 + 50 * i + SUFFIX - 1]) for i in range(N)]

        res, stats = {}, {}
        for tag, extra in (("on", []), ("off", ["--no-prefix-cache"])):
            srv = lt.Server(tmp, ["--model", cfg, "--load-params", params, "--max-seqs", 4, "--queue", 32,
                                  "--threads", 1] + layout + extra, np=2, tag=tag)
            try:
                res[tag] = workload(srv.port, prompts)
                stats[tag] = counters(srv.port)
                c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=300)
                c.request("POST", "/v1/completions", body=json.dumps({
                    "prompt": prefix + [122] + prompts[0][PREFIX + 1:], "max_tokens": 8, "temperature": 0, "n": 4,
                    "logprobs": 2}))
                res[tag + "_n"] = [(ch["token_ids"], ch["logprobs"]["token_logprobs"])
                                   for ch in json.loads(c.getresponse().read())["choices"]]
                c.close()
                stats[tag + "_n"] = counters(srv.port)
            finally:
                rc = srv.stop(tail=400)
            lt.check(rc == 0, "the server exited %s after SIGTERM" % rc)

        def close(a, b):
            return a[0] == b[0] and max(abs(x - y) for x, y in zip(a[1], b[1])) < 1e-5 and all(
                ta.keys() == tb.keys() and max(abs(ta[k] - tb[k]) for k in ta) < 1e-5 for ta, tb in zip(a[2], b[2]))
        same = sum(1 for a, b in zip(res["on"], res["off"]) if close(a, b))
        worst = max(abs(x - y) for a, b in zip(res["on"], res["off"]) for x, y in zip(a[1], b[1]))
        print("prefix caching: %d/%d answers the same with and without it (token ids; log-probabilities and top-2 "
              "within %.1e)" % (same, N, worst))
        lt.check(same == N, "answers differ: %s" % [(i, a[:2], b[:2]) for i, (a, b) in enumerate(zip(
            res["on"], res["off"])) if not close(a, b)][:2])
        on, off = stats["on"][0], stats["off"][0]
        want_on, want_off = PREFIX + SUFFIX + (N - 1) * SUFFIX, N * (PREFIX + SUFFIX)
        print("prefill work: %d prompt tokens computed with the cache (%d taken from it, %d blocks shared), %d "
              "without; ratio %.3f" % (
                  on["loom_prefill_tokens_total"], on["loom_prefix_cache_hit_tokens_total"],
                  stats["on"][1]["shared_blocks"],
                  off["loom_prefill_tokens_total"], on["loom_prefill_tokens_total"] / off["loom_prefill_tokens_total"]))
        lt.check(on["loom_prefill_tokens_total"] == want_on and off["loom_prefill_tokens_total"] == want_off and
                 on["loom_prefix_cache_hit_tokens_total"] == (N - 1) * PREFIX and
                 off["loom_prefix_cache_hit_tokens_total"] == 0 and
                 stats["on"][1]["shared_blocks"] == (N - 1) * PREFIX // 16 and
                 stats["on"][1]["enabled"] and not stats["off"][1]["enabled"],
                 "prefill tokens on %s off %s, want %d and %d; health %s" % (on, off, want_on, want_off, stats))
        n_on, n_off = res["on_n"], res["off_n"]
        same_n = len(n_on) == 4 and all(a[0] == b[0] and max(abs(x - y) for x, y in zip(a[1], b[1])) < 1e-5
                                        for a, b in zip(n_on, n_off)) and all(a[0] == n_on[0][0] for a in n_on)
        d_on = stats["on_n"][0]["loom_prefill_tokens_total"] - on["loom_prefill_tokens_total"]
        d_off = stats["off_n"][0]["loom_prefill_tokens_total"] - off["loom_prefill_tokens_total"]
        d_hit = stats["on_n"][0]["loom_prefix_cache_hit_tokens_total"] - on["loom_prefix_cache_hit_tokens_total"]
        d_copies = stats["on_n"][1]["copies"] - stats["on"][1]["copies"]
        print("n=4: the same answers both ways: %s; prompt tokens computed %d with the cache (%d taken from it, %d "
              "partly filled blocks copied), %d without" % (same_n, d_on, d_hit, d_copies, d_off))
        lt.check(same_n and d_on == SUFFIX + 3 and d_hit == PREFIX + 3 * (PREFIX + SUFFIX - 1) and d_copies == 3 and
                 d_off == 4 * (PREFIX + SUFFIX), "n=4: same %s, computed %d / %d, hits %d" % (same_n, d_on, d_off,
                                                                                           d_hit))
        t_on = [r[3] for r in res["on"][1:N // 2]]
        t_off = [r[3] for r in res["off"][1:N // 2]]
        print("TTFT of the %d sequential requests after the first: %.2f ms with the cache, %.2f ms without "
              "(ratio %.3f; measured, not asserted)" % (len(t_on), sum(t_on) / len(t_on), sum(t_off) / len(t_off),
                                                         sum(t_on) / sum(t_off)))
    lt.done()


main()
