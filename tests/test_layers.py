"""The library's folders are the pipeline's stages, in one order: a folder
uses only folders below it, by its calls (the symbols of libstz.a) and by
its #includes (sources and headers, public ones included), so that the
include graph and the call graph both point one way (docs/ARCHITECTURE.md);
and no two files call each other, directly or around a cycle, but the
llama.cpp type registry's.

Usage: test_layers.py LIBSTZ_A SOURCE_ROOT
"""
import collections
import os
import re
import subprocess
import sys

# lowest first; a folder may use the folders before it
ORDER = ["core", "safetensors", "svd", "quant", "policy", "gguf", "pack", "model", "eval", "pipeline", "export", "tune",
         "synth", "cli"]
# each public header belongs to the folder that implements it
PUBLIC = {"stz.h": "core", "stz_safetensors.h": "safetensors", "stz_svd.h": "svd", "stz_quant.h": "quant",
          "stz_policy.h": "policy", "stz_pack.h": "pack", "stz_model.h": "model", "stz_forward.h": "model", "stz_imatrix.h": "pipeline", "stz_feedback.h": "pipeline",
          "stz_eval.h": "eval", "stz_pipeline.h": "pipeline", "stz_tune.h": "tune", "stz_gguf.h": "gguf",
          "stz_export.h": "export",
          "stz_synth.h": "synth", "stz_experimental.h": "core", "stz_files.h": "core", "stz_kernels.h": "quant", "stz_planes.h": "pack"}
RANK = {f: i for i, f in enumerate(ORDER)}

lib, root = sys.argv[1], sys.argv[2]
problems = []

# ---- every folder is a stage, with its README; every public header is known
for f in ORDER:
    readme = os.path.join(root, f, "README.md")
    if not os.path.isfile(readme) or os.path.getsize(readme) < 100:
        problems.append("%s/ has no README.md saying what it owns and what it may include" % f)
for h in sorted(os.listdir(os.path.join(root, "include"))):
    if h.endswith(".h") and h not in PUBLIC:
        problems.append("include/%s: not assigned to a folder in test_layers.py" % h)
ignored = {"include", "tests", "bench", "python", "tools", "docs", "policies"}
for d in sorted(os.listdir(root)):
    path = os.path.join(root, d)
    if os.path.isdir(path) and not d.startswith((".", "build")) and d not in ignored and d not in RANK:
        if any(x.endswith((".c", ".h")) for x in os.listdir(path)):
            problems.append("%s/: a source folder that is not a stage of ORDER" % d)


# ---- includes
def folder_of_include(src_folder, name):
    """The folder an #include "name" in src_folder resolves to, or None."""
    if "/" in name:
        top = name.split("/")[0]
        return top if top in RANK else None
    if name in PUBLIC:
        return PUBLIC[name]
    if src_folder != "include" and os.path.isfile(os.path.join(root, src_folder, name)):
        return src_folder
    return None


includes = 0
for folder in ORDER + ["include"]:
    for fn in sorted(os.listdir(os.path.join(root, folder))):
        if not fn.endswith((".c", ".h", ".in")):
            continue
        owner = PUBLIC.get(fn, folder) if folder == "include" else folder
        with open(os.path.join(root, folder, fn), encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if not m:
                    continue
                includes += 1
                name, where = m.group(1), "%s/%s:%d" % (folder, fn, lineno)
                if name.endswith(".c") or name.startswith(".."):
                    problems.append('%s: includes "%s" (a source file, or a path out of the folder)' % (where, name))
                    continue
                to = folder_of_include(folder, name)
                if to is None:
                    problems.append('%s: includes "%s", which is no stage\'s header' % (where, name))
                elif RANK[to] > RANK[owner]:
                    problems.append('%s: %s includes "%s" of %s, a later stage' % (where, owner, name, to))
                elif folder == "cli" and name not in PUBLIC and to != "cli":
                    problems.append('%s: the program includes "%s", an internal header: it is a client of include/ '
                                    'alone' % (where, name))
if not includes:
    problems.append("no #include found under %s: nothing was checked" % root)

# ---- calls: symbols each object of the static library defines and uses
folder = {}  # object file name -> source folder
for d in ORDER:
    for f in os.listdir(os.path.join(root, d)):
        if f.endswith(".c"):
            if f + ".o" in folder:
                problems.append("two sources named %s: objects would be ambiguous" % f)
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
            if RANK[defined[s]] > RANK[mod]:
                problems.append("%s calls %s of %s, a later stage" % (mod, s, defined[s]))
if not edges:
    problems.append("no calls between folders found in %s: nothing was checked" % lib)

# ---- file cycles: the objects' calls form no cycle but the llama.cpp type
# registry's (its traits table and the quantizers and library it points to)
REGISTRY = {"ggml_types.c.o", "ggml_quant.c.o", "ggml_lib.c.o"}
obj_of = {}  # symbol -> the object defining it
obj_used = collections.defaultdict(set)
for line in out.splitlines():
    name, _, rest = line.rpartition(":")
    obj, parts = name.split(":")[-1], rest.split()
    if len(parts) == 3 and parts[1] in "TDBRi":
        obj_of[parts[2]] = obj
    elif len(parts) == 2 and parts[0] == "U":
        obj_used[obj].add(parts[1])
calls_of = {o: {obj_of[s] for s in syms if s in obj_of and obj_of[s] != o} for o, syms in obj_used.items()}


def cycles(graph):
    """The strongly connected components of more than one node (Tarjan's, without recursion)."""
    index, low, on, stack, found = {}, {}, set(), [], []
    for root_node in graph:
        if root_node in index:
            continue
        work = [(root_node, iter(graph.get(root_node, ())))]
        index[root_node] = low[root_node] = len(index)
        stack.append(root_node), on.add(root_node)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w), on.add(w)
                    work.append((w, iter(graph.get(w, ()))))
                elif w in on:
                    low[v] = min(low[v], index[w])
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
                    found.append(sorted(comp))
    return found


file_cycles = cycles(calls_of)
if not any(calls_of.values()):
    problems.append("no calls between objects found in %s: nothing was checked" % lib)
for c in file_cycles:
    if not set(c) <= REGISTRY:
        problems.append("the files %s call each other (a cycle; only the llama.cpp type registry may)" % ", ".join(c))

# ---- commands: no command's main calls another's (cli_command.c's table and
# its modes hand argv to each; a shared step is a library call or a cli_ helper)
cli_dir = os.path.join(root, "cli")
with open(os.path.join(cli_dir, "cli_command.c"), encoding="utf-8") as fh:
    mains = set(re.findall(r'\{"[\w-]+", (?:"--[\w-]+", )?(cmd_\w+)', fh.read()))
if len(mains) < 10:
    problems.append("cli/cli_command.c: found %d command mains in its table: nothing was checked" % len(mains))
for fn in sorted(os.listdir(cli_dir)):
    if not fn.endswith(".c") or fn == "cli_command.c":
        continue
    with open(os.path.join(cli_dir, fn), encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            for called in re.findall(r"\b(cmd_\w+)\(", line):
                if called in mains and not re.match(r"int %s\(" % called, line):
                    problems.append("cli/%s:%d: calls %s, another command's main" % (fn, lineno, called))

if problems:
    sys.exit("test_layers:\n  " + "\n  ".join(problems))
calls = ["%s -> %s" % (m, ", ".join(sorted(edges[m], key=RANK.get))) for m in ORDER if edges[m]]
print("layers: %d includes and the calls point one way: %s" % (includes, "; ".join(calls)))
