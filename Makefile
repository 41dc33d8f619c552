# Convenience wrapper over CMake. `make demo` and `make test` are the
# README's commands; `make asan` runs the tests under ASan+UBSan, `make tsan`
# the threaded C tests under TSan.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
EXAMPLE = $(BUILD)/example/qwen2-0.5b.safetensors

.PHONY: all build demo python test asan oom tsan fuzz bench install clean

all: build

build:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	@mkdir -p $(BUILD)/example
	$(BUILD)/stz synth qwen2-0.5b -o $(EXAMPLE) --stats -f
	$(BUILD)/stz compress --int4 --fast $(EXAMPLE) -o $(EXAMPLE).int4.stz -f
	$(BUILD)/stz decompress $(EXAMPLE).int4.stz --dequantize -o $(BUILD)/example/plain.safetensors -f
	$(BUILD)/stz eval $(EXAMPLE) $(EXAMPLE).int4.stz --threshold 0.98 -q
	$(BUILD)/stz compress --lossless $(EXAMPLE) -o $(EXAMPLE).stz -f
	$(BUILD)/stz decompress $(EXAMPLE).stz -o $(EXAMPLE).back -f
	cmp $(EXAMPLE) $(EXAMPLE).back && echo "lossless round trip: identical bytes"
	@rm -f $(EXAMPLE).back
	@rm -rf $(BUILD)/example/tiny-hf
	$(BUILD)/stz synth tiny --shards 1 -o $(BUILD)/example/tiny-hf -q
	$(BUILD)/stz gguf $(BUILD)/example/tiny-hf --like q4_k_m -o $(BUILD)/example/tiny.gguf -f | tail -4

# The Python package in a venv over Debian's numpy, installed offline; its
# wheel carries this build's libstz.so.0. Then: .venv/bin/python -c 'import stz'
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || echo python3)
VENV ?= .venv
python: build
	$(PYTHON) -m venv --system-site-packages $(VENV)
	STZ_LIBRARY=$(BUILD)/libstz.so.0 $(VENV)/bin/pip install --no-index -q --force-reinstall --no-deps ./python
	$(VENV)/bin/python -c "import stz; print('stz for Python:', stz.__file__)"

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# make install PREFIX=/opt/stz (default /usr/local; DESTDIR is honoured).
PREFIX ?= /usr/local
install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# (with allocations that fail on request: the oom test runs every other one)
# -O1: the same checks in under half of -O0's time (docs/TESTING.md)
ASAN_CMAKE = -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DSTZ_SANITIZE=ON -DSTZ_FAILMALLOC=ON

asan:
	cmake -S . -B $(BUILD)-asan $(ASAN_CMAKE) >/dev/null
	cmake --build $(BUILD)-asan -j $(JOBS)
	ctest --test-dir $(BUILD)-asan --output-on-failure -j $(JOBS)

# Allocation-failure testing for every allocation of the main commands.
oom:
	cmake -S . -B $(BUILD)-asan $(ASAN_CMAKE) >/dev/null
	cmake --build $(BUILD)-asan -j $(JOBS) --target stz_cli
	STZ_OOM_STEP=1 ctest --test-dir $(BUILD)-asan --output-on-failure -R '^oom$$'

# ThreadSanitizer over the C tests that run threads (not in CI: slow).
tsan:
	cmake -S . -B $(BUILD)-tsan -DCMAKE_BUILD_TYPE=Debug -DSTZ_TSAN=ON >/dev/null
	cmake --build $(BUILD)-tsan -j $(JOBS)
	ctest --test-dir $(BUILD)-tsan --output-on-failure -j $(JOBS) -R '^test_(quant|pipeline|pack|svd|qformat)$$'

bench: build
	sh bench/bench_pack.sh $(BUILD)
	sh bench/bench_unpack.sh $(BUILD)
	sh bench/bench_quant.sh $(BUILD)
	sh bench/bench_svd.sh $(BUILD)
	sh bench/bench_pipeline.sh $(BUILD)
	sh bench/bench_forward.sh $(BUILD)
	sh bench/bench_quant_methods.sh $(BUILD)
	sh bench/bench_python.sh $(BUILD)
	sh bench/bench_export.sh $(BUILD)
	sh bench/bench_corpus.sh $(BUILD)
	sh bench/bench_tune.sh $(BUILD)
	sh bench/bench_shards.sh $(BUILD)

fuzz:
	CC=clang cmake -S . -B $(BUILD)-fuzz -DCMAKE_BUILD_TYPE=Debug -DSTZ_FUZZ=ON >/dev/null
	cmake --build $(BUILD)-fuzz -j $(JOBS)

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-tsan $(BUILD)-fuzz $(VENV)
