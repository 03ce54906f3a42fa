#!/usr/bin/python3
"""test_chat_template.py - loom's chat-template engine (src/infer/chat_*.c)
against transformers' apply_chat_template (Jinja2 with trim_blocks and
lstrip_blocks) on the templates of chat_templates.py - ChatML, GPT-2's
default, Qwen, Zephyr, Llama 2, Mixtral, Llama 3 and one that exercises more
of Jinja - times 5 conversations times add_generation_prompt true/false: the
same text, or both refusing (a raise_exception: loom's message must be the
template's). Templates loom cannot compile must fail with a message naming
the line and the construct.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, HERE)
import loomtest as lt  # noqa: E402
import chat_templates as ct  # noqa: E402
import tokcorpus  # noqa: E402


def main():
    tool = sys.argv[1]
    hf = tokcorpus.hf_fast()
    cases, want = [], []
    for name, tpl in ct.TEMPLATES.items():
        for conv in ct.CONVERSATIONS:
            for agp in (True, False):
                cases.append({"template": tpl, "messages": conv, "add_generation_prompt": agp,
                              "bos_token": hf.bos_token, "eos_token": hf.eos_token, "name": name})
                try:
                    want.append(("text", hf.apply_chat_template(conv, chat_template=tpl, tokenize=False,
                                                                add_generation_prompt=agp)))
                except Exception as e:  # noqa: BLE001 - a template's raise_exception
                    want.append(("error", str(e)))
    bad = [("{% macro m() %}x{% endmacro %}", "unsupported tag 'macro'"), ("{{ x | frobnicate }}", "frobnicate"),
           ("{% if x %}never closed", "missing '{% endif %}'"), ("ok\n{{ 'unterminated }}", "line 2"),
           ("{{ undefined_thing.attr }}", "undefined"), ("{% for x in y %}{% set z %}", "block assignments")]
    for tpl, _ in bad:
        cases.append({"template": tpl, "messages": ct.CONVERSATIONS[0], "add_generation_prompt": True})
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = os.path.join(tmp, "in.json"), os.path.join(tmp, "out.json")
        with open(inp, "w") as f:
            json.dump(cases, f)
        p = subprocess.run([tool, inp, out], capture_output=True, text=True)
        lt.check(p.returncode == 0, "chat_tool exit %d: %s" % (p.returncode, p.stderr))
        got = json.load(open(out))
    same = errors = 0
    for case, (kind, w), g in zip(cases, want, got):
        if kind == "text":
            ok = g.get("text") == w
        else:
            ok = "error" in g and w in g["error"]
            errors += ok
        same += ok
        lt.check(ok, "template %s, %d messages, generation prompt %s: transformers %r, loom %r" % (
            case["name"], len(case["messages"]), case["add_generation_prompt"], w, g))
    print("%d templates x %d conversations x 2: %d/%d rendered as transformers %s (%d refused alike)" % (
        len(ct.TEMPLATES), len(ct.CONVERSATIONS), same, len(want), "4.40", errors))
    for (tpl, msg), g in zip(bad, got[len(want):]):
        lt.check("error" in g and msg in g["error"], "template %r: want an error naming %r, got %r" % (tpl, msg, g))
    print("%d templates loom cannot run: each refused naming what (%s)" % (
        len(bad), "; ".join(g.get("error", "?") for g in got[len(want):])))
    lt.done()


main()
