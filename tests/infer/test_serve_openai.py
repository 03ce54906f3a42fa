#!/usr/bin/python3
"""test_serve_openai.py MODE - `loom serve` driven by the official `openai`
Python client (PyPI), as users call it.

MODE gpt2 (tp=2 under mpirun): a GPT-2-vocabulary model (config.json, vocab
50257) trained briefly on BPE shards, served with GPT-2's tokenizer and a
tokenizer_config.json whose chat_template is Qwen's ChatML. The oracle is
transformers' GPT2LMHeadModel in float64 with the same weights and
GPT2TokenizerFast.apply_chat_template:
  - /v1/models lists the served name; another name gets 404 in OpenAI's
    error shape (code model_not_found);
  - greedy chat completions (stream and not) equal apply_chat_template +
    greedy decoding, prompt_tokens equal the template's ids, and the text is
    the oracle's decode;
  - completions: logprobs (each token's and the top 5) equal the oracle's
    log-softmax, and their sum its log-likelihood; chat logprobs and bytes;
    stop strings (cut before the stop, stream and not), stop_token_ids, n
    choices over a list of prompts, echo, presence and frequency penalties
    (greedy tokens equal the oracle's penalised argmax), a seed gives the
    same sampled tokens alone and inside a batch of other requests,
    stream_options.include_usage, max_completion_tokens;
  - unsupported fields and values are 400s naming the field; invalid UTF-8
    in a request is a 400.
MODE moe (ep=2): the same chat, logprob and seed checks on a GPT-2-vocabulary
Mixture-of-Experts model (Mixtral's config keys) against the float64
PyTorch oracle (tests/oracle/torch_gpt2.py).
MODE utf8 (one rank): a byte-level model trained on multilingual and emoji
text (tests/infer/tokcorpus.py) answers 520 sampled requests (half
streaming, some through the openai client): every body and event must be
strict UTF-8 JSON, every text the lossy decoding of its token ids
(bytes.decode("utf-8", "replace"), as Hugging Face decodes), and a stream's
texts must add up to the same.
"""
import http.client
import json
import os
import random
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, HERE)
import loomtest as lt  # noqa: E402
import chat_templates as ct  # noqa: E402
import tokcorpus  # noqa: E402

import numpy as np  # noqa: E402

NAME = "tiny-chat"
EOT = 50256
CONVS = [
    [{"role": "user", "content": "What does the GNU General Public License say?"}],
    [{"role": "system", "content": "You answer in one line."}, {"role": "user", "content": "Hello there"},
     {"role": "assistant", "content": "Hi! What can I do?"}, {"role": "user", "content": "Explain copyleft."}],
    [{"role": "user", "content": "\u00e9t\u00e9 \U0001f600 \u65e5\u672c\u8a9e"}],
]
PROMPTS = ["The GNU General Public License is", "You may convey verbatim copies of the", "This program is free"]
MIXTRAL = {"num_local_experts": 4, "num_experts_per_tok": 1, "moe_layer_freq": 2, "moe_intermediate_size": 48,
           "norm_topk_prob": False, "router_aux_loss_coef": 0.01}


# ---- the server ----------------------------------------------------------------

def start(tmp, args, np_):
    srv = lt.Server(tmp, args + ["--threads", 1, "--served-model-name", NAME], np=np_)
    return srv, srv.port


def stop(srv):
    rc = srv.stop(tail=1200)
    lt.check(rc == 0, "the server exited %s after SIGTERM" % rc)


def raw_post(port, path, body, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", path, body=body if isinstance(body, bytes) else json.dumps(body).encode(),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def client(port):
    import openai
    return openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="none", max_retries=0, timeout=120)


# ---- oracles ------------------------------------------------------------------------

def hf_oracle(params, V):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=V, n_positions=128, n_embd=64, n_layer=2, n_head=4, activation_function="gelu_new",
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5)
    model = GPT2LMHeadModel(cfg).eval()
    sd = {"transformer." + k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in lt.st.load(params)[0].items()}
    model.load_state_dict(sd, strict=False)
    model.tie_weights()
    model = model.double()

    def logits(seq):
        with torch.no_grad():
            return model(torch.tensor([seq])).logits[0, -1].numpy()
    return logits


def moe_oracle(params, V):
    import torch
    sys.path.insert(0, os.path.join(lt.SRC, "tests", "oracle"))
    import torch_gpt2 as tg
    cfg = tg.Config(n_layer=2, n_head=4, n_embd=64, vocab_size=V, n_positions=128, n_expert=4, top_k=1, moe_every=2,
                    expert_hidden=48, norm_topk=False)
    p = tg.params_from_numpy(lt.st.load(params)[0], cfg, dtype=torch.float64, requires_grad=False)

    def logits(seq):
        with torch.no_grad():
            return tg.forward(p, cfg, torch.tensor([seq]))[0][0, -1].numpy()
    return logits


def log_softmax(x):
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def greedy(logits, ids, n, presence=0.0, frequency=0.0, stop_eot=True):
    out = []
    for _ in range(n):
        x = logits(ids + out).copy()
        for t in set(out):
            x[t] -= presence + frequency * out.count(t)
        t = int(np.argmax(x))
        out.append(t)
        if stop_eot and t == EOT:
            break
    return out


# ---- checks -------------------------------------------------------------------------

def check_models(c):
    import openai
    ids = [m.id for m in c.models.list().data]
    lt.check(ids == [NAME], "/v1/models: %s" % ids)
    for call in (lambda: c.models.retrieve("nope"),
                 lambda: c.completions.create(model="nope", prompt="x", max_tokens=1)):
        try:
            call()
            lt.check(False, "an unknown model was answered")
        except openai.NotFoundError as e:
            body = e.body if isinstance(e.body, dict) else {}
            lt.check(body.get("code") == "model_not_found" and body.get("param") == "model"
                     and "nope" in body.get("message", ""), "unknown model: %s" % e.body)
    print("models: /v1/models lists %s; an unknown model gets 404 model_not_found" % ids)


def check_chat(c, tok, logits):
    same = 0
    for conv in CONVS:
        ids = tok.apply_chat_template(conv, add_generation_prompt=True)
        want = greedy(logits, ids, 16)
        r = c.chat.completions.create(model=NAME, messages=conv, max_tokens=16, temperature=0)
        ch = r.choices[0]
        text = tok.decode([t for t in want if t != EOT])
        ok = ch.token_ids == want and r.usage.prompt_tokens == len(ids) and ch.message.content == text
        s = c.chat.completions.create(model=NAME, messages=conv, max_tokens=16, temperature=0, stream=True)
        events = list(s)
        streamed = "".join(e.choices[0].delta.content or "" for e in events if e.choices)
        roles = [e.choices[0].delta.role for e in events if e.choices and e.choices[0].delta.role]
        ok = ok and streamed == text and roles == ["assistant"] and events[-1].choices[0].finish_reason == ch.finish_reason
        same += ok
        lt.check(ok, "chat %r: loom %s (%d prompt tokens) %r, stream %r; oracle %s (%d) %r" % (
            conv[-1]["content"], ch.token_ids, r.usage.prompt_tokens, ch.message.content, streamed, want, len(ids),
            text))
    print("chat: %d/%d greedy completions equal apply_chat_template + greedy decoding (stream and not)" % (
        same, len(CONVS)))


def check_logprobs(c, tok, logits):
    worst, worst_sum = 0.0, 0.0
    for p in PROMPTS:
        ids = tok(p)["input_ids"]
        r = c.completions.create(model=NAME, prompt=p, max_tokens=10, temperature=0, logprobs=5)
        ch = r.choices[0]
        lp = ch.logprobs
        seq, total_want = list(ids), 0.0
        for k, t in enumerate(ch.token_ids):
            ls = log_softmax(logits(seq))
            top = np.argsort(-ls, kind="stable")[:5]
            worst = max(worst, abs(lp.token_logprobs[k] - ls[t]),
                        max(abs(a - b) for a, b in zip(sorted(lp.top_logprobs[k].values(), reverse=True),
                                                       ls[top][:len(lp.top_logprobs[k])])))
            lt.check(t == int(top[0]) and lp.tokens[k] == tok.decode([t]), "greedy token %d: %d %r vs oracle top %d" % (
                k, t, lp.tokens[k], top[0]))
            total_want += ls[t]
            seq.append(t)
        worst_sum = max(worst_sum, abs(sum(lp.token_logprobs) - total_want))
    r = c.chat.completions.create(model=NAME, messages=CONVS[0], max_tokens=6, temperature=0, logprobs=True,
                                  top_logprobs=3)
    ids = tok.apply_chat_template(CONVS[0], add_generation_prompt=True)
    seq = list(ids)
    for e, t in zip(r.choices[0].logprobs.content, r.choices[0].token_ids):
        ls = log_softmax(logits(seq))
        worst = max(worst, abs(e.logprob - ls[t]))
        lt.check(len(e.top_logprobs) == 3 and e.top_logprobs[0].logprob == e.logprob and
                 bytes(e.bytes).decode("utf-8", "replace") == tok.decode([t]) == e.token, "chat logprob entry %s" % e)
        seq.append(t)
    print("logprobs: each token's and the top 5 within %.2e of the oracle's log-softmax; sums within %.2e" % (
        worst, worst_sum))
    lt.check(worst < 1e-3 and worst_sum < 5e-3, "logprobs differ by %.3e, sums by %.3e" % (worst, worst_sum))


def check_stop(c, tok):
    sampled = {"temperature": 0.9, "seed": 5}  # a barely trained model repeats itself when greedy
    outs = [(p, c.completions.create(model=NAME, prompt=p, max_tokens=24, **sampled).choices[0]) for p in PROMPTS]
    prompt, base = max(outs, key=lambda o: len(set(o[1].token_ids)))  # the most varied continuation
    text, ids = base.text, base.token_ids
    s = text[len(text) // 2:len(text) // 2 + 3]
    want = text[:text.find(s)]
    r = c.completions.create(model=NAME, prompt=prompt, max_tokens=24, stop=[s, "\u2603never"], **sampled)
    st = c.completions.create(model=NAME, prompt=prompt, max_tokens=24, stop=s, stream=True, **sampled)
    events = list(st)
    streamed = "".join(e.choices[0].text for e in events)
    ok = r.choices[0].text == want and r.choices[0].finish_reason == "stop" and streamed == want and \
        events[-1].choices[0].finish_reason == "stop"
    lt.check(ok, "stop %r in %r: got %r (%s), stream %r" % (s, text, r.choices[0].text, r.choices[0].finish_reason,
                                                             streamed))
    t = ids[len(ids) // 2]
    first = ids.index(t)
    r = c.completions.create(model=NAME, prompt=prompt, max_tokens=24, extra_body={"stop_token_ids": [t]}, **sampled)
    ok2 = r.choices[0].token_ids == ids[:first + 1] and r.choices[0].finish_reason == "stop" and \
        r.choices[0].text == tok.decode(ids[:first])
    lt.check(ok2, "stop_token_ids [%d]: %s %r" % (t, r.choices[0].token_ids, r.choices[0].text))
    print("stop: the string %r cuts %r to %r (stream too); stop_token_ids [%d] ends after %d tokens" % (
        s, text, want, t, first + 1))


def check_n_echo_usage(c, tok):
    r = c.completions.create(model=NAME, prompt=PROMPTS[:2], n=3, max_tokens=8, temperature=1.0, seed=11)
    r2 = c.completions.create(model=NAME, prompt=PROMPTS[:2], n=3, max_tokens=8, temperature=1.0, seed=11)
    idx = [ch.index for ch in r.choices]
    distinct = len(set(tuple(ch.token_ids) for ch in r.choices[:3]))
    lt.check(idx == list(range(6)) and [ch.text for ch in r.choices] == [ch.text for ch in r2.choices] and
             distinct >= 2 and r.usage.completion_tokens == sum(len(ch.token_ids) for ch in r.choices),
             "n=3 x 2 prompts: indices %s, %d distinct, usage %s" % (idx, distinct, r.usage))
    g = c.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=4, temperature=0).choices[0].text
    e = c.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=4, temperature=0, echo=True).choices[0].text
    lt.check(e == PROMPTS[0] + g, "echo: %r vs %r" % (e, PROMPTS[0] + g))
    s = c.completions.create(model=NAME, prompt=PROMPTS[2], max_tokens=7, temperature=0, stream=True,
                             stream_options={"include_usage": True})
    events = list(s)
    last = events[-1]
    ntok = sum(1 for ev in events if ev.choices and getattr(ev.choices[0], "token_id", None) is not None)
    lt.check(last.choices == [] and last.usage and last.usage.completion_tokens == ntok and
             all(ev.usage is None for ev in events[:-1]), "include_usage: last %s, %d token events" % (last, ntok))
    r = c.chat.completions.create(model=NAME, messages=CONVS[0], max_completion_tokens=5, temperature=0.5, seed=3,
                                  extra_body={"ignore_eos": True})
    lt.check(r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length",
             "max_completion_tokens 5: %s" % r.usage)
    print("n=3 over 2 prompts: 6 choices, %d distinct of 3, reproduced by the seed; echo; include_usage; "
          "max_completion_tokens" % distinct)


def check_penalties(c, tok, logits):
    ids = tok(PROMPTS[2])["input_ids"]
    want = greedy(logits, ids, 20, presence=0.6, frequency=1.2)
    plain = greedy(logits, ids, 20)
    r = c.completions.create(model=NAME, prompt=PROMPTS[2], max_tokens=20, temperature=0, presence_penalty=0.6,
                             frequency_penalty=1.2)
    lt.check(r.choices[0].token_ids == want, "penalties: %s vs oracle %s" % (r.choices[0].token_ids, want))
    print("penalties: greedy tokens equal the oracle's penalised argmax (%d of 20 differ from no penalty)" %
          sum(1 for a, b in zip(want, plain) if a != b))


def check_seed_in_batch(c, port):
    body = {"model": NAME, "prompt": PROMPTS[0], "max_tokens": 20, "temperature": 1.0, "top_p": 0.95, "seed": 1234}
    alone = json.loads(raw_post(port, "/v1/completions", body)[1])["choices"][0]["token_ids"]
    res = {}

    def one(i):
        if i % 3 == 0:
            b = dict(body, stream=i % 2 == 1)
        else:
            b = {"model": NAME, "prompt": PROMPTS[i % 3] * (1 + i % 2), "max_tokens": 5 + 3 * i, "temperature": 0.8,
                 "stream": i % 2 == 0}
        st, data = raw_post(port, "/v1/completions", b)
        if b.get("stream"):
            evs = [json.loads(e[6:]) for e in data.decode().split("\n\n") if e.startswith("data: {")]
            res[i] = [e["choices"][0]["token_id"] for e in evs if e["choices"] and "token_id" in e["choices"][0]]
        else:
            res[i] = json.loads(data)["choices"][0]["token_ids"]

    ths = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    batched = [res[i] for i in range(0, 12, 3)]
    other = json.loads(raw_post(port, "/v1/completions", dict(body, seed=99))[1])["choices"][0]["token_ids"]
    lt.check(all(b == alone for b in batched) and other != alone, "seed 1234 alone %s, in a batch %s; seed 99 %s" % (
        alone, batched, other))
    print("seed: the same sampled tokens alone and %d times inside a batch of 12 requests; another seed differs" %
          len(batched))


def check_refusals(c, port):
    import openai
    cases = [
        ("foo", lambda: c.completions.create(model=NAME, prompt="x", extra_body={"foo": 1})),
        ("logit_bias", lambda: c.completions.create(model=NAME, prompt="x", logit_bias={"5": 1})),
        ("n", lambda: c.completions.create(model=NAME, prompt="x", n=0)),
        ("echo", lambda: c.completions.create(model=NAME, prompt="x", echo=True, logprobs=1)),
        ("tools", lambda: c.chat.completions.create(model=NAME, messages=CONVS[0], tools=[
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])),
        ("response_format", lambda: c.chat.completions.create(model=NAME, messages=CONVS[0],
                                                              response_format={"type": "json_object"})),
        ("top_logprobs", lambda: c.chat.completions.create(model=NAME, messages=CONVS[0], top_logprobs=2)),
        ("messages[0].content", lambda: c.chat.completions.create(model=NAME, messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}])),
        ("messages[0].tool_calls", lambda: c.chat.completions.create(model=NAME, messages=[
            {"role": "assistant", "content": "x", "tool_calls": []}])),
    ]
    ok = 0
    for param, call in cases:
        try:
            call()
            lt.check(False, "%s was accepted" % param)
        except openai.BadRequestError as e:
            good = isinstance(e.body, dict) and e.body.get("param") == param and param in e.body.get("message", "")
            ok += good
            lt.check(good, "%s: %s" % (param, e.body))
    bad_utf8 = [(b'{"model": "%s", "prompt": "ab\xff"}' % NAME.encode(), "/v1/completions"),
                (b'{"prompt": "\xed\xa0\x80"}', "/v1/completions"),
                (b'{"prompt": "ok \\ud800"}', "/v1/completions"),
                (b'{"messages": [{"role": "user", "content": "\xc3("}]}', "/v1/chat/completions")]
    for body, path in bad_utf8:
        st, data = raw_post(port, path, body)
        msg = json.loads(data)["error"]["message"]
        ok += st == 400
        lt.check(st == 400 and ("UTF-8" in msg or "JSON" in msg), "invalid UTF-8 %r: %d %s" % (body, st, msg))
    # error messages quote what the client sent, cut to a length: still valid UTF-8
    st, data = raw_post(port, "/v1/completions", {"model": "\u20ac" * 150, "prompt": "x"})
    err = json.loads(data.decode("utf-8"))["error"]
    ok += st == 404
    lt.check(st == 404 and err["code"] == "model_not_found", "a long unknown model name: %d %s" % (st, err))
    print("refusals: %d/%d unsupported fields, invalid UTF-8 bodies and a long unknown model answered 400 naming "
          "the field (404)" % (ok, len(cases) + len(bad_utf8) + 1))


# ---- modes -------------------------------------------------------------------------------

def bpe_setup(tmp, cfg_extra):
    cfg = os.path.join(tmp, "model", "config.json")
    os.makedirs(os.path.dirname(cfg))
    with open(cfg, "w") as f:
        json.dump(dict({"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 50257, "n_positions": 128},
                       **cfg_extra), f)
    tokdir = os.path.join(tmp, "tok")
    os.makedirs(tokdir)
    for n in ("encoder.json", "vocab.bpe"):
        os.symlink(os.path.join(tokcorpus.GPT2_FILES, n), os.path.join(tokdir, n))
    with open(os.path.join(tokdir, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": ct.TEMPLATES["qwen"], "bos_token": "<|endoftext|>",
                   "eos_token": "<|endoftext|>"}, f)
    shard = os.path.join(tmp, "bpe.bin")
    lt.run(["data", "--tokenizer", tokcorpus.GPT2_FILES, "--input", "/usr/share/common-licenses/GPL-3", "--out", shard,
            "--val", ""])
    params = os.path.join(tmp, "model.safetensors")
    lt.run(["train", "--model", cfg, "--data", shard, "--steps", 30, "--lr", "3e-3", "--batch", 4, "--seq", 64,
            "--threads", 1, "--save-params", params])
    tok = tokcorpus.hf_fast()
    tok.chat_template = ct.TEMPLATES["qwen"]
    return cfg, tokdir, params, tok


def run_bpe(tmp, mode):
    import torch
    torch.set_num_threads(1)
    cfg, tokdir, params, tok = bpe_setup(tmp, MIXTRAL if mode == "moe" else {})
    logits = (moe_oracle if mode == "moe" else hf_oracle)(params, 50257)
    layout = ["--ep", 2] if mode == "moe" else ["--tp", 2]
    srv, port = start(tmp, ["--model", cfg, "--load-params", params, "--tokenizer", tokdir, "--max-seqs", 8]
                           + layout, 2)
    print("layout:", layout)
    try:
        c = client(port)
        check_models(c)
        check_chat(c, tok, logits)
        check_logprobs(c, tok, logits)
        check_seed_in_batch(c, port)
        if mode == "gpt2":
            check_stop(c, tok)
            check_n_echo_usage(c, tok)
            check_penalties(c, tok, logits)
            check_refusals(c, port)
    finally:
        stop(srv)


def run_utf8(tmp):
    docs = tokcorpus.documents(300_000)
    text = os.path.join(tmp, "multi.txt")
    with open(text, "w") as f:
        f.write("\n".join(docs))
    data = os.path.join(tmp, "multi.bin")
    lt.run(["data", "--input", text, "--out", data, "--val", ""])
    params = os.path.join(tmp, "bytes.safetensors")
    lt.run(["train", "--model", "tiny", "--data", data, "--steps", 150, "--lr", "3e-3", "--batch", 8, "--seq", 64,
            "--threads", 1, "--save-params", params])
    srv, port = start(tmp, ["--model", "tiny", "--load-params", params, "--max-seqs", 8, "--queue", 600], 1)
    rng = random.Random(3)
    pool = [d for d in docs if len(d) > 40]
    stats = {"requests": 0, "invalid": 0, "mismatch": 0, "fffd": 0, "client": 0}
    lock = threading.Lock()

    def prompt():
        d = rng.choice(pool)
        a = rng.randrange(len(d) - 30)
        return d[a:a + rng.randrange(3, 30)]

    jobs = [{"model": NAME, "prompt": prompt(), "max_tokens": rng.randrange(8, 48),
             "temperature": rng.choice([0.8, 1.0, 1.3]), "seed": i, "stream": i % 2 == 1} for i in range(520)]

    def raw(b):
        st, data = raw_post(port, "/v1/completions", b)
        data.decode("utf-8")  # strict: raises on invalid UTF-8
        if not b["stream"]:
            ch = json.loads(data)["choices"][0]
            return ch["text"], ch["token_ids"]
        evs = [json.loads(e[6:]) for e in data.decode().split("\n\n") if e.startswith("data: {")]
        lt.check(data.decode().endswith("data: [DONE]\n\n"), "a stream without [DONE]")
        return "".join(e["choices"][0]["text"] for e in evs), [e["choices"][0]["token_id"] for e in evs
                                                                if "token_id" in e["choices"][0]]

    def via_client(b):
        c = client(port)
        if not b["stream"]:
            ch = c.completions.create(**{k: v for k, v in b.items() if k != "stream"}).choices[0]
            return ch.text, ch.token_ids
        evs = list(c.completions.create(**b))
        return "".join(e.choices[0].text for e in evs), [e.choices[0].token_id for e in evs
                                                         if getattr(e.choices[0], "token_id", None) is not None]

    def worker(k):
        for i in range(k, len(jobs), 8):
            b = jobs[i]
            use_client = i % 5 == 0
            try:
                text, ids = (via_client if use_client else raw)(b)
                want = bytes(ids).decode("utf-8", "replace")
                bad = text != want
            except UnicodeDecodeError:
                bad, text = "invalid", ""
            with lock:
                stats["requests"] += 1
                stats["client"] += use_client
                stats["invalid"] += bad == "invalid"
                stats["mismatch"] += bad is True
                stats["fffd"] += "\ufffd" in text
                if bad and stats["invalid"] + stats["mismatch"] <= 3:
                    print("request %d: text %r, ids %s" % (i, text, ids if bad is True else "?"))

    try:
        ths = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        t0 = time.time()
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        print("utf8: %d requests (%d through the openai client) in %.1f s: %d not strict UTF-8, %d texts differ from "
              "the lossy decoding of their ids; %d texts hold U+FFFD" % (
                  stats["requests"], stats["client"], time.time() - t0, stats["invalid"], stats["mismatch"],
                  stats["fffd"]))
        lt.check(stats["requests"] == 520 and stats["invalid"] == 0 and stats["mismatch"] == 0 and stats["fffd"] > 0,
                 "utf8: %s" % stats)
    finally:
        stop(srv)


def main():
    mode = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        if mode == "utf8":
            run_utf8(tmp)
        else:
            run_bpe(tmp, mode)
    lt.done()


main()
