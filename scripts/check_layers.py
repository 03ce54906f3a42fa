#!/usr/bin/python3
"""check_layers.py - the import graph between loom's modules, and its cycles.

    scripts/check_layers.py [--graph] [--dot]

A module is a folder under src/ (src/backend/cuda is part of backend). A
public header include/loom/X.h belongs to the module that defines most of
the functions it declares (a header that declares none, only types or
static inline functions, belongs to no module and adds no edge). Each #include of a file under src/, or of a public
header, is an edge from its module to the included header's. Prints the edges (--graph) or a
Graphviz digraph (--dot), then every cycle between modules (a strongly
connected set of two or more), with one include that makes each edge of it.
Exit 0 when there is no cycle, 1 otherwise.
"""
import argparse
import collections
import os
import re
import sys

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
INC = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
DECL = re.compile(r"^[A-Za-z_][^;{}()]*?\b(loom_\w+)\s*\(", re.M)
DEF = re.compile(r"^[A-Za-z_][^;{}()=]*?\b(loom_\w+)\s*\([^;]*?\)\s*\{", re.M)


def module_of(path):
    rel = os.path.relpath(path, os.path.join(SRC, "src"))
    return rel.split(os.sep)[0]


def sources():
    for root, _, files in os.walk(os.path.join(SRC, "src")):
        for f in sorted(files):
            if f.endswith((".c", ".h", ".cu", ".cuh")):
                yield os.path.join(root, f)


def strip_comments(text):
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def header_owners(files):
    defs = collections.defaultdict(collections.Counter)  # function -> module counts
    for p in files:
        if p.endswith((".c", ".cu")):
            for name in DEF.findall(strip_comments(open(p, errors="replace").read())):
                defs[name][module_of(p)] += 1
    owners = {}
    incdir = os.path.join(SRC, "include", "loom")
    for h in sorted(os.listdir(incdir)):
        text = strip_comments(open(os.path.join(incdir, h), errors="replace").read())
        text = re.sub(r"static inline[^{]*\{.*?\n\}", "", text, flags=re.S)
        votes = collections.Counter()
        for name in DECL.findall(text):
            votes.update(defs.get(name, {}))
        owners["loom/" + h] = votes.most_common(1)[0][0] if votes else None
    return owners


def edges(files, owners):
    out = collections.defaultdict(dict)  # a -> b -> example "file: include"
    headers = [(os.path.join(SRC, "include", h), m) for h, m in owners.items() if m]
    for p, a in [(p, module_of(p)) for p in files] + headers:
        for inc in INC.findall(open(p, errors="replace").read()):
            if inc.startswith("loom/"):
                b = owners.get(inc)
                if b is None:
                    continue
            else:
                b = inc.split("/")[0] if "/" in inc else a
                if not os.path.isdir(os.path.join(SRC, "src", b)):
                    continue
            if a != b and b not in out[a]:
                out[a][b] = "%s includes %s" % (os.path.relpath(p, SRC), inc)
    return out


def cycles(graph):
    """Tarjan's strongly connected components with more than one module."""
    index, low, stack, on, comps, n = {}, {}, [], set(), [], [0]
    nodes = sorted(set(graph) | {b for a in graph for b in graph[a]})

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in nodes:
        if v not in index:
            visit(v)
    return comps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", action="store_true", help="print every edge")
    ap.add_argument("--dot", action="store_true", help="print a Graphviz digraph")
    a = ap.parse_args()
    files = list(sources())
    owners = header_owners(files)
    graph = edges(files, owners)
    if a.dot:
        print("digraph loom {")
        for x in sorted(graph):
            for y in sorted(graph[x]):
                print('  "%s" -> "%s";' % (x, y))
        print("}")
    elif a.graph:
        w = max(len(x) for x in graph)
        for x in sorted(graph):
            print("%-*s -> %s" % (w, x, ", ".join(sorted(graph[x]))))
    found = cycles(graph)
    for comp in found:
        print("cycle between modules: %s" % ", ".join(comp))
        for x in comp:
            for y in comp:
                if y in graph.get(x, {}):
                    print("  %s -> %s: %s" % (x, y, graph[x][y]))
    if not found:
        print("no cycle between the %d modules of src/" % len({module_of(p) for p in files}))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
