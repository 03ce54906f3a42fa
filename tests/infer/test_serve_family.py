#!/usr/bin/python3
"""test_serve_family.py ARCH - `loom serve --model DIR` of a Hugging Face
directory of another family, driven by the official `openai` client, against
transformers' apply_chat_template + generate.

ARCH llama (tp 2) or mixtral (ep 2). The directory is made by transformers'
save_pretrained (tests/oracle/hf_models.py: a tiny random model, GQA with 2
key/value heads; Mixtral with 4 experts, top 2) beside a byte-level BPE
tokenizer.json trained here with `tokenizers` (no hub is reachable) with the
family's special tokens, and a tokenizer_config.json holding the family's
published chat template (Llama 3 Instruct's; Mixtral Instruct's) and its
BOS/EOS. loom reads all of it from the one directory. For each conversation:
  - the chat completion's token ids (greedy, 16 tokens, stream and not) equal
    transformers' generate(do_sample=False) after apply_chat_template, in
    float64 with eager attention; prompt_tokens equal the template's ids; the
    message and the streamed deltas equal the tokenizer's decode;
  - the same requests sent concurrently (continuous batching) give the same ids.
"""
import json
import os
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, HERE)
import loomtest as lt  # noqa: E402
import chat_templates as ct  # noqa: E402
import tokcorpus  # noqa: E402

sys.path.insert(0, os.path.join(lt.SRC, "tests", "oracle"))
import hf_models  # noqa: E402

NAME = "family-chat"
NEW = 16
# arch -> (special tokens, bos, eos, chat template, config keys, layout)
FAMILIES = {
    "llama": (["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
              "<|begin_of_text|>", "<|eot_id|>", ct.TEMPLATES["llama3"], dict(num_key_value_heads=2), ["--tp", 2]),
    "mixtral": (["<unk>", "<s>", "</s>"], "<s>", "</s>", ct.TEMPLATES["mixtral"],
                dict(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2), ["--ep", 2]),
}
CONVS = [
    [{"role": "user", "content": "What does the GNU General Public License say?"}],
    [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi! What can I do?"},
     {"role": "user", "content": "Explain copyleft."}],
    [{"role": "user", "content": "\u00e9t\u00e9 \U0001f600 \u65e5\u672c\u8a9e"}],
]


def make_dir(tmp, arch):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    special, bos, eos, template, keys, _ = FAMILIES[arch]
    d = os.path.join(tmp, arch)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=400, min_frequency=2, show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(tokcorpus.documents(200000), trainer=tr)
    tok.add_special_tokens(special)
    tok.post_processor = processors.TemplateProcessing(single=bos + " $A", special_tokens=[(bos, tok.token_to_id(bos))])
    V = tok.get_vocab_size()
    hf_models.make(d, arch, vocab_size=V, max_position_embeddings=256, **keys)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": template, "bos_token": bos, "eos_token": eos}, f)
    return d, V


def hf_side(d):
    from transformers import PreTrainedTokenizerFast
    _, bos, eos, template, _, _ = FAMILIES[os.path.basename(d)]
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(d, "tokenizer.json"), bos_token=bos, eos_token=eos)
    tok.chat_template = template
    return tok, hf_models.load(d)


def want_ids(tok, model, conv):
    import torch
    ids = tok.apply_chat_template(conv, add_generation_prompt=True)
    eos = tok.convert_tokens_to_ids(tok.eos_token)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, eos_token_id=eos,
                             pad_token_id=eos)
    return ids, out[0, len(ids):].tolist(), eos


def main():
    import openai
    import torch
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)  # transformers 4.40's Mixtral builds its mask in the default dtype
    arch = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        d, V = make_dir(tmp, arch)
        tok, model = hf_side(d)
        wants = [want_ids(tok, model, conv) for conv in CONVS]
        layout = FAMILIES[arch][5]
        srv = lt.Server(tmp, ["--model", d, "--threads", 1, "--served-model-name", NAME, "--max-seqs", 8] + layout,
                        np=2)
        try:
            c = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % srv.port, api_key="none", max_retries=0,
                              timeout=300)
            same = 0
            for conv, (ids, want, eos) in zip(CONVS, wants):
                r = c.chat.completions.create(model=NAME, messages=conv, max_tokens=NEW, temperature=0)
                ch = r.choices[0]
                text = tok.decode([t for t in want if t != eos])
                s = c.chat.completions.create(model=NAME, messages=conv, max_tokens=NEW, temperature=0, stream=True)
                events = list(s)
                streamed = "".join(e.choices[0].delta.content or "" for e in events if e.choices)
                ok = (ch.token_ids == want and r.usage.prompt_tokens == len(ids) and ch.message.content == text and
                      streamed == text and events[-1].choices[0].finish_reason == ch.finish_reason)
                same += ok
                lt.check(ok, "%s chat %r: loom %s (%d prompt tokens) %r, stream %r; transformers %s (%d) %r" % (
                    arch, conv[-1]["content"], ch.token_ids, r.usage.prompt_tokens, ch.message.content, streamed,
                    want, len(ids), text))
            print("%s %s: %d/%d greedy chat completions (stream and not) equal transformers' apply_chat_template + "
                  "generate (vocabulary %d, %s)" % (arch, " ".join(map(str, layout)), same, len(CONVS), V,
                                                    [len(w[0]) for w in wants]))
            got = [None] * (2 * len(CONVS))

            def one(k):
                conv = CONVS[k % len(CONVS)]
                got[k] = c.chat.completions.create(model=NAME, messages=conv, max_tokens=NEW,
                                                   temperature=0).choices[0].token_ids
            ths = [threading.Thread(target=one, args=(k,)) for k in range(len(got))]
            for t in ths:
                t.start()
            for t in ths:
                t.join()
            batched = sum(got[k] == wants[k % len(CONVS)][1] for k in range(len(got)))
            print("%s: %d/%d concurrent requests give the same ids" % (arch, batched, len(got)))
            lt.check(batched == len(got), "concurrent: %s" % got)
        finally:
            rc = srv.stop(tail=1200)
            lt.check(rc == 0, "the server exited %s after SIGTERM" % rc)
    lt.done()


main()
