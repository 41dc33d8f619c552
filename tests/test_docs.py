"""Runs every example in README.md and docs/ so the docs cannot drift.

Usage: test_docs.py STZ REPO_ROOT [SHARED_DATA_DIR]

- In a fenced block, a line starting with "$ " is a command; the lines up to
  the next command or the end of the block are its output (stdout, then
  stderr). Commands run with `sh` in one scratch directory, in document
  order (README first, then docs/*.md, then docs/cli/*.md), with `stz` and
  `build/stz` both the binary under test; a block may rely on files an
  earlier block made. Output must match line for line, except that times
  and speeds ("in 1.23 s", "456.7 MB/s") are not compared, a line "..."
  stands for any number of lines, and trailing blanks are ignored. The exit
  status must be 0 unless the output shows an "stz: error:" line.
- Blocks that name ../shared/data/ (the real weights, as seen from the
  repository) run only when SHARED_DATA_DIR holds them; they are skipped
  otherwise.
- STZ_DOCS_UPDATE=1 (for a change that moves figures on purpose): an output
  that differs, and has no "..." line, is written into the document instead
  of failing; review the diff.
- ```python blocks of FORMAT.md are run by a Python with numpy, then checked
  against stz (check_python below); other ```python blocks use the stz
  package and must print only True (run_python).
- ```json blocks of POLICY.md must be policies stz accepts.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

STZ, ROOT = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
DATA = os.path.abspath(sys.argv[3]) if len(sys.argv) > 3 else os.path.join(ROOT, "..", "shared", "data")
HAVE_DATA = os.path.isfile(os.path.join(DATA, "stories260K.f32.safetensors"))
failures, ran, updates = [], 0, []
UPDATE = os.environ.get("STZ_DOCS_UPDATE") == "1"


def blocks(path):
    """(language, first line number, lines) of each fenced block."""
    out, cur = [], None
    for i, line in enumerate(open(path, encoding="utf-8"), 1):
        line = line.rstrip("\n")
        if line.startswith("```"):
            if cur is None:
                cur = (line[3:].strip(), i + 1, [])
            else:
                out.append(cur)
                cur = None
        elif cur is not None:
            cur[2].append(line)
    return out


TIMES = re.compile(r"\d+(\.\d+)? ([kMG]B/s|s\b)")


def norm(line):
    return TIMES.sub("T", line).rstrip()


def matches(want, got):
    """want may hold '...' lines matching any number of lines."""
    if not want:
        return not got
    if want[0] == "...":
        return any(matches(want[1:], got[k:]) for k in range(len(got) + 1))
    return bool(got) and norm(want[0]) == norm(got[0]) and matches(want[1:], got[1:])


def run_block(where, lines, cwd, env, path, first):
    """lines: a block's, the first at line `first` of path."""
    global ran
    cmds = []
    for i, line in enumerate(lines):
        if line.startswith("$ "):
            cmds.append((line[2:], [], first + i + 1))
        elif cmds:
            cmds[-1][1].append(line)
    for cmd, want, at in cmds:
        ran += 1
        p = subprocess.run(["sh", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
        got = p.stdout.splitlines() + p.stderr.splitlines()
        want_error = any(w.startswith(("stz: error:", "stz: check failed:")) for w in want)
        if (p.returncode != 0) == want_error and not matches(want, got) and UPDATE and "..." not in want:
            updates.append((path, at, len(want), got))
        elif (p.returncode != 0) != want_error or not matches(want, got):
            failures.append("%s: $ %s\n  exit %d\n  wanted:\n    %s\n  got:\n    %s" % (
                where, cmd, p.returncode, "\n    ".join(want), "\n    ".join(got)))


def python_with_numpy():
    for py in ("/usr/bin/python3", sys.executable, "python3"):
        if shutil.which(py) and subprocess.run([py, "-c", "import numpy"], capture_output=True).returncode == 0:
            return py
    return None


# The docs' Python reader, then a check: every tensor of the quantized file
# it reads equals what `stz dequantize --dtype f32` writes.
CHECK = r"""
import sys
q_t, q_meta = load("q.safetensors")
ref, _ = load("q.f32.safetensors")
names = [k[len("stz.quant."):] for k in q_meta if k.startswith("stz.quant.") and k != "stz.quant.version"]
assert len(names) >= 11 + 14, names
for n in names:
    got = dequant(q_t, q_meta, n)
    want = ref[n]
    assert got.shape == want.shape, (n, got.shape, want.shape)
    err = float(np.max(np.abs(got - want)))
    assert err <= 1e-6 * float(np.max(np.abs(want))), (n, err)
plain, _ = load("plain.bf16.safetensors")
assert plain["w"].dtype == np.float32 and abs(float(plain["w"][0, 1]) - 1.5) < 1e-9, plain["w"][0, :4]
print("python reader: %d quantized tensors equal stz dequantize" % len(names))
"""


def counted_python(where):
    """A Python with numpy for the example at `where` (counted as run), or None (skipped)."""
    global ran
    py = python_with_numpy()
    if not py:
        print("skip: %s: no Python with numpy" % where)
        return None
    ran += 1
    return py


def run_python(where, code, cwd, env):
    """Other ```python blocks use the stz package (python/): they must run
    without error and print only True."""
    py = counted_python(where)
    if not py:
        return
    env = dict(env, PYTHONPATH=os.path.join(ROOT, "python"), STZ=STZ, PYTHONDONTWRITEBYTECODE="1",
               STZ_LIBRARY=os.path.join(os.path.dirname(STZ), "libstz.so"))
    p = subprocess.run([py, "-c", code], cwd=cwd, env=env, capture_output=True, text=True)
    if p.returncode or set(p.stdout.split()) - {"True"}:
        failures.append("%s: the Python example fails:\n%s%s" % (where, p.stdout, p.stderr))


GGML_TYPES = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs",
              "f16", "bf16"]


def check_python(where, code, cwd, env):
    py = counted_python(where)
    if not py:
        return
    rule = '{"default":"keep","rules":[{"match":"a","action":"int4","block_size":32},' \
           '{"match":"b","action":"int8","block_size":64,"method":"mse"},' \
           '{"match":"c","action":"svd","rank":4},{"match":"d","action":"int4","block_size":256},' \
           '{"match":"e","action":"int3","method":"nl","block_size":32,"scale_dtype":"U8"},' \
           '{"match":"f","action":"int5","method":"asym","block_size":16},' \
           '{"match":"g","action":"int6","method":"nl-fit","block_size":64,"scale_dtype":"U8"},' \
           '{"match":"h","action":"int4","method":"nl","block_size":32,"scale_dtype":"U8"},' \
           '{"match":"i","action":"int2","method":"full","block_size":4},' \
           '{"match":"j","action":"int3","method":"trellis","block_size":16,"scale_dtype":"U8"},' \
           '{"match":"k","action":"int2","method":"trellis","block_size":32},' + \
           '{"match":"p_q5_1","action":"q5_1","pad":true},{"match":"p_q4_k","action":"q4_k","pad":true},' + \
           ','.join('{"match":"g_%s","action":"%s"}' % (t, t) for t in GGML_TYPES) + ']}'
    setup = [
        # a model with one tensor per storage case: int4 blocks, int8 mse,
        # svd factors, one block per row (a single 'scale'), int3 nl with U8
        # scales, int5 asym (minimums), int6 nl-fit (stored levels), a single
        # U8 scale, int2 full; trellis int3 over two segments (128 + 172 rows) and
        # int2 over one of 7 rows; each of llama.cpp's types (g_TYPE); rows of 100 in
        # padded 32-blocks (p_TYPE: q5_1, and q4_k as its stand-in q5_0); a kept BF16 tensor
        py + " -c \"import numpy as np, json, struct; r = np.random.default_rng(1);"
        " t = {'a': r.standard_normal((8, 96)), 'b': r.standard_normal((16, 100)), 'c': r.standard_normal((24, 40)),"
        " 'd': r.standard_normal((1, 200)), 'e': r.standard_normal((10, 70)), 'f': r.standard_normal((12, 33)),"
        " 'g': r.standard_normal((300, 64)), 'h': r.standard_normal((1, 20)), 'i': r.standard_normal((5, 9)),"
        " 'j': r.standard_normal((300, 40)), 'k': r.standard_normal((7, 33)),"
        " 'p_q5_1': r.standard_normal((3, 100)), 'p_q4_k': r.standard_normal((5, 100))};"
        " t.update(('g_' + k, r.standard_normal((3, 512)) * 0.1) for k in %r);" % (GGML_TYPES,) +
        " h = {}; data = b''\n"
        "for k, v in t.items():\n"
        "    b = v.astype('<f4').tobytes(); h[k] = {'dtype': 'F32', 'shape': list(v.shape), 'data_offsets': [len(data), len(data) + len(b)]}; data += b\n"
        "w = np.array([[1.0, 1.5, -2.0, 0.25]], dtype='<f4').view('<u4') >> 16\n"
        "b = w.astype('<u2').tobytes(); h['w'] = {'dtype': 'BF16', 'shape': [1, 4], 'data_offsets': [len(data), len(data) + len(b)]}; data += b\n"
        "j = json.dumps(h).encode(); j += b' ' * (-len(j) % 8)\n"
        "open('m.safetensors', 'wb').write(struct.pack('<Q', len(j)) + j + data)\"",
        "echo '%s' > docs-test-policy.json" % rule,
        "stz quantize -q -f --policy docs-test-policy.json m.safetensors -o q.safetensors",
        "stz dequantize -q -f --dtype f32 q.safetensors -o q.f32.safetensors",
        "cp m.safetensors plain.bf16.safetensors",
    ]
    for s in setup:
        p = subprocess.run(["sh", "-c", s], cwd=cwd, env=env, capture_output=True, text=True)
        if p.returncode:
            failures.append("%s: setup failed: %s\n%s" % (where, s, p.stderr))
            return
    p = subprocess.run([py, "-c", code + "\n" + CHECK], cwd=cwd, env=env, capture_output=True, text=True)
    if p.returncode:
        failures.append("%s: the Python example fails:\n%s" % (where, p.stderr))


def check_policy(where, text, cwd, env):
    global ran
    if '"rules"' not in text and '"default"' not in text:
        return
    ran += 1
    path = os.path.join(cwd, "docs-policy.json")
    open(path, "w").write(text)
    p = subprocess.run([STZ, "policy", "show", path], env=env, capture_output=True, text=True)
    if p.returncode:
        failures.append("%s: policy refused: %s" % (where, p.stderr))


def main():
    docs = [os.path.join(ROOT, "README.md")]
    for sub in ("docs", os.path.join("docs", "cli")):
        d = os.path.join(ROOT, sub)
        docs += sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".md"))
    top = tempfile.mkdtemp(prefix="stz-docs-")
    work = os.path.join(top, "repo")  # ../shared/data is the real weights, as beside the repository
    try:
        os.makedirs(os.path.join(work, "build"))
        os.makedirs(os.path.join(top, "shared"))
        if HAVE_DATA:
            os.symlink(DATA, os.path.join(top, "shared", "data"))
        bindir = os.path.join(work, ".bin")
        os.makedirs(bindir)
        for link in (os.path.join(work, "build", "stz"), os.path.join(bindir, "stz")):
            os.symlink(STZ, link)
        env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""), LC_ALL="C")
        for path in docs:
            rel = os.path.relpath(path, ROOT)
            for lang, line, lines in blocks(path):
                where = "%s:%d" % (rel, line)
                if lang == "python" and rel.endswith("FORMAT.md"):
                    check_python(where, "\n".join(lines), work, env)
                elif lang == "python":
                    run_python(where, "\n".join(lines), work, env)
                elif lang == "json" and rel.endswith("POLICY.md"):
                    check_policy(where, "\n".join(lines), work, env)
                elif any(l.startswith("$ ") for l in lines):
                    if not HAVE_DATA and any("shared/data/" in l for l in lines):
                        print("skip: %s: needs the weights in %s" % (where, DATA))
                        continue
                    run_block(where, lines, work, env, path, line)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    for path, at, n, got in sorted(updates, reverse=True):  # from the bottom, so line numbers hold
        text = open(path, encoding="utf-8").read().split("\n")
        text[at - 1:at - 1 + n] = got
        open(path, "w", encoding="utf-8").write("\n".join(text))
        print("updated: %s:%d" % (os.path.relpath(path, ROOT), at))
    for f in failures:
        print("FAIL: " + f)
    print("docs: %d examples run, %d failed" % (ran, len(failures)))
    return 1 if failures or not ran else 0


sys.exit(main())
