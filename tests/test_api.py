"""libstz.so exports exactly the public API: every function or object it
exports is declared with STZ_API in a header of include/, after a comment
that documents it (the headers are the manual), and every such declaration
is exported; nothing internal leaks (issue: "nm on libstz.so lists only
documented functions").

Usage: test_api.py LIBSTZ_SO SOURCE_ROOT
"""
import os
import re
import subprocess
import sys

so, root = sys.argv[1], sys.argv[2]
out = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True, text=True, check=True).stdout
exported = {p[2] for p in (line.split() for line in out.splitlines()) if len(p) == 3 and p[1] in "TDBRi"}
exported = {s for s in exported if not s.startswith("_")}  # _init, _fini, _edata...
declared, problems = {}, []
inc = os.path.join(root, "include")
for h in sorted(os.listdir(inc)):
    if not h.endswith(".h"):
        continue
    lines = open(os.path.join(inc, h), encoding="utf-8").read().split("\n")
    for i, line in enumerate(lines):
        if not line.startswith("STZ_API "):
            continue
        m = re.match(r"STZ_API [^(;\[]*?[ *]([a-z_][a-z0-9_]*)\s*[(\[]", line)
        if not m:
            problems.append("include/%s:%d: STZ_API on something that is not a declaration" % (h, i + 1))
            continue
        declared[m.group(1)] = "%s:%d" % (h, i + 1)
        # documented: a comment ends in the lines just above (one comment may cover a group)
        j = i - 1
        while j >= 0 and (lines[j].startswith("STZ_API ") or lines[j].startswith(" ") and not lines[j].startswith(" *")
                          or lines[j].startswith("#")):
            j -= 1
        if j < 0 or not lines[j].rstrip().endswith("*/"):
            problems.append("include/%s:%d: %s has no comment saying what it does" % (h, i + 1, m.group(1)))
# the stable headers declare no kernel (a row, a block, a plane at a time): those are experimental
STABLE = {"stz.h", "stz_safetensors.h", "stz_quant.h", "stz_policy.h", "stz_pack.h", "stz_model.h", "stz_pipeline.h",
          "stz_eval.h"}
KERNEL = re.compile(r"_ref$|_row$|^stz_qf_|^stz_q[48]_|^stz_xform_(split|merge)$|^stz_quantize_tensor|^stz_mm_")
for name, where in sorted(declared.items()):
    if where.split(":")[0] in STABLE and KERNEL.search(name):
        problems.append("include/%s: the kernel %s in a stable header (kernels are experimental: stz_kernels.h, "
                        "stz_planes.h)" % (where, name))
for s in sorted(exported - set(declared)):
    problems.append("libstz.so exports %s, which no header of include/ declares with STZ_API" % s)
for s in sorted(set(declared) - exported):
    problems.append("include/%s declares %s with STZ_API, but libstz.so does not export it" % (declared[s], s))
if len(exported) < 50:
    problems.append("only %d symbols exported by %s: is it the library?" % (len(exported), so))
if problems:
    sys.exit("test_api:\n  " + "\n  ".join(problems))
print("api: libstz.so exports the %d documented declarations of include/ and nothing else" % len(exported))
