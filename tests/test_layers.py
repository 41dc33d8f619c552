"""The library's modules (its source folders) depend on each other one way
only: no function of a folder calls into a folder that calls back into it,
directly or around a longer cycle (issue: "one direction of dependency").

Usage: test_layers.py LIBSTZ_A SOURCE_ROOT
Reads the symbols each object of the static library defines and uses (nm)
and maps each object to its source folder by file name.
"""
import collections
import os
import subprocess
import sys

lib, root = sys.argv[1], sys.argv[2]
folder = {}  # object file name -> source folder
for d in sorted(os.listdir(root)):
    if os.path.isdir(os.path.join(root, d)) and d not in ("tests", "bench", "python") and not d.startswith((".", "build")):
        for f in os.listdir(os.path.join(root, d)):
            if f.endswith(".c"):
                assert f + ".o" not in folder, "two sources named %s: objects would be ambiguous" % f
                folder[f + ".o"] = d
folder["policy_builtin.c.o"] = "policy"  # generated from policies/
defined, used = {}, collections.defaultdict(set)
out = subprocess.run(["nm", "-A", lib], capture_output=True, text=True, check=True).stdout
for line in out.splitlines():
    name, _, rest = line.rpartition(":")  # "lib.a:obj.o:" then the symbol part
    obj = name.split(":")[-1]
    parts = rest.split()
    if obj not in folder:
        sys.exit("test_layers: %s: no source folder for %s" % (lib, obj))
    if len(parts) == 3 and parts[1] in "TDBRi":
        defined[parts[2]] = folder[obj]
    elif len(parts) == 2 and parts[0] == "U":
        used[folder[obj]].add(parts[1])
edges = collections.defaultdict(set)
for mod, syms in used.items():
    for s in syms:
        if s in defined and defined[s] != mod:
            edges[mod].add(defined[s])
if not edges:
    sys.exit("test_layers: no calls between modules found in %s: nothing was checked" % lib)


def cycle_from(start):
    """A path start -> ... -> start, or None."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in sorted(edges[node]):
            if nxt == start:
                return path + [start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, path + [nxt]))
    return None


for mod in sorted(edges):
    c = cycle_from(mod)
    if c:
        sys.exit("test_layers: modules call each other: %s" % " -> ".join(c))
calls = ["%s -> %s" % (m, ", ".join(sorted(edges[m]))) for m in sorted(edges) if edges[m]]
print("layers: one direction: %s" % "; ".join(calls))
