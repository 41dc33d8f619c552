#!/bin/sh
# Installs the Debian packages stz needs to build and test, if missing.
# Run as root (or with sudo available). Safe to run again.
set -e
PKGS="build-essential cmake pkg-config libzstd-dev libcjson-dev libxxhash-dev
libopenblas-dev liblapacke-dev libcmocka-dev zstd xz-utils bzip2 time
python3 python3-numpy python3-pytest python3-pip python3-venv"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO=sudo
    echo "installing:$missing"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi
# Optional: OpenMPI, for `mpirun -n N stz compress DIR` (the MPI build is
# made when mpicc is found; its test skips without). Never fails the install.
opt=""
for p in openmpi-bin libopenmpi-dev; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || opt="$opt $p"
done
if [ -n "$opt" ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO=sudo
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $opt >/dev/null; } ||
        echo "note: OpenMPI not installed: stz is built without MPI and its test skips"
fi
# Optional: clang, for `make fuzz` (the libFuzzer targets; CI builds them so
# that the code keeps compiling with a second compiler). Never fails the install.
if ! command -v clang >/dev/null; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO=sudo
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang >/dev/null; } ||
        echo "note: clang not installed: the fuzzing build is skipped"
fi
# Optional: llama.cpp's prebuilt CPU build from npm, to run exported GGUF
# files in the tests (they skip without it). Never fails the install.
NODE_DIR=${STZ_NODE_DIR:-$HOME/.cache/stz/node}
if command -v npm >/dev/null && [ ! -f "$NODE_DIR/node_modules/node-llama-cpp/package.json" ]; then
    mkdir -p "$NODE_DIR"
    npm install --prefix "$NODE_DIR" --omit=optional --no-audit --no-fund --loglevel=error \
        node-llama-cpp@3.22.1 @node-llama-cpp/linux-x64@3.22.1 >/dev/null 2>&1 ||
        echo "note: node-llama-cpp not installed (no npm registry?): the llama.cpp cases of the gguf test will skip"
fi
exit 0
