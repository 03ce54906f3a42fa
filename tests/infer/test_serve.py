#!/usr/bin/python3
"""test_serve.py - `loom serve` on loopback under mpirun (2 ranks: tp=2, or
the flags given, e.g. `--pp 2`; with `--dp 2` both replicas' ports first answer
concurrent greedy requests with loom generate's tokens, then replica 0 gets the
checks below; `--model tiny-moe --ep 2` serves a Mixture-of-Experts model
with its experts split over the two ranks).

A tiny byte-level model is trained briefly and served with 4 KV slots and a
wait queue of 8. Checked:
  - 12 concurrent greedy requests, half streaming (SSE), each get exactly the
    tokens `loom generate` gives for that prompt on one rank, streams end with
    [DONE] and carry one event per token;
  - bad requests get their 4xx with a JSON error: malformed JSON, wrong
    types, empty prompt, over-long prompt, huge max_tokens, body over
    --max-body (413), unknown path (404), wrong method (405);
  - a burst of 24 concurrent long requests: each is either served in full
    (200, max_tokens tokens) or refused with 503 - at least one of each;
  - a client that disconnects mid-stream: the server keeps running, /health
    returns to 0 running sequences, 0 waiting and 0 KV positions in use, and
    never shows a request waiting beside a free KV slot;
  - /health reports TTFT and inter-token p50 <= p95 <= p99;
  - a second server on the port in use exits 69 naming it;
  - SIGTERM stops every rank (the launcher exits within 30 s).
"""
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import loomtest as lt  # noqa: E402


def post(port, body, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/completions", body=body if isinstance(body, (bytes, str)) else json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read().decode("utf-8", "replace")
    c.close()
    return r.status, data


def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path)
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    return r.status, data


def completion_ids(status, data, stream):
    if status != 200:
        return None
    if not stream:
        return json.loads(data)["choices"][0]["token_ids"]
    events = [e[len("data: "):] for e in data.split("\n\n") if e.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        return None
    return [json.loads(e)["choices"][0]["token_id"] for e in events[:-1]]


def main():
    args = sys.argv[1:]
    model = "tiny"
    if "--model" in args:  # e.g. --model tiny-moe --ep 2: the rest is the layout
        i = args.index("--model")
        model = args[i + 1]
        del args[i:i + 2]
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        params = os.path.join(tmp, "tiny.safetensors")
        lt.run(["train", "--model", model, "--data", data, "--steps", 60, "--lr", "3e-3", "--batch", 8, "--seq",
                64, "--threads", 1, "--save-params", params])
        text = open("/usr/share/common-licenses/GPL-3", "rb").read()
        prompts = [list(text[1000 + 400 * i:1000 + 400 * i + 10 + 3 * i]) for i in range(12)]
        ids_file = os.path.join(tmp, "p.txt")
        with open(ids_file, "w") as f:
            f.write("\n".join(",".join(map(str, p)) for p in prompts) + "\n")
        p = lt.run(["generate", "--model", model, "--load-params", params, "--ids-file", ids_file, "--max-tokens",
                    24, "--format", "ids", "--threads", 1])
        want = [[int(t) for t in line.split()] for line in p.stdout.strip().splitlines()]

        port_file = os.path.join(tmp, "port")
        log = open(os.path.join(tmp, "serve.log"), "w")
        layout = args or ["--tp", "2"]
        print("layout:", " ".join(layout))
        print("model:", model)
        srv = subprocess.Popen([lt.LOOM_RUN, "-np", "2", lt.LOOM, "serve", "--model", model, "--load-params",
                                params] + layout + ["--port", "0", "--port-file", port_file, "--max-seqs", "4",
                                "--queue", "8", "--max-body", "4096", "--threads", "1"], stdout=log,
                               stderr=subprocess.STDOUT)
        try:
            for _ in range(300):
                if os.path.exists(port_file) and open(port_file).read().strip():
                    break
                time.sleep(0.1)
            port = int(open(port_file).read())
            if "--dp" in layout:  # replica 1 answers on its own port, the same tokens, while replica 0 is busy
                for _ in range(300):
                    if os.path.exists(port_file + ".1") and open(port_file + ".1").read().strip():
                        break
                    time.sleep(0.1)
                port1 = int(open(port_file + ".1").read())
                res = [None] * len(prompts)
                ths = [threading.Thread(target=lambda i: res.__setitem__(i, post(port1 if i % 2 else port, {
                    "prompt": prompts[i], "max_tokens": 24, "temperature": 0})), args=(i,)) for i in range(len(prompts))]
                for t in ths:
                    t.start()
                for t in ths:
                    t.join()
                same = sum(1 for i, (st, d) in enumerate(res) if completion_ids(st, d, False) == want[i])
                print("dp=2: requests spread over both replicas' ports identical to loom generate: %d/%d"
                      % (same, len(prompts)))
                lt.check(same == len(prompts) and port1 != port, "dp=2 replicas: %d/%d" % (same, len(prompts)))
            run_checks(port, prompts, want)
            p = lt.run(["serve", "--model", model, "--load-params", params, "--port", port, "--threads", 1],
                       check_ok=False, timeout=60)
            lt.check(p.returncode == 69 and "cannot listen on 127.0.0.1:%d" % port in p.stderr,
                     "a second server on the same port: %d %r" % (p.returncode, p.stderr[-200:]))
        finally:
            srv.send_signal(signal.SIGTERM)
            try:
                srv.wait(timeout=30)
                stopped = True
            except subprocess.TimeoutExpired:
                srv.kill()
                srv.wait()
                stopped = False
            log.close()
            print(open(os.path.join(tmp, "serve.log")).read()[-1500:])
        lt.check(stopped, "SIGTERM did not stop the server within 30 s")
    lt.done()


def run_checks(port, prompts, want):
    # concurrent greedy requests, half streaming
    results = [None] * len(prompts)

    def one(i):
        stream = i % 2 == 1
        st, data = post(port, {"prompt": prompts[i], "max_tokens": 24, "temperature": 0, "stream": stream})
        results[i] = (st, completion_ids(st, data, stream))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = sum(1 for i, r in enumerate(results) if r and r[0] == 200 and r[1] == want[i])
    print("concurrent greedy requests identical to loom generate: %d/%d" % (ok, len(prompts)))
    lt.check(ok == len(prompts), "concurrent requests: %s" % [(r[0], r[1] == want[i]) for i, r in enumerate(results)])

    # a text prompt (no tokenizer: its bytes) continues as the same ids do
    text = bytes(prompts[3]).decode("latin-1")
    st, data = post(port, {"prompt": text, "max_tokens": 24, "temperature": 0})
    lt.check(st == 200 and completion_ids(st, data, False) == want[3], "text prompt: %d %s" % (st, data[:200]))

    bad = [("{\"prompt\": ", 400, "not a JSON object"), ({"max_tokens": 3}, 400, "'prompt' is required"),
           ({"prompt": 5}, 400, "must be a string"), ({"prompt": [1, "x"]}, 400, "token ids must be integers"),
           ({"prompt": [1, 300]}, 400, "token ids must be integers"), ({"prompt": ""}, 400, "is empty"),
           ({"prompt": "a", "max_tokens": "9"}, 400, "'max_tokens' must be an integer"),
           ({"prompt": "a", "temperature": -1}, 400, "temperature"), ({"prompt": "a", "top_p": 0}, 400, "'top_p'"),
           ({"prompt": "a", "stream": 1}, 400, "true or false"),
           ({"prompt": [65] * 200}, 400, "exceeds the context length 128"),
           ({"prompt": "hello", "max_tokens": 10 ** 8}, 400, "exceeds the context length"),
           (json.dumps({"prompt": "x" * 5000}), 413, "over 4096 bytes")]
    for body, code, msg in bad:
        st, data = post(port, body)
        try:
            err = json.loads(data)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            err = None
        lt.check(st == code and err and msg in err, "bad request %r: %d %r" % (str(body)[:60], st, data[:200]))
    st, data = get(port, "/nope")
    lt.check(st == 404 and "error" in json.loads(data), "unknown path: %d" % st)
    st, data = get(port, "/v1/completions")
    lt.check(st == 405 and "error" in json.loads(data), "GET /v1/completions: %d" % st)
    print("bad requests: %d cases answered with their 4xx and a JSON error" % (len(bad) + 2))

    # a burst larger than slots + queue: 200 in full or 503
    burst = [None] * 24

    def long_one(i):
        burst[i] = post(port, {"prompt": [65 + i % 20] * 5, "max_tokens": 100, "temperature": 0.7, "seed": i})

    threads = [threading.Thread(target=long_one, args=(i,)) for i in range(len(burst))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    served = sum(1 for st, d in burst if st == 200 and len(json.loads(d)["choices"][0]["token_ids"]) == 100)
    refused = sum(1 for st, d in burst if st == 503 and json.loads(d)["error"]["code"] == "server_busy")
    print("burst of %d: %d served in full, %d refused with 503" % (len(burst), served, refused))
    lt.check(served + refused == len(burst) and served >= 1 and refused >= 1,
             "burst: %s" % [st for st, _ in burst])

    # a client that goes away mid-stream
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    body = json.dumps({"prompt": [70] * 4, "max_tokens": 120, "temperature": 0.9, "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
              % len(body) + body)
    first = s.recv(256)
    s.close()
    lt.check(b"200" in first.split(b"\r\n")[0], "streaming client got %r" % first[:60])
    h = None
    queued_beside_free = []  # a request must never wait while a KV slot is free
    for _ in range(100):
        h = json.loads(get(port, "/health")[1])
        if h["waiting"] > 0 and h["running"] < h["kv_cache"]["slots"]:
            queued_beside_free.append(h)
        if h["running"] == 0 and h["kv_cache"]["positions_used"] == 0 and h["waiting"] == 0:
            break
        time.sleep(0.1)
    lt.check(not queued_beside_free, "a request waited beside a free KV slot: %s" % queued_beside_free[:1])
    lt.check(h["running"] == 0 and h["kv_cache"]["positions_used"] == 0 and h["waiting"] == 0,
             "after a disconnect the cache is not freed: %s" % h)
    st, data = post(port, {"prompt": prompts[0], "max_tokens": 24, "temperature": 0})
    lt.check(st == 200 and completion_ids(st, data, False) == want[0], "server after the disconnect: %d" % st)
    print("disconnect mid-stream: slot freed, server still answers")

    for name in ("ttft_ms", "inter_token_ms"):
        q = h[name]
        lt.check(q["count"] > 0 and 0 <= q["p50"] <= q["p95"] <= q["p99"], "%s percentiles %s" % (name, q))
    print("health: ttft p50 %.2f p95 %.2f p99 %.2f ms; inter-token p50 %.3f p95 %.3f p99 %.3f ms; %.0f tokens/s"
          % (h["ttft_ms"]["p50"], h["ttft_ms"]["p95"], h["ttft_ms"]["p99"], h["inter_token_ms"]["p50"],
             h["inter_token_ms"]["p95"], h["inter_token_ms"]["p99"], h["tokens_per_s"]))


main()
