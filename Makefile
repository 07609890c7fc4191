# Two entry points for a fresh Debian 12 machine: `make demo` and `make test`.
# Both install what is missing (scripts/setup) and build. Other targets are for developers.
JOBS ?= $(shell nproc)
CTEST_ARGS ?=

.PHONY: all build demo test test-asan asan bench clean setup setup-test

all: build

setup:
	scripts/setup

setup-test:
	scripts/setup --test

build: setup
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS)

demo: build
	scripts/demo

test: setup-test
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS)
	ctest --preset release -j $(JOBS) --timeout 900 $(CTEST_ARGS)

# The benchmark suite (docs/BENCHMARKS.md): installs the peers (oneDNN, matplotlib), builds, runs.
bench:
	scripts/setup --bench
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS)
	bench/run_all build/release

# The whole suite under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan: setup-test
	cmake --preset asan >/dev/null
	cmake --build --preset asan -j $(JOBS)
	ctest --preset asan -j $(JOBS) --timeout 1800 $(CTEST_ARGS)

clean:
	rm -rf build
