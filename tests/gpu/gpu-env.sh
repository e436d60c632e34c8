#!/usr/bin/env bash
# Sets up an OpenCL device for the GPU tests: PoCL (an OpenCL implementation on the CPU) from Debian,
# and TVM's OpenCL runtime compiled from the wheel's own sources into a plugin next to the wheel's
# libtvm.so (the wheel's runtime has no OpenCL device). Usage: tests/gpu/gpu-env.sh [PYTHON] [DIR]
#   1. apt-get install pocl-opencl-icd ocl-icd-opencl-dev (root; skipped when present)
#   2. DIR/include/tvm/support/span.h, the one header the wheel's headers include but it lacks: the wheel's
#      tvm/runtime/metadata.h only constructs a Span<const int64_t, int64_t> from a pointer range, so a
#      pointer-range class written here serves (no network)
#   3. DIR/libtvm_opencl_runtime.so: tvm/src/runtime/opencl/{opencl_device_api,opencl_module,texture_pool}.cc
#      with the wheel's headers, linked against its libtvm.so and libOpenCL (about a minute on 2 cores)
#   4. a check: tvm_ext.gpu.opencl.load_runtime() finds the device
set -euo pipefail
PY=${1:-.venv/bin/python}
DIR=${2:-.gpu}
say() { echo "gpu-env: $*"; }
die() { echo "gpu-env: error: $*" >&2; exit 1; }
apt_quiet() { DEBIAN_FRONTEND=noninteractive apt-get -q "$@"; }

# 1. PoCL and the ICD loader
if [ -e /usr/lib/x86_64-linux-gnu/libOpenCL.so ] || [ -e /usr/lib/aarch64-linux-gnu/libOpenCL.so ]; then
  have_dev=1
else
  have_dev=0
fi
if [ "$have_dev" = 1 ] && ls /etc/OpenCL/vendors/*.icd >/dev/null 2>&1; then
  say "OpenCL ICD present: $(ls /etc/OpenCL/vendors/*.icd | paste -sd' ')"
else
  [ "$(id -u)" = 0 ] || die "no OpenCL ICD or libOpenCL.so and this is not root; run: sudo apt-get install pocl-opencl-icd ocl-icd-opencl-dev"
  say "apt-get install pocl-opencl-icd ocl-icd-opencl-dev"
  if ! apt_quiet install -y --no-install-recommends pocl-opencl-icd ocl-icd-opencl-dev >/dev/null; then
    say "apt-get update, then install again"
    apt_quiet update >/dev/null || die "apt-get update failed"
    apt_quiet install -y --no-install-recommends pocl-opencl-icd ocl-icd-opencl-dev >/dev/null \
      || die "apt-get install pocl-opencl-icd ocl-icd-opencl-dev failed"
  fi
fi

# 2.-3. the plugin
TVM=$("$PY" -c 'import os, tvm; print(os.path.dirname(tvm.__file__))' 2>/dev/null) || die "$PY cannot import tvm (run make venv first)"
[ -d "$TVM/src/runtime/opencl" ] || die "the TVM wheel at $TVM ships no src/runtime/opencl"
CXX=${CXX:-g++}
command -v "$CXX" >/dev/null || die "$CXX not found (apt-get install g++)"
mkdir -p "$DIR/include/tvm/support" "$DIR/pocl-cache"
DIR=$(cd "$DIR" && pwd)
if [ ! -f "$TVM/include/tvm/support/span.h" ]; then
  cat > "$DIR/include/tvm/support/span.h" <<'HEADER'
/* A pointer range, for compiling TVM 0.19's OpenCL runtime against the headers of its Python wheel:
 * tvm/runtime/metadata.h includes <tvm/support/span.h>, which the wheel does not ship, and only builds
 * Span<const int64_t, int64_t>(begin, end). Written by tests/gpu/gpu-env.sh. */
#ifndef TVM_SUPPORT_SPAN_H_
#define TVM_SUPPORT_SPAN_H_
#include <cstddef>
namespace tvm {
namespace support {
template <typename T, typename W>
class Span {
 public:
  Span(T* begin, T* end) : begin_(begin), end_(end) {}
  T* begin() const { return begin_; }
  T* end() const { return end_; }
  size_t size() const { return static_cast<size_t>(end_ - begin_); }
  W operator[](size_t i) const { return static_cast<W>(begin_[i]); }

 private:
  T* begin_;
  T* end_;
};
}  // namespace support
}  // namespace tvm
#endif  // TVM_SUPPORT_SPAN_H_
HEADER
fi
SRC="$TVM/src/runtime/opencl"
FILES=("$SRC/opencl_device_api.cc" "$SRC/opencl_module.cc" "$SRC/texture_pool.cc")
OUT="$DIR/libtvm_opencl_runtime.so"
want="$("$PY" -c 'import tvm; print(tvm.__version__)') $(cat "${FILES[@]}" "$0" | md5sum | cut -d' ' -f1)"
if [ -f "$OUT" ] && [ "$(cat "$DIR/plugin.stamp" 2>/dev/null)" = "$want" ]; then
  say "plugin up to date: $OUT"
else
  say "compiling TVM's OpenCL runtime from $SRC (about a minute)"
  objs=()
  for f in "${FILES[@]}"; do
    o="$DIR/$(basename "$f" .cc).o"
    "$CXX" -std=c++17 -O2 -fPIC -w -c "$f" -o "$o" \
      -I "$DIR/include" -I "$TVM/include" -I "$TVM/3rdparty/dlpack/include" \
      -I "$TVM/3rdparty/dmlc-core/include" -I "$TVM/3rdparty/OpenCL-Headers" \
      -DDMLC_USE_LOGGING_LIBRARY='<tvm/runtime/logging.h>' -DTVM_LOG_CUSTOMIZE=0 \
      -DCL_TARGET_OPENCL_VERSION=300 &
    objs+=("$o")
  done
  wait_all() { local rc=0; for j in $(jobs -p); do wait "$j" || rc=1; done; return $rc; }
  wait_all || die "compiling the OpenCL runtime failed"
  # -Bsymbolic: the plugin's calls to OpenCLModuleCreate & co. bind to its own definitions, not to the
  # stubs of the same name in the wheel's libtvm.so (which make source-only modules)
  "$CXX" -shared -Wl,-Bsymbolic -o "$OUT.part" "${objs[@]}" -L "$TVM" -Wl,-rpath,"$TVM" -ltvm -lOpenCL \
    || die "linking the OpenCL runtime failed (is ocl-icd-opencl-dev installed?)"
  mv "$OUT.part" "$OUT"
  rm -f "${objs[@]}"
  echo "$want" > "$DIR/plugin.stamp"
fi

# 4. check
say "checking: the plugin loads and PoCL shows a device"
TVM_EXT_GPU_DIR="$DIR" "$PY" -c 'from tvm_ext.gpu import opencl
why = opencl.missing()
if why:
    raise SystemExit("gpu-env: error: " + why)
print("gpu-env:", opencl.describe())' 2> >(grep -v "^Loading runtime library" >&2) || exit 1
say "done: $OUT"
