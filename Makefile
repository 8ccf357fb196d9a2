# kvdeck — the two commands of the README: `make run` and `make test`.
# Both are idempotent: every step leaves a stamp and re-runs only when its inputs change.

PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
PIP     := $(VPY) -m pip
MODEL   ?= smollm2-135m
WEIGHTS := models/weights/$(MODEL)
NATIVE_SRC := $(shell find native -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null) CMakeLists.txt pyproject.toml

.PHONY: run test build model lint bench cuda-check cross-check tsan-check clean

run: build model
	$(VENV)/bin/kvdeck

test: build model $(VENV)/.test-deps
	$(VPY) -m pytest -q -x tests $(PYTEST_ARGS)

build: $(VENV)/.native

model: $(WEIGHTS)/.done

$(VENV)/.venv:
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	touch $@

# Build tools and runtime + conversion dependencies (no torch).
$(VENV)/.deps: $(VENV)/.venv pyproject.toml
	$(PIP) install -q "scikit-build-core>=0.10" "pybind11>=2.13" ninja cmake
	$(PIP) install -q numpy safetensors tokenizers orjson "llguidance>=1.0" psutil "gguf>=0.10" "jinja2>=3" \
	  "textual>=1.0" "sqlite-utils>=4.0" "platformdirs>=4" 'tomli>=2; python_version < "3.11"'
	touch $@

# Tests and references: torch 2.13.0 (CPU build from local disk), transformers, hypothesis.
$(VENV)/.test-deps: $(VENV)/.deps
	$(PIP) install -q torch==2.13.0 "transformers>=4.45" pytest hypothesis "pytest-textual-snapshot>=1.0"
	touch $@

# The native module: incremental rebuild (persistent build/ dir) whenever native/ changes.
$(VENV)/.native: $(VENV)/.deps $(NATIVE_SRC)
	flock build.lock $(PIP) install -q --no-build-isolation --no-deps -e .
	touch $@

# models/writer.py holds CONVERTER_VERSION: a bump makes `fetch` rebuild the folders it outdates.
$(WEIGHTS)/.done: $(VENV)/.native $(VENV)/.test-deps models/manifests/$(MODEL).toml models/writer.py  # torch: GPTQ rounding
	$(VENV)/bin/kvdeck models fetch $(MODEL)
	touch $@

# The llama.cpp peer of `kvdeck bench cpu` (the `bench` extra; compiles llama.cpp: minutes).
# Built for this CPU (GGML_NATIVE) but without AMX: with AMX on, llama.cpp 0.3.36 dies of SIGSEGV in
# its first prefill on the Xeon KVM guests here (its AMX buffer type); PEER_CFLAGS= keeps AMX.
PEER_CFLAGS ?= -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
$(VENV)/.bench-deps: $(VENV)/.deps
	CMAKE_ARGS="-DCMAKE_C_FLAGS='$(PEER_CFLAGS)' -DCMAKE_CXX_FLAGS='$(PEER_CFLAGS)'" \
	  $(PIP) install -q --no-cache-dir "llama-cpp-python>=0.3"
	touch $@

bench: build model $(VENV)/.bench-deps
	$(VENV)/bin/kvdeck bench cpu

# Compile (only) the CUDA sources for Orin (sm_87) and Hopper (sm_90) where nvcc exists.
cuda-check:
	@if command -v nvcc >/dev/null 2>&1 && ls native/kernels/cuda/*.cu >/dev/null 2>&1; then \
	  for f in native/kernels/cuda/*.cu; do \
	    nvcc -std=c++17 -Inative/include -gencode arch=compute_87,code=sm_87 \
	         -gencode arch=compute_90,code=sm_90 -c $$f -o /dev/null || exit 1; \
	  done; echo "cuda-check: compiled $$(ls native/kernels/cuda/*.cu | wc -l) file(s)"; \
	else echo "cuda-check: skipped (no nvcc or no .cu files)"; fi

# Cross-compile the core library and the native tests for aarch64 (the Jetson's ISA) and run
# the tests under qemu: an x86-only intrinsic outside its guard fails here. Needs
# g++-aarch64-linux-gnu and qemu-user (.ci/run installs them). No Python module is built.
# ctest runs on an emulated Cortex-A76 (ARMv8.2-A + dotprod, the A78AE's ISA; the toolchain
# file's emulator), so the neon kernel set is selected and checked against scalar; then
# kernel_check runs with the scalar set forced (KVDECK_ISA) and on a Cortex-A72 (ARMv8.0, no
# dotprod: the dispatcher must fall back, and no v8.2 instruction may leak into common code).
CROSS_BUILD := build/aarch64-linux-gnu
CROSS_QEMU := qemu-aarch64 -L /usr/aarch64-linux-gnu
cross-check: $(VENV)/.deps
	@command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null || \
	  { echo "cross-check: needs aarch64-linux-gnu-g++ and qemu-aarch64 (apt-get install g++-aarch64-linux-gnu qemu-user)"; exit 1; }
	$(VENV)/bin/cmake -S . -B $(CROSS_BUILD) -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV)/bin/ninja) \
	  -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DKVDECK_PYTHON=OFF -DKVDECK_TESTS=ON -DKVDECK_CUDA=OFF \
	  -DCMAKE_BUILD_TYPE=Release >/dev/null
	$(VENV)/bin/cmake --build $(CROSS_BUILD) -j2
	$(VENV)/bin/ctest --test-dir $(CROSS_BUILD) --output-on-failure -V
	$(CROSS_QEMU) -cpu cortex-a76 $(CROSS_BUILD)/kernel_check --expect neon
	KVDECK_ISA=scalar $(CROSS_QEMU) -cpu cortex-a76 $(CROSS_BUILD)/kernel_check --expect scalar
	$(CROSS_QEMU) -cpu cortex-a72 $(CROSS_BUILD)/kernel_check --expect scalar
	$(CROSS_QEMU) -cpu cortex-a72 $(CROSS_BUILD)/thread_stress 100
	@w=$$(aarch64-linux-gnu-nm -C $(CROSS_BUILD)/CMakeFiles/kvdeck_core.dir/native/kernels/cpu/*_neon.cpp.o | grep -E ' [WVu] ' | grep -v ' DW.ref.' || true); \
	  if [ -n "$$w" ]; then echo "cross-check: weak (shared inline) symbols in the ARMv8.2 *_neon.cpp objects:"; echo "$$w"; exit 1; fi; \
	  echo "cross-check: no weak symbols in the *_neon.cpp objects (no v8.2 code the linker could share)"

# The engine's thread contract under ThreadSanitizer: the core built with -fsanitize=thread
# and native/tests/thread_stress.cpp (generation with evictions and cancels on one thread,
# snapshot / tree / event reads on others). Not part of `make test` (a separate build).
TSAN_BUILD := build/tsan
tsan-check: $(VENV)/.deps
	$(VENV)/bin/cmake -S . -B $(TSAN_BUILD) -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV)/bin/ninja) \
	  -DKVDECK_TSAN=ON -DKVDECK_PYTHON=OFF -DKVDECK_TESTS=ON -DKVDECK_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	$(VENV)/bin/cmake --build $(TSAN_BUILD) -j2 --target thread_stress
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" $(TSAN_BUILD)/thread_stress 400

clean:
	rm -rf build $(VENV)
