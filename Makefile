# tvm-ext: `make bench` and `make test` work on a fresh clone (they create .venv first).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
export TOPHUB_LOCATION ?= NONE

.PHONY: all venv lint test test-all check-install bench bench-small fuzz arm-env gpu-env clean

all: test

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "tvm-ext needs Python 3.11 (TVM 0.19 wheels); set PYTHON=/path/to/python3.11")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[tvm,bench,test]"
	@touch $@

venv: $(STAMP)

lint: $(STAMP)
	$(PY) -m ruff check .

# Two pytest workers (pytest-xdist): the suite is mostly single-threaded LLVM code generation.
# --dist loadgroup: the tests marked xdist_group("small_zoo:<model>") share one worker's builds of that
# model (tests/conftest.py, small_zoo_build); the other tests are spread one at a time.
JOBS ?= 2
test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -n $(JOBS) --dist loadgroup --durations=25

test-all: $(STAMP)
	$(PY) -m pytest -q -n $(JOBS) --dist loadgroup

# A regular install, as PyPI users get it: the wheel and the sdist are built, checked for every package and
# the tuned records, installed into a fresh venv (not editable) and run from outside the tree
# (tests/packaging/check_install.py; about a minute with a warm zoo cache).
check-install: $(STAMP)
	$(PY) tests/packaging/check_install.py --python "$(PYTHON)"

bench: $(STAMP)
	$(PY) benchmarks/resnet50_int8.py

bench-small: $(STAMP)
	$(PY) benchmarks/resnet50_int8.py --small --repeat 5

# Differential fuzzing of every pass, pipelines.int8() and tvm_ext.build (child processes, table on stdout).
# N=400 takes about 5 min on 2 quiet cores (1.33 graphs/s measured); N=10000 about 2.1 h.
# TARGET: what the graphs are compiled for (default: the host CPU); one campaign per instruction
# set, e.g. make fuzz TARGET="llvm -mcpu=x86-64-v3" (AVX2); code the host cannot run is only compiled.
# An aarch64 TARGET runs under qemu-user once `make arm-env` has set it up, or on a board: RPC=HOST:PORT.
N      ?= 400
SEED   ?= 0
TARGET ?=
RPC    ?=
fuzz: $(STAMP)
	$(PY) -m tvm_ext.testing.fuzz -n $(N) --seed $(SEED) --out fuzz-failures $(if $(TARGET),--target "$(TARGET)")$(if $(RPC), --rpc $(RPC))

# aarch64 under emulation: qemu-user, the cross compiler (Debian) and an aarch64 Python 3.11 sysroot with TVM's
# aarch64 wheel (Debian + PyPI) in $(ARM_DIR); the tests in tests/arm run aarch64 libraries through TVM RPC with it.
# About 470 MB; docs/arm.md.
ARM_DIR ?= .arm
arm-env:
	PIP="$(PYTHON) -m pip" bash tests/arm/arm-env.sh $(ARM_DIR)

# An OpenCL device for tests/gpu: PoCL and the ICD loader (Debian, needs root) and TVM's OpenCL runtime compiled
# from the wheel's own sources into $(GPU_DIR)/libtvm_opencl_runtime.so (about a minute); docs/gpu.md.
GPU_DIR ?= .gpu
gpu-env: $(STAMP)
	bash tests/gpu/gpu-env.sh $(PY) $(GPU_DIR)

clean:
	rm -rf $(VENV) bench-results .pytest_cache
