"""A PEP 517 build backend that needs nothing: the standard library only,
so that `pip install ./python` works offline on a fresh Debian machine
(setuptools would be fetched from the network by pip's build isolation).

The wheel holds the package and a copy of libstz.so.0, so that the
installed package finds its library without a library path: the one given
by $STZ_LIBRARY, else the build tree's (../build, after `make`). Without
either it is a pure wheel that looks for an installed libstz at run time.
Only build_wheel is offered (pip installs from the source directory with it).
"""
import base64
import hashlib
import os
import sysconfig
import tomllib
import zipfile

_HERE = os.path.dirname(os.path.abspath(__file__))


def _project():
    with open(os.path.join(_HERE, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _library():
    for path in (os.environ.get("STZ_LIBRARY"), os.path.join(_HERE, "..", "build", "libstz.so.0")):
        if path and os.path.isfile(path):
            return os.path.realpath(path)
    return None


def _metadata(p):
    lines = ["Metadata-Version: 2.1", "Name: " + p["name"], "Version: " + p["version"],
             "Summary: " + p.get("description", ""), "Requires-Python: " + p.get("requires-python", ">=3")]
    lines += ["Requires-Dist: " + d for d in p.get("dependencies", [])]
    with open(os.path.join(_HERE, p.get("readme", "README.md")), encoding="utf-8") as f:
        return "\n".join(lines + ["Description-Content-Type: text/markdown", "", f.read()])


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    p, lib = _project(), _library()
    tag = "py3-none-" + sysconfig.get_platform().replace("-", "_").replace(".", "_") if lib else "py3-none-any"
    dist = "%s-%s" % (p["name"], p["version"])
    files = {}
    pkg = os.path.join(_HERE, "stz")
    for name in sorted(os.listdir(pkg)):
        if name.endswith(".py") or name == "py.typed":
            with open(os.path.join(pkg, name), "rb") as f:
                files["stz/" + name] = f.read()
    if lib:
        with open(lib, "rb") as f:
            files["stz/libstz.so.0"] = f.read()
    info = dist + ".dist-info/"
    files[info + "METADATA"] = _metadata(p).encode()
    files[info + "WHEEL"] = ("Wheel-Version: 1.0\nGenerator: stz_build\nRoot-Is-Purelib: %s\nTag: %s\n"
                             % ("false" if lib else "true", tag)).encode()
    files[info + "top_level.txt"] = b"stz\n"
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (name, digest, len(data)))
    files[info + "RECORD"] = ("\n".join(record + [info + "RECORD,,"]) + "\n").encode()
    wheel = "%s-%s.whl" % (dist, tag)
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            zi = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            zi.external_attr = (0o755 if name.endswith(".so.0") else 0o644) << 16
            z.writestr(zi, data, zipfile.ZIP_DEFLATED)
    return wheel
