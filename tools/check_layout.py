#!/usr/bin/env python3
"""tools/check_layout.py - the house rules of docs/design.md, checked from a build.

    tools/check_layout.py [BUILD_DIR]        (default: build; run after a build)

It reads two graphs between the project's source files, neither guessed from text:

- calls: file A calls file B when A's object file needs a symbol that B's object file
  defines (`nm` on the objects named in BUILD_DIR/compile_commands.json). Static
  functions and macros are inside one file and cannot make a circle.
- includes: the `#include "..."` lines of every source and header, resolved to the
  project's own headers.

and fails (exit 1, one line per finding, the files named) on:

1. a circle of calls between files: the files of a strongly connected component of
   more than one file, with one cycle through them spelled out;
2. a circle of includes between headers;
3. a file including another module's `*_int.h` (a module is a top-level folder; its
   `*_int.h` is for its own files only).

Tests and benches are read as callers (rule 3 applies to benches, not tests: a test may
reach inside the module it tests); they are left out of rule 1, since a test calls many
modules and nothing calls it. Exit 0 prints a one-line summary.
"""
import json
import os
import re
import shlex
import subprocess
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def rel(path):
    return os.path.relpath(path, ROOT)


def module_of(path):
    return path.split("/", 1)[0]


def objects(build):
    """(source, object) pairs of the project's C and CUDA files in the build."""
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = json.load(f)
    out = []
    for e in entries:
        src = rel(os.path.normpath(os.path.join(e["directory"], e["file"])))
        args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
        obj = args[args.index("-o") + 1] if "-o" in args else None
        if obj is None or src.startswith(".."):
            continue
        out.append((src, os.path.normpath(os.path.join(e["directory"], obj))))
    return out


def symbols(obj):
    """(defined, undefined) external symbol names of an object file."""
    res = subprocess.run(["nm", "-P", obj], capture_output=True, text=True, check=True)
    defined, needed = set(), set()
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            needed.add(name)
        elif kind in "TDBRVWGSC":  # upper case: external (lower case is file-local)
            defined.add(name)
    return defined, needed


def sccs(nodes, edges):
    """Tarjan's strongly connected components (iterative)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def a_cycle(comp, edges):
    """One cycle through the component's first file, as a list of files."""
    members = set(comp)
    start = comp[0]
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(edges.get(v, ())):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w in members and w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
    problems = []

    # Calls between files.
    pairs = objects(build)
    defs, needs = {}, {}
    for src, obj in pairs:
        if os.path.exists(obj):
            defs[src], needs[src] = symbols(obj)
    owner = defaultdict(set)
    for src, names in defs.items():
        for n in names:
            owner[n].add(src)
    calls = defaultdict(set)
    for src, names in needs.items():
        if src.startswith(("tests/", "bench/")):
            continue
        for n in names:
            for o in owner.get(n, ()):
                if o != src and not o.startswith(("tests/", "bench/")):
                    calls[src].add(o)
    for comp in sccs(set(calls) | {o for s in calls.values() for o in s}, calls):
        cyc = a_cycle(comp, calls)
        more = f" (a circle of {len(comp)} files: {', '.join(comp)})" if len(comp) > len(cyc) - 1 \
            else ""
        problems.append("calls in a circle: " + " -> ".join(cyc) + more)

    # Includes.
    files = []
    for d, subdirs, names in os.walk(ROOT):
        subdirs[:] = [s for s in subdirs if not s.startswith((".", "build"))]
        for n in names:
            if n.endswith((".c", ".h", ".cu", ".cuh")):
                files.append(rel(os.path.join(d, n)))
    by_name = defaultdict(list)
    for f in files:
        by_name[os.path.basename(f)].append(f)
    includes = defaultdict(set)
    for f in files:
        with open(os.path.join(ROOT, f), errors="replace") as fh:
            text = fh.read()
        for name in INCLUDE_RE.findall(text):
            here = os.path.normpath(os.path.join(os.path.dirname(f), name))
            target = here if here in files else None
            if target is None and len(by_name.get(os.path.basename(name), [])) >= 1:
                cands = by_name[os.path.basename(name)]
                same = [c for c in cands if module_of(c) == module_of(f)]
                target = (same or cands)[0]
            if target is None:
                continue
            includes[f].add(target)
            if (target.endswith(("_int.h", "_int.cuh")) and module_of(target) != module_of(f)
                    and not f.startswith("tests/")):
                problems.append(f"{f} includes {target}, the internal header of "
                                f"{module_of(target)}/ (use its public header, or move the "
                                f"code into {module_of(target)}/)")
    headers = {f: {t for t in ts if t.endswith((".h", ".cuh"))}
               for f, ts in includes.items() if f.endswith((".h", ".cuh"))}
    for comp in sccs(set(headers), headers):
        problems.append("headers include each other in a circle: " +
                        " -> ".join(a_cycle(comp, headers)))

    for p in problems:
        print(p)
    sys.stdout.flush()
    if problems:
        print(f"check_layout: {len(problems)} finding(s)", file=sys.stderr)
        return 1
    print(f"check_layout: {len(defs)} objects, {len(files)} sources and headers: no circle, "
          "no internal header used across modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
