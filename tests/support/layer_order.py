#!/usr/bin/env python3
"""tests/support/layer_order.py — the layers' walls, kept by a test: every #include of include/flexpar/**
and lib/** must point down the layer order that doc/architecture.md writes once, in its ```layers block.

The block has one line per layer: the layer's name, then the layers it may include directly, then an
optional `# reason`. A layer may include what those layers may include, and itself; nothing else. A
file's layer is its folder: include/flexpar/LAYER/... and lib/LAYER/...; a header directly under
include/flexpar/ (collective.hpp, relax.hpp, timeline.hpp) belongs to the layer of its name, and the
generated flexpar/version.hpp to core. A header under lib/ is private to its layer: another layer never
includes it, even by a relative path (../search/executor.hpp).

Checks, each failure naming file:line, both layers and the rule broken:
  - the table: every layer named once, every layer a line names has its own line, no cycle;
  - every folder of include/flexpar/ and lib/ is a layer of the table;
  - every include runs down the order (or stays in its layer) and reaches no other layer's lib/ header;
  - the layers' include graph has no cycle (implied by the rule above; said separately when it happens).

  tests/support/layer_order.py --root .            # the check (exit status 1 on a crossing)
  tests/support/layer_order.py --root . --graph    # also print the layer graph the includes draw
  tests/support/layer_order.py --root . --planted  # proves the check can fail (see planted() below)
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from planted_copy import prove_it_fails  # noqa: E402

DOC = "doc/architecture.md"
SOURCE = re.compile(r"\.(hpp|cpp|h|cu|cuh|in)$")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def read_table(root):
    """{layer: [layers it may include directly]} and the line of each, from DOC's ```layers block."""
    path = os.path.join(root, DOC)
    with open(path) as f:
        lines = f.read().split("\n")
    table, where, errors = {}, {}, []
    inside = found = False
    for n, line in enumerate(lines, 1):
        if not inside and line.strip() == "```layers":
            inside = found = True
            continue
        if inside and line.strip().startswith("```"):
            inside = False
            continue
        if not inside:
            continue
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        name, below = words[0], words[1:]
        if name in table:
            errors.append(f"{DOC}:{n}: layer {name} has two lines (first at line {where[name]})")
        table[name], where[name] = below, n
    if not found:
        errors.append(f"{DOC}: no ```layers block (the layer order this check reads)")
    for name, below in table.items():
        for b in below:
            if b not in table:
                errors.append(f"{DOC}:{where[name]}: layer {name} may include {b}, which has no line of its own")
    return table, where, errors


def closure(table):
    """{layer: every layer it may include}, through the table's lines."""
    out = {}
    for name in table:
        seen, frontier = set(), list(table[name])
        while frontier:
            b = frontier.pop()
            if b in seen or b not in table:
                continue
            seen.add(b)
            frontier.extend(table[b])
        out[name] = seen
    return out


def find_cycle(graph):
    """One cycle of {node: iterable of nodes} as a list [a, b, ..., a], or None."""
    state, stack = {}, []

    def visit(v):
        state[v] = 1
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state:
                c = visit(w)
                if c:
                    return c
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state:
            c = visit(v)
            if c:
                return c
    return None


def layer_of(rel):
    """The layer of a path relative to the root (include/flexpar/... or lib/...), or None."""
    parts = rel.split("/")
    if parts[0] == "include" and len(parts) >= 3 and parts[1] == "flexpar":
        if len(parts) == 3:
            stem = parts[2].split(".")[0]
            return "core" if stem == "version" else stem
        return parts[2]
    if parts[0] == "lib" and len(parts) >= 3:
        return parts[1]
    return None


def includes(root):
    """(file, line, target path relative to the root) for each flexpar include of include/flexpar and lib."""
    for top in ("include/flexpar", "lib"):
        for dirpath, dirnames, files in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for name in sorted(files):
                if not SOURCE.search(name):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                with open(path, errors="replace") as f:
                    for n, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = m.group(2)
                        if target.startswith("flexpar/"):
                            yield rel, n, "include/" + target
                        elif m.group(1) == '"':
                            yield rel, n, os.path.normpath(os.path.join(os.path.dirname(rel), target))


def check(root, graph_out=None):
    """The errors of the tree at `root` (empty when its includes keep the order)."""
    table, where, errors = read_table(root)
    cycle = find_cycle(table)
    if cycle:
        errors.append(f"{DOC}:{where[cycle[0]]}: the layer table has a cycle: {' -> '.join(cycle)}")
    if errors:
        return errors, {}
    below = closure(table)
    for top in ("include/flexpar", "lib"):
        for entry in sorted(os.listdir(os.path.join(root, top))):
            if os.path.isdir(os.path.join(root, top, entry)) and entry not in table:
                errors.append(f"{top}/{entry}/: folder {entry} is no layer of {DOC}'s table (add its line)")
    edges = {}
    for rel, n, target in includes(root):
        a, b = layer_of(rel), layer_of(target)
        if a is None or b is None or a == b:
            continue
        edges.setdefault(a, {}).setdefault(b, []).append(f"{rel}:{n}")
        if target.startswith("lib/"):
            errors.append(f"{rel}:{n}: {a} -> {b}: includes {target}, a header private to the {b} layer "
                          f"(make what {a} needs a public header of {b}, include/flexpar/{b}/)")
        elif b not in below.get(a, ()):
            if a in below.get(b, ()):
                rule = f"runs back up the layer order ({b} is above {a} in {DOC}'s table)"
            else:
                rule = f"crosses the layer order ({b} is not below {a} in {DOC}'s table)"
            errors.append(f"{rel}:{n}: {a} -> {b}: includes {target}: {rule}")
    cycle = find_cycle({a: set(bs) for a, bs in edges.items()})
    if cycle:
        first = edges[cycle[0]][cycle[1]][0]
        errors.append(f"{first}: the layers' includes form a cycle: {' -> '.join(cycle)}")
    if graph_out is not None:
        for a in sorted(edges):
            for b in sorted(edges[a]):
                graph_out.append(f"  {a} -> {b} ({len(edges[a][b])}, e.g. {edges[a][b][0]})")
    return errors, edges


def planted(root):
    """Copies include/, lib/ and the doc into a temporary tree, checks that the copy passes, plants one
    upward include (a collective header including an engine header) and checks that the check fails
    naming that file and both layers."""
    victim = "include/flexpar/collective/cost.hpp"

    def plant(lines):
        last = max(i for i, l in enumerate(lines) if INCLUDE.match(l))
        lines.insert(last + 1, "#include <flexpar/engine/engine.hpp>")
        return lines, last + 2

    return prove_it_fails(
        __file__, root, ("include", "lib"), (DOC,), victim, plant,
        lambda line: f"{victim}:{line}: collective -> engine: includes include/flexpar/engine/engine.hpp: runs back up",
        "planted include")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    ap.add_argument("--graph", action="store_true", help="print the layer graph the includes draw")
    ap.add_argument("--planted", action="store_true", help="prove on a copy with a planted include that the check fails")
    args = ap.parse_args()
    if args.planted:
        return planted(args.root)
    graph = [] if args.graph else None
    errors, edges = check(args.root, graph)
    if graph:
        print("layer graph (includer -> included: includes, e.g. the first):")
        print("\n".join(graph))
    if errors:
        print("\n".join(errors))
        print(f"layer order: {len(errors)} crossing(s) of the layer order in {DOC}")
        return 1
    n = sum(len(v) for bs in edges.values() for v in bs.values())
    pairs = sum(len(bs) for bs in edges.values())
    print(f"layer order: {n} includes across {pairs} layer pairs, all down the order of {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
