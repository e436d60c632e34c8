#!/usr/bin/env bash
# Sets up what running aarch64 TVM libraries on an x86-64 Debian host needs (used by `make arm-env`):
#   1. Debian's qemu-user (qemu-aarch64) and the aarch64 cross compiler (aarch64-linux-gnu-g++);
#   2. an aarch64 Python 3.11 sysroot: Debian's python3.11-minimal:arm64 and the libraries it and TVM's
#      runtime load, unpacked with dpkg -x (nothing is installed for arm64);
#   3. the aarch64 wheels of TVM 0.19 (xtc-tvm-python-bindings), numpy<2 and cloudpickle, unpacked into
#      the sysroot's dist-packages (TVM's libtvm.so is left out: it needs libLLVM, and the runtime
#      library is what an RPC server loads, with TVM_USE_RUNTIME_LIB=1);
#   4. <ARM_DIR>/bin/python3.11, a shell wrapper that runs that Python under qemu-aarch64 (there is no
#      binfmt_misc here, so processes the server starts must exec this wrapper, not the aarch64 binary).
# Idempotent: a complete set-up (a stamp naming every package and wheel) is checked, not redone.
# Usage: tests/arm/arm-env.sh [ARM_DIR]   (default .arm; PIP overrides the pip command, default python3 -m pip)
set -euo pipefail

ARM_DIR=${1:-.arm}
PIP=${PIP:-python3 -m pip}
DEBS=(python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libc6 libgcc-s1 libstdc++6 zlib1g libexpat1
      libffi8 libssl3 libbz2-1.0 liblzma5 libcrypt1 libuuid1)
WHEELS=("xtc-tvm-python-bindings==0.19.0.12" "numpy<2" "cloudpickle")
# numpy 1.26's aarch64 wheels are manylinux2014 (= manylinux_2_17); pip matches --platform tags exactly
PLATFORMS=(--platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64)

say() { echo "arm-env: $*"; }
die() { echo "arm-env: error: $*" >&2; exit 1; }
apt_quiet() { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -q "$@"; }

mkdir -p "$ARM_DIR"
ARM_DIR=$(cd "$ARM_DIR" && pwd)
SYSROOT=$ARM_DIR/sysroot
SITE=$SYSROOT/usr/lib/python3/dist-packages   # Debian's Python adds <prefix>/lib/python3/dist-packages
STAMP=$SYSROOT/.arm-env-stamp

command -v dpkg >/dev/null && command -v apt-get >/dev/null \
  || die "needs a Debian or Ubuntu host (dpkg and apt-get); see docs/arm.md for what to install elsewhere"

# 1. host tools
have_qemu() { command -v qemu-aarch64 >/dev/null || command -v qemu-aarch64-static >/dev/null; }
if have_qemu && command -v aarch64-linux-gnu-g++ >/dev/null; then
  say "host tools present: $(command -v qemu-aarch64 || command -v qemu-aarch64-static), $(command -v aarch64-linux-gnu-g++)"
else
  [ "$(id -u)" = 0 ] || die "qemu-aarch64 or aarch64-linux-gnu-g++ is missing and this is not root; run as root, or: sudo apt-get install qemu-user g++-aarch64-linux-gnu"
  say "apt-get install qemu-user g++-aarch64-linux-gnu"
  if ! apt_quiet install -y --no-install-recommends qemu-user g++-aarch64-linux-gnu >/dev/null; then
    say "apt-get update, then install again"
    apt_quiet update >/dev/null || die "apt-get update failed"
    apt_quiet install -y --no-install-recommends qemu-user g++-aarch64-linux-gnu >/dev/null \
      || die "apt-get install qemu-user g++-aarch64-linux-gnu failed"
  fi
  have_qemu || die "qemu-user is installed but qemu-aarch64 is not on PATH"
fi

# 2.-3. the sysroot
want="debs: ${DEBS[*]}; wheels: ${WHEELS[*]}"
if [ -f "$STAMP" ] && [ "$(head -n 1 "$STAMP")" = "$want" ]; then
  say "sysroot up to date: $SYSROOT"
else
  [ "$(id -u)" = 0 ] || [ -n "$(dpkg --print-foreign-architectures | grep -x arm64)" ] \
    || die "arm64 is not a dpkg architecture here and this is not root; run: sudo dpkg --add-architecture arm64 && sudo apt-get update"
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    say "dpkg --add-architecture arm64 (package lists only; nothing arm64 is installed)"
    dpkg --add-architecture arm64
    apt_quiet update >/dev/null || die "apt-get update failed"
  fi
  if ! apt-cache show python3.11-minimal:arm64 >/dev/null 2>&1; then
    say "apt-get update (no arm64 package lists yet)"
    apt_quiet update >/dev/null || die "apt-get update failed"
  fi
  work=$(mktemp -d "$ARM_DIR/.work.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/debs" "$work/wheels" "$work/root"
  say "apt-get download ${DEBS[*]} (arm64)"
  (cd "$work/debs" && apt_quiet -o APT::Sandbox::User=root download "${DEBS[@]/%/:arm64}" >/dev/null) \
    || die "apt-get download of the arm64 packages failed (is the arm64 architecture in the apt sources?)"
  say "pip download ${WHEELS[*]} (manylinux aarch64, cp311)"
  $PIP download --quiet --disable-pip-version-check --only-binary=:all: --no-deps --python-version 3.11 \
      --implementation cp "${PLATFORMS[@]}" -d "$work/wheels" "${WHEELS[@]}" \
    || die "pip download of the aarch64 wheels failed"
  say "unpacking into $SYSROOT"
  for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$work/root"; done
  mkdir -p "$work/root/usr/lib/python3/dist-packages"
  python3 - "$work/root/usr/lib/python3/dist-packages" "$work"/wheels/*.whl <<'EOF' || die "unpacking the wheels failed"
import sys, zipfile
site, wheels = sys.argv[1], sys.argv[2:]
for whl in wheels:
    with zipfile.ZipFile(whl) as z:
        z.extractall(site, [n for n in z.namelist() if n != "tvm/libtvm.so"])
EOF
  rm -rf "$SYSROOT"
  mv "$work/root" "$SYSROOT"
  { echo "$want"
    for deb in "$work"/debs/*.deb; do dpkg-deb -f "$deb" Package Version | paste -sd' '; done
    (cd "$work/wheels" && ls); } > "$STAMP"
  rm -rf "$work"
fi

# 4. the wrapper
mkdir -p "$ARM_DIR/bin"
cat > "$ARM_DIR/bin/python3.11" <<'EOF'
#!/bin/sh
# aarch64 Python 3.11 of this folder's sysroot, run by qemu-user (written by tests/arm/arm-env.sh).
# TVM_USE_RUNTIME_LIB=1: TVM loads libtvm_runtime.so (libtvm.so needs libLLVM, not in the sysroot).
root=$(cd "$(dirname "$0")/.." && pwd)
qemu=$(command -v qemu-aarch64 || command -v qemu-aarch64-static) || { echo "qemu-aarch64 not found" >&2; exit 127; }
TVM_USE_RUNTIME_LIB=1 exec "$qemu" -L "$root/sysroot" "$root/sysroot/usr/bin/python3.11" "$@"
EOF
chmod +x "$ARM_DIR/bin/python3.11"

say "checking: $ARM_DIR/bin/python3.11 imports tvm, numpy, cloudpickle (about 15 s under emulation)"
"$ARM_DIR/bin/python3.11" -c 'import platform, tvm, tvm.rpc, numpy, cloudpickle
print("arm-env: aarch64 Python", platform.python_version(), platform.machine(), "tvm", tvm.__version__, "numpy", numpy.__version__)' \
  2> >(grep -v '^Loading runtime library' >&2) || die "the aarch64 Python cannot import tvm/numpy/cloudpickle"
say "done: $(du -sh "$ARM_DIR" | cut -f1) in $ARM_DIR"
