#!/usr/bin/python3
"""test_tokenizer_families.py - loom's tokenizer on Hugging Face tokenizer.json
files of the Llama 3, Qwen2 and Llama 2 / Mistral (byte-fallback BPE) kinds,
against the Rust `tokenizers` library reading the same file.

No hub is reachable, so the files are trained here with `tokenizers`: a
byte-level BPE (vocabulary ~3000) with each family's pre-tokenizer, exactly as
the published files spell it (Sequence [Split(Regex, Isolated), ByteLevel
(use_regex false)], ByteLevel decoder) and its special tokens:
  llama3  Llama 3's pattern (\\p{N}{1,3}), model.ignore_merges true, 256 special
          tokens <|begin_of_text|> .. <|reserved_special_token_K|>, a
          TemplateProcessing post-processor adding <|begin_of_text|>, and a
          non-special added token;
  qwen2   Qwen2's pattern (\\p{N}), NFC normalizer, <|endoftext|>,
          <|im_start|>, <|im_end|>.
Both are also read with their merges as [a, b] pairs (same ids).
Over ~1 MB of varied text (tests/infer/tokcorpus.py: multilingual text,
emoji, whitespace runs, random strings over the pattern's classes) with special
tokens spliced into some documents, every document must encode to the ids
`tokenizers` gives (add_special_tokens=False) and decode back to its bytes, and
tokenizers' decode of loom's ids must give the text.

Then: `loom data --tokenizer DIR` shards equal <|begin_of_text|> + the ids for
the Llama 3 kind; and files loom does not implement (a Metaspace split on a
byte-level vocabulary, byte_fallback with a byte-level pre-tokenizer, an
unknown split regex, a WordPiece model, a ByteFallback decoder on byte-level
BPE, text not in NFC for the NFC normalizer) are refused with one message
naming the component; the NFC check is compared with
unicodedata.is_normalized; and `loom generate --model DIR --prompt` on a tiny
Llama saved beside the Llama 3 kind's tokenizer.json continues the prompt
(BOS first) as transformers does on tokenizers' ids. Last, two byte-fallback
BPEs (Llama 2's Prepend normalizer; the newer Metaspace pre-tokenizer) must
give tokenizers' ids with and without <s> </s> <unk> spliced in, and decode as
tokenizers decodes.

usage: test_tokenizer_families.py TOK_TOOL [MEGABYTES]   (env LOOM: build/loom)
"""
import json
import os
import random
import subprocess
import sys
import tempfile
import unicodedata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokcorpus  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
         r"\s*[\r\n]+|\s+(?!\S)|\s+")

LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eot_id|>"] + ["<|reserved_special_token_%d|>" % k for k in range(251)]
QWEN2_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def train(kind, texts, path):
    tok = Tokenizer(models.BPE())
    if kind == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3 if kind == "llama3" else QWEN2), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=3000, min_frequency=2, show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=tr)
    # added after training, as the published files: ids after the vocabulary
    special = LLAMA3_SPECIAL if kind == "llama3" else QWEN2_SPECIAL
    tok.add_special_tokens(special)
    if kind == "llama3":
        tok.add_tokens(["<tool>"])  # a non-special added token
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
            special_tokens=[("<|begin_of_text|>", bos)])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.save(path)
    j = json.load(open(path, encoding="utf-8"))
    assert j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == (LLAMA3 if kind == "llama3" else QWEN2)
    if kind == "llama3":
        j["model"]["ignore_merges"] = True
        # a word in the vocabulary that its merges do not build: ignore_merges must pick it whole
        j["model"]["vocab"]["zqzq"] = max(j["model"]["vocab"].values()) + 1
        for a in j["added_tokens"]:
            a["id"] += 1
        bos = j["post_processor"]["special_tokens"]["<|begin_of_text|>"]
        bos["ids"] = [bos["ids"][0] + 1]
    json.dump(j, open(path, "w", encoding="utf-8"), ensure_ascii=False)
    return Tokenizer.from_file(path)


def splice_specials(docs, special, seed):
    rng = random.Random(seed)
    out = list(docs)
    for i in rng.sample(range(len(out)), len(out) // 4):
        d = out[i]
        for _ in range(rng.randint(1, 4)):
            at = rng.randint(0, len(d))
            d = d[:at] + rng.choice(special) + d[at:]
        out[i] = d
    out += ["".join(special[:8]), special[0] + " hi" + special[1] + "\n", "<|im_start|>user\nhi<|im_end|>\n",
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|>", "<tool> a<tool>b",
            "<|im_start", "<|reserved_special_token_250|>x", "<|reserved_special_token_2|>zqzq zqzq"]
    return out


def run_tool(tool, path, rec, out):
    r = subprocess.run([tool, path, rec, out], capture_output=True, text=True)
    sys.stderr.write(r.stderr)
    assert r.returncode == 0, "tok_tool failed (%d) on %s" % (r.returncode, path)
    return r.stdout.strip()


def check_family(kind, tool, docs, tmp):
    d = os.path.join(tmp, kind)
    os.mkdir(d)
    path = os.path.join(d, "tokenizer.json")
    hf = train(kind, docs[len(tokcorpus.EDGE) + 2000::3], path)
    special = LLAMA3_SPECIAL[:8] + LLAMA3_SPECIAL[-2:] + ["<tool>"] if kind == "llama3" else QWEN2_SPECIAL
    docs = splice_specials(docs, special, 7)
    if kind == "qwen2":  # loom checks NFC rather than normalizing: give it NFC text
        docs = [unicodedata.normalize("NFC", x) for x in docs]
    rec, out = os.path.join(tmp, kind + ".docs"), os.path.join(tmp, kind + ".ids")
    tokcorpus.write_records(docs, rec)
    print("%s: %s" % (kind, run_tool(tool, d, rec, out)))
    ours = tokcorpus.read_id_records(out, len(docs))
    want = [e.ids for e in hf.encode_batch(docs, add_special_tokens=False)]
    bad = [i for i in range(len(docs)) if want[i] != ours[i]]
    for i in bad[:5]:
        print("MISMATCH doc %d %r\n  hf   %s\n  loom %s" % (i, docs[i][:120], want[i][:40], ours[i][:40]))
    n_bytes = sum(len(x.encode()) for x in docs)
    n_spec = sum(1 for ids in ours for t in ids if t >= hf.get_vocab_size(with_added_tokens=False))
    print("%s: %d documents, %d bytes, %d tokens (%d added tokens): %d mismatches vs tokenizers %s" %
          (kind, len(docs), n_bytes, sum(map(len, ours)), n_spec, len(bad), __import__("tokenizers").__version__))
    assert not bad
    assert n_spec > 100, "too few special tokens exercised"
    dec_bad = [i for i in range(len(docs)) if hf.decode(ours[i], skip_special_tokens=False) != docs[i]]
    print("%s: tokenizers.decode(loom ids) != text: %d documents" % (kind, len(dec_bad)))
    assert not dec_bad
    # the same file named directly (not its directory) gives the same ids, and
    # so does its merges list written as [a, b] pairs (tokenizers >= 0.20's
    # format, which this 0.19 cannot read)
    run_tool(tool, path, rec, out + "2")
    assert tokcorpus.read_id_records(out + "2", len(docs)) == ours
    j = json.load(open(path, encoding="utf-8"))
    j["model"]["merges"] = [m.split(" ", 1) for m in j["model"]["merges"]]
    pairs = os.path.join(tmp, kind + "-pairs.json")
    json.dump(j, open(pairs, "w", encoding="utf-8"), ensure_ascii=False)
    run_tool(tool, pairs, rec, out + "3")
    assert tokcorpus.read_id_records(out + "3", len(docs)) == ours
    return hf, d


def loom_data(tok_dir, inputs, out):
    cmd = [os.environ.get("LOOM", "build/loom"), "data", "--tokenizer", tok_dir, "--out", out, "--val", ""]
    for f in inputs:
        cmd += ["--input", f]
    return subprocess.run(cmd, capture_output=True, text=True)


def read_shard(path):
    import numpy as np
    raw = open(path, "rb").read()
    head = np.frombuffer(raw[:1024], dtype="<i4")
    return [int(t) for t in np.frombuffer(raw[1024:], dtype="<u2" if head[1] == 1 else "<u4")]


def check_data(hf, tok_dir, tmp):
    files = ["/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0"]
    out = os.path.join(tmp, "l3.bin")
    r = loom_data(tok_dir, files, out)
    assert r.returncode == 0, r.stderr
    bos = hf.token_to_id("<|begin_of_text|>")
    want = []
    for f in files:
        want += hf.encode(open(f, encoding="utf-8").read(), add_special_tokens=True).ids
    got = read_shard(out)
    assert want[0] == bos and got == want, "loom data shards differ from tokenizers' ids with its BOS"
    print("loom data --tokenizer (llama3 kind): %d tokens, each document <|begin_of_text|> + its ids, identical"
          % len(got))


def train_sp(kind, texts, path):
    """A byte-fallback BPE as Llama 2's / Mistral's tokenizer.json: <unk> <s> </s>, then <0x00>..<0xFF>, then
    the merged pieces, spaces as U+2581. kind "prepend": Llama 2's Prepend + Replace normalizer, no
    pre-tokenizer; kind "metaspace": the Metaspace pre-tokenizer (prepend_scheme first, no split) of newer
    files; both with the Replace/ByteFallback/Fuse/Strip decoder."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tr = trainers.BpeTrainer(vocab_size=3000, min_frequency=2, show_progress=False, limit_alphabet=150,
                             special_tokens=["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)])
    tok.train_from_iterator(texts, trainer=tr)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", bos)])
    if kind == "prepend":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.save(path)
    j = json.load(open(path, encoding="utf-8"))
    j["added_tokens"] = [a for a in j["added_tokens"] if not a["content"].startswith("<0x")]  # vocabulary only
    if kind == "prepend":
        j["pre_tokenizer"] = None
    else:
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                              "split": False}
    json.dump(j, open(path, "w", encoding="utf-8"), ensure_ascii=False)
    return Tokenizer.from_file(path)


def check_sp(kind, tool, docs, tmp):
    d = os.path.join(tmp, "sp-" + kind)
    os.mkdir(d)
    path = os.path.join(d, "tokenizer.json")
    hf = train_sp(kind, docs[len(tokcorpus.EDGE) + 2000::3], path)
    docs = [x for x in docs if "\u2581" not in x]  # U+2581 itself decodes to a space
    special = splice_specials(docs, ["<s>", "</s>", "<unk>"], 11)
    rec, out = os.path.join(tmp, kind + ".docs"), os.path.join(tmp, kind + ".ids")
    res = {}
    # Metaspace's decoder drops a text's own leading space: no round trip there
    plain_flags = [] if kind == "prepend" else ["--no-roundtrip"]
    for name, ds, flags in (("plain", docs, plain_flags), ("special", special, ["--no-roundtrip"])):
        tokcorpus.write_records(ds, rec)
        r = subprocess.run([tool, d, rec, out] + flags, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        ours = tokcorpus.read_id_records(out, len(ds))
        want = [e.ids for e in hf.encode_batch(ds, add_special_tokens=False)]
        bad = [i for i in range(len(ds)) if want[i] != ours[i]]
        for i in bad[:3]:
            print("MISMATCH doc %d %r\n  hf   %s\n  loom %s" % (i, ds[i][:80], want[i][:30], ours[i][:30]))
        fallback = sum(1 for ids in ours for t in ids if 3 <= t < 259)
        print("byte-fallback %s (%s): %d documents, %d tokens (%d byte tokens): %d mismatches vs tokenizers" %
              (kind, name, len(ds), sum(map(len, ours)), fallback, len(bad)))
        assert not bad and fallback > 1000
        res[name] = ours
        if flags:  # loom's decode of its ids against tokenizers' decode of the same ids
            raw = open(out + ".dec", "rb").read()
            o, decoded = 0, []
            while o < len(raw):
                k = int.from_bytes(raw[o:o + 4], "little")
                decoded.append(raw[o + 4:o + 4 + k].decode("utf-8"))
                o += 4 + k
            dbad = [i for i in range(len(ds)) if decoded[i] != hf.decode(ours[i], skip_special_tokens=False)]
            for i in dbad[:3]:
                print("DECODE MISMATCH %r: loom %r hf %r" % (ds[i][:60], decoded[i][:60],
                                                              hf.decode(ours[i], skip_special_tokens=False)[:60]))
            print("  decode: %d documents differ from tokenizers' decode" % len(dbad))
            assert len(decoded) == len(ds) and not dbad
    # loom data puts <s> (the post-processor's BOS) before each document, as tokenizers' encode
    r = loom_data(d, ["/usr/share/common-licenses/GPL-3"], os.path.join(tmp, kind + ".bin"))
    assert r.returncode == 0, r.stderr
    got = read_shard(os.path.join(tmp, kind + ".bin"))
    want = hf.encode(open("/usr/share/common-licenses/GPL-3", encoding="utf-8").read()).ids
    assert got == want and got[0] == hf.token_to_id("<s>"), "loom data differs from tokenizers (with <s>)"
    print("  loom data: %d tokens, <s> + tokenizers' ids" % len(got))


def check_refused(qwen_dir, llama_dir, tmp):
    src = json.load(open(os.path.join(llama_dir, "tokenizer.json"), encoding="utf-8"))
    metaspace = json.loads(json.dumps(src))
    metaspace["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                                  "split": False}  # a Metaspace split on a byte-level vocabulary
    fallback = json.loads(json.dumps(src))
    fallback["model"]["byte_fallback"] = True
    regex = json.loads(json.dumps(src))
    regex["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\p{L}+|\s+"
    wordpiece = json.loads(json.dumps(src))
    wordpiece["model"]["type"] = "WordPiece"
    decoder = json.loads(json.dumps(src))
    decoder["decoder"] = {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]}
    cases = {
        "metaspace": (metaspace, "model.byte_fallback false with this normalizer / pre_tokenizer"),
        "byte-fallback": (fallback, "model.byte_fallback true with this normalizer / pre_tokenizer"),
        "regex": (regex, "is not one loom implements"),
        "wordpiece": (wordpiece, "model is WordPiece, not a BPE model"),
        "decoder": (decoder, "decoder Sequence is not supported"),
    }
    inp = os.path.join(tmp, "in.txt")
    open(inp, "w").write("hello")
    for name, (j, msg) in cases.items():
        d = os.path.join(tmp, "bad-" + name)
        os.mkdir(d)
        json.dump(j, open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8"))
        out = os.path.join(tmp, "bad.bin")
        r = loom_data(d, [inp], out)
        assert r.returncode == 65 and msg in r.stderr and r.stderr.count("\n") <= 2, \
            "%s: exit %d, %r" % (name, r.returncode, r.stderr)
        assert not os.path.exists(out), "%s: a shard was written" % name
    # NFC normalizer: text not in NFC is refused, naming the byte and the normalizer
    open(inp, "w").write("cafe\u0301 ok")
    r = loom_data(qwen_dir, [inp], os.path.join(tmp, "bad.bin"))
    assert r.returncode == 65 and "not in NFC" in r.stderr, (r.returncode, r.stderr)
    print("unsupported tokenizer files: %d cases and non-NFC text refused with one message each" % len(cases))


def check_nfc(tool, qwen_dir, tmp):
    """loom's NFC check against unicodedata.is_normalized on strings built to
    hit the composition, reordering and never-NFC cases."""
    pool = (list("aeoAOn ") + ["\u0300", "\u0301", "\u0323", "\u0327", "\u0308", "\u0334", "\u05b0", "\u0591",
            "\u09c7", "\u09be", "\u09d7", "\u0b47", "\u0b3e", "\u1100", "\u1161", "\u11a8", "\uac00", "\uac01",
            "\u00e9", "\u1ec7", "\u0340", "\u212b", "\u0958", "\u2126", "\u0f73", "\U0001d15e", "\u3099", "\u304b"])
    rng = random.Random(3)
    texts = ["".join(rng.choice(pool) for _ in range(rng.randint(1, 5))) for _ in range(150)]
    rec, out = os.path.join(tmp, "nfc.docs"), os.path.join(tmp, "nfc.ids")
    accepted_bad, refused_ok = [], []
    for t in texts:
        tokcorpus.write_records([t], rec)
        r = subprocess.run([tool, qwen_dir, rec, out], capture_output=True, text=True)
        refused = r.returncode != 0
        assert not refused or "not in NFC" in r.stderr, r.stderr
        nfc = unicodedata.is_normalized("NFC", t)
        if not refused and not nfc:
            accepted_bad.append(t)
        if refused and nfc:
            refused_ok.append(t)
    n_bad = sum(not unicodedata.is_normalized("NFC", t) for t in texts)
    print("NFC check: %d strings (%d not in NFC): %d wrongly accepted, %d in NFC refused" %
          (len(texts), n_bad, len(accepted_bad), len(refused_ok)))
    assert not accepted_bad, [ascii(t) for t in accepted_bad[:5]]
    assert 30 < n_bad < 120

    # the one documented over-refusal: a precomposed letter whose decomposition ends in a mark of a higher
    # class than the mark after it (reordered, and maybe recomposed to the same text)
    def reorders(t):
        return any(len(unicodedata.normalize("NFD", a)) > 1 and
                   unicodedata.combining(unicodedata.normalize("NFD", a)[-1]) > unicodedata.combining(b) > 0
                   for a, b in zip(t, t[1:]))
    assert all(reorders(t) for t in refused_ok), [ascii(t) for t in refused_ok if not reorders(t)][:5]


def check_generate(hf, tok_dir, tmp):
    """`loom generate --model DIR --prompt TEXT`: a tiny random Llama saved by
    transformers beside the Llama 3 kind's tokenizer.json; the prompt's ids
    (BOS first) and the greedy continuation must be transformers' on
    tokenizers' ids."""
    import shutil
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
    import hf_models
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    d = hf_models.make(os.path.join(tmp, "llama-dir"), "llama", vocab_size=hf.get_vocab_size(),
                       num_key_value_heads=2)
    shutil.copy(os.path.join(tok_dir, "tokenizer.json"), d)
    prompt = "Hello, it's 2024<|eot_id|> caf\u00e9 \U0001f600!\n"
    r = subprocess.run([os.environ.get("LOOM", "build/loom"), "generate", "--model", d, "--prompt", prompt,
                        "--max-tokens", "16", "--format", "jsonl", "--stop", "none"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    ids = hf.encode(prompt).ids  # add_special_tokens: <|begin_of_text|> first
    assert ids[0] == hf.token_to_id("<|begin_of_text|>") and hf.token_to_id("<|eot_id|>") in ids
    model = hf_models.load(d)
    with torch.no_grad():
        t = torch.tensor([ids])
        out = model.generate(t, attention_mask=torch.ones_like(t), max_new_tokens=16, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
    want = [int(x) for x in out[0, len(ids):]]
    print("generate --model DIR --prompt: loom %s, transformers %s (prompt %d ids)" % (got, want, len(ids)))
    new = got.get("ids", got.get("tokens"))
    assert new == want, (got, want)
    assert got.get("text") == hf.decode(want, skip_special_tokens=False), got


def main():
    tool = sys.argv[1]
    mb = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    docs = tokcorpus.documents(int(mb * 1e6))
    with tempfile.TemporaryDirectory() as tmp:
        hf_l3, l3_dir = check_family("llama3", tool, docs, tmp)
        _, qw_dir = check_family("qwen2", tool, docs, tmp)
        check_data(hf_l3, l3_dir, tmp)
        check_refused(qw_dir, l3_dir, tmp)
        check_nfc(tool, qw_dir, tmp)
        check_generate(hf_l3, l3_dir, tmp)
        check_sp("prepend", tool, docs, tmp)
        check_sp("metaspace", tool, docs, tmp)
    print("PASS")


main()
