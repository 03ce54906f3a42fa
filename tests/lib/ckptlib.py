"""Checkpoint checks computed here, independently of loom (hashlib, json):
what docs/checkpoints.md says a complete checkpoint is, and which one
--resume DIR must take."""
import hashlib
import json
import os
import re

HASH_KEY = '"manifest_sha256"'


def manifest_hash_ok(text):
    """The manifest's own SHA-256: of its bytes with the 64 digits of its one
    "manifest_sha256" member read as zeros."""
    if text.count(HASH_KEY) != 1:
        return False
    m = re.compile(r'"manifest_sha256"\s*:\s*"([0-9a-f]{64})"').search(text)
    if not m:
        return False
    zeroed = text[:m.start(1)] + "0" * 64 + text[m.end(1):]
    return hashlib.sha256(zeroed.encode()).hexdigest() == m.group(1)


def sign(text):
    """text with its "manifest_sha256" set to the hash manifest_hash_ok
    expects: what a tool that edits a manifest and re-signs it writes."""
    m = re.compile(r'"manifest_sha256"\s*:\s*"([0-9a-f]{64})"').search(text)
    zeroed = text[:m.start(1)] + "0" * 64 + text[m.end(1):]
    return text[:m.start(1)] + hashlib.sha256(zeroed.encode()).hexdigest() + text[m.end(1):]


def manifest(ck):
    """The manifest of checkpoint directory ck if it is complete - its own
    hash, then every file's SHA-256 - else None."""
    try:
        with open(os.path.join(ck, "manifest.json"), "rb") as f:
            raw = f.read()
        text = raw.decode()
        if not manifest_hash_ok(text):
            return None
        man = json.loads(text)
        for fe in man["files"]:
            with open(os.path.join(ck, fe["file"]), "rb") as f:
                if hashlib.sha256(f.read()).hexdigest() != fe["sha256"]:
                    return None
        return man if man["format"] == "loom-checkpoint" else None
    except (OSError, ValueError, KeyError, UnicodeDecodeError):
        return None


def flip_byte(path, from_end, mask=0x40):
    """Damage a file: flip bits of its byte `from_end` bytes before the end."""
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - from_end)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ mask]))


def verifies(ck):
    return manifest(ck) is not None


def published(d):
    """The steps of d's step_N directories, ascending."""
    if not os.path.isdir(d):
        return []
    return sorted(int(m.group(1)) for m in (re.fullmatch(r"step_(\d+)", n) for n in os.listdir(d)) if m)


def newest_verified(d):
    """The path --resume d must take: the newest step_N that verifies."""
    for s in reversed(published(d)):
        if verifies(os.path.join(d, "step_%d" % s)):
            return os.path.join(d, "step_%d" % s)
    return None


def latest(d):
    try:
        with open(os.path.join(d, "latest")) as f:
            return f.read().strip()
    except OSError:
        return None
