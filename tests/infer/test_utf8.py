#!/usr/bin/python3
"""test_utf8.py - loom's incremental UTF-8 decoder (loom_utf8_feed / _flush)
against Python's bytes.decode("utf-8", "replace"), which is how Hugging Face's
tokenizers turn token bytes into text (Rust's from_utf8_lossy replaces the
same maximal subparts with U+FFFD).

30000 byte strings - random bytes, bytes near the boundaries of table 3-7 of
the Unicode standard (C0/C1/E0/ED/F0/F4/F5 leads, truncated and overlong
sequences, surrogates), and real multilingual/emoji text cut at random - each
fed in random pieces (one byte at a time for some): the output must equal the
lossy decoding of the whole string, whatever the pieces; and
loom_utf8_valid_len must be the length of the longest valid prefix.
"""
import os
import random
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import loomtest as lt  # noqa: E402

SPECIAL = [0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xEC, 0xED,
           0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xF8, 0xFE, 0xFF]
TEXT = ("naïve café – ¿Qué tal? 日本語のテキスト 한국어 Ελληνικά русский עִבְרִית العربية हिन्दी 🙂🎉👩‍👩‍👧‍👦 "
        "🇫🇷 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \U0010FFFF \uFFFD e\u0301").encode()


def valid_len(b):
    lo, hi = 0, len(b)
    try:
        b.decode("utf-8")
        return len(b)
    except UnicodeDecodeError as e:
        return e.start if lo <= e.start <= hi else 0


def cases(rng):
    for i in range(30000):
        kind = i % 3
        if kind == 0:
            b = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 24)))
        elif kind == 1:
            b = bytes(rng.choice(SPECIAL) for _ in range(rng.randrange(0, 16)))
        else:
            a = rng.randrange(len(TEXT))
            b = bytearray(TEXT[a:a + rng.randrange(1, 40)])
            for _ in range(rng.randrange(0, 3)):  # damage a byte or two
                if b:
                    b[rng.randrange(len(b))] = rng.choice(SPECIAL)
            b = bytes(b)
        if i % 7 == 0:
            cuts = list(range(1, len(b)))
        else:
            cuts = sorted(set(rng.randrange(0, len(b) + 1) for _ in range(rng.randrange(0, 5))))
        yield b, cuts


def main():
    tool = sys.argv[1]
    rng = random.Random(5)
    data = list(cases(rng))
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = os.path.join(tmp, "in"), os.path.join(tmp, "out")
        with open(inp, "wb") as f:
            for b, cuts in data:
                f.write(struct.pack("<I", len(b)) + b + struct.pack("<I", len(cuts)))
                f.write(struct.pack("<%dI" % len(cuts), *cuts))
        p = subprocess.run([tool, inp, out], capture_output=True, text=True)
        lt.check(p.returncode == 0, "utf8_tool: exit %d %s (an output that is not valid UTF-8)" % (p.returncode, p.stderr))
        got = open(out, "rb").read()
    off, bad, badv = 0, 0, 0
    for b, cuts in data:
        (m,) = struct.unpack_from("<I", got, off)
        text = got[off + 4:off + 4 + m]
        (v,) = struct.unpack_from("<I", got, off + 4 + m)
        off += 8 + m
        want = b.decode("utf-8", "replace").encode()
        if text != want:
            bad += 1
            if bad <= 5:
                print("mismatch: %r cut at %s: loom %r, python %r" % (b, cuts, text, want))
        if v != valid_len(b):
            badv += 1
            if badv <= 5:
                print("valid_len %r: loom %d, python %d" % (b, v, valid_len(b)))
    print("%d byte strings in random pieces: %d differ from bytes.decode('utf-8', 'replace'); "
          "%d valid-prefix lengths differ" % (len(data), bad, badv))
    lt.check(bad == 0 and badv == 0, "%d decodings and %d valid lengths differ" % (bad, badv))
    lt.done()


main()
