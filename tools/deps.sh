#!/bin/sh
# Installs the Debian packages stz needs to build and test, if missing.
# Run as root (or with sudo available). Safe to run again.
set -e
PKGS="build-essential cmake pkg-config libzstd-dev libcjson-dev libxxhash-dev
libopenblas-dev liblapacke-dev libcmocka-dev zstd xz-utils bzip2 time
python3 python3-numpy python3-pytest python3-pip python3-setuptools"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
echo "installing:$missing"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
