#!/usr/bin/python3
"""GPT-2 BPE tokenizer: loom's C encoder against Hugging Face `tokenizers`
(Rust, through GPT2TokenizerFast) on the same documents, one thread each.

usage: bench/bench_tokenizer.py [--tool build/tests/infer/infer_tok_tool] [--mb 10] [--repeat 3]

The corpus is tests/infer/tokcorpus.py's (edge cases, random strings, license
texts, fortunes, man pages in every installed language) cut at --mb megabytes.
Both encoders see the same list of documents; ids must agree on every document
(mismatches are counted and make the exit status 1). Throughput = UTF-8 bytes /
encode seconds, best of --repeat runs: loom's time is measured inside the tool
around loom_tokenizer_encode only (file reading and the round-trip decode
excluded); Hugging Face's is backend_tokenizer.encode(doc) per document with
RAYON_NUM_THREADS=1, python loop included (a few microseconds per document).
Both start with a cold pre-token cache on each run.
"""
import argparse
import os
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "infer"))
sys.path.insert(0, HERE)
import benchlib  # noqa: E402
import tokcorpus  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", default="build/tests/infer/infer_tok_tool")
    ap.add_argument("--mb", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    docs = tokcorpus.documents(int(a.mb * 1e6))
    n_bytes = sum(len(d.encode()) for d in docs)
    with tempfile.TemporaryDirectory() as tmp:
        rec, out = os.path.join(tmp, "docs.bin"), os.path.join(tmp, "ids.bin")
        tokcorpus.write_records(docs, rec)
        loom_s = []
        for _ in range(a.repeat):
            p = benchlib.run([a.tool, tokcorpus.GPT2_FILES, rec, out], what="tok_tool")
            loom_s.append(float(p.stdout.split("encode_s")[1]))
        ours = tokcorpus.read_id_records(out, len(docs))
    backend = tokcorpus.hf_fast().backend_tokenizer
    hf_s, want = [], None
    for _ in range(a.repeat):
        backend = tokcorpus.hf_fast().backend_tokenizer  # fresh cache
        t0 = time.perf_counter()
        ids = [backend.encode(d, add_special_tokens=False).ids for d in docs]
        hf_s.append(time.perf_counter() - t0)
        want = ids
    bad = sum(1 for x, y in zip(ours, want) if x != y)
    lm, hm = n_bytes / min(loom_s) / 1e6, n_bytes / min(hf_s) / 1e6
    print("cpu: %s" % benchlib.cpu_model())
    print("corpus: %d documents, %.2f MB, %d tokens" % (len(docs), n_bytes / 1e6, sum(len(x) for x in ours)))
    print("mismatches vs GPT2TokenizerFast: %d" % bad)
    print("loom        %8.2f MB/s  (best of %d: %.3f s)" % (lm, a.repeat, min(loom_s)))
    print("tokenizers  %8.2f MB/s  (best of %d: %.3f s)" % (hm, a.repeat, min(hf_s)))
    print("ratio loom/tokenizers: %.2fx" % (lm / hm))
    return 1 if bad else 0


sys.exit(main())
