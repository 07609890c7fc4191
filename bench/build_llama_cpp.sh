#!/usr/bin/env bash
# Builds the llama.cpp peer binaries: llama-bench and llama-batched-bench for bench/llama_cpp_peer.sh,
# and llama-server for bench/serve_bench.sh (the HTTP serving peer of `corelm serve`).
# The source is the llama.cpp that llama-cpp-python==0.3.2 vendors: the same version the oracle
# tests already use (tests/requirements.txt), so both compare against one llama.cpp.
#   bench/build_llama_cpp.sh [build-root]     (default build/) -> <build-root>/llama.cpp/bin/
# Overrides from the environment:
#   LLAMA_CPP_VERSION=0.3.36   another llama-cpp-python sdist (a current llama.cpp, e.g. for the
#                              perplexity comparison); its build lands in <build-root>/llama.cpp-<version>/
#                              so it never replaces the pinned peer's binaries.
#   LLAMA_CPP_TOOLS="llama-perplexity"   which tools to build (default: the three above).
# Idempotent: the sdist download, the unpack and the cmake build each run only when their output
# is missing. Only `scripts/setup --bench` / `make bench` call it; the product and its tests never do.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
root="$(realpath -m "${1:-$here/build}")"
default_version=0.3.2
version="${LLAMA_CPP_VERSION:-$default_version}"
src_root="$root/llama.cpp-src"
build="$root/llama.cpp"
[[ $version == "$default_version" ]] || build="$root/llama.cpp-$version"
bin="$build/bin"
python="$here/.venv/bin/python"
[[ -x $python ]] || python=python3

read -r -a tools <<< "${LLAMA_CPP_TOOLS:-llama-bench llama-batched-bench llama-server}"
missing=()
for tool in "${tools[@]}"; do [[ -x $bin/$tool ]] || missing+=("$tool"); done
if (( ${#missing[@]} == 0 )); then
  echo "build_llama_cpp: already built in $bin"
  exit 0
fi

mkdir -p "$src_root"
sdist="$src_root/llama_cpp_python-$version.tar.gz"
if [[ ! -f $sdist ]]; then
  echo "build_llama_cpp: downloading the llama-cpp-python==$version sdist (vendors llama.cpp)"
  # Only llama-cpp-python itself as source: its build backend (scikit-build-core) may come as a
  # wheel, so pip does not compile the build tools just to read the sdist metadata.
  "$python" -m pip download -q --disable-pip-version-check --no-binary llama-cpp-python --no-deps \
    "llama-cpp-python==$version" -d "$src_root"
fi
[[ -f $sdist ]] || { echo "build_llama_cpp: expected $sdist after pip download" >&2; exit 1; }

unpacked="$src_root/llama_cpp_python-$version"
if [[ ! -f $unpacked/vendor/llama.cpp/CMakeLists.txt ]]; then
  echo "build_llama_cpp: unpacking $sdist"
  tar -xzf "$sdist" -C "$src_root"
fi
llama_src="$unpacked/vendor/llama.cpp"
[[ -f $llama_src/CMakeLists.txt ]] || { echo "build_llama_cpp: no vendor/llama.cpp in $sdist" >&2; exit 1; }

# CPU only, tuned for this machine (GGML_NATIVE), no BLAS or OpenMP (ggml's own threads, so -t 1 is
# one thread), only the three tools. The server is configured in (LLAMA_BUILD_SERVER=ON) but, like
# the other tools, only built when asked for by target; without curl it serves local files only.
# A compiler launcher from the environment (ccache) is passed on so a rebuild is cheap.
echo "build_llama_cpp: configuring $build"
cmake -S "$llama_src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_BLAS=OFF \
  -DGGML_OPENMP=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF \
  ${CMAKE_CXX_COMPILER_LAUNCHER:+-DCMAKE_CXX_COMPILER_LAUNCHER=$CMAKE_CXX_COMPILER_LAUNCHER} \
  ${CMAKE_CXX_COMPILER_LAUNCHER:+-DCMAKE_C_COMPILER_LAUNCHER=$CMAKE_CXX_COMPILER_LAUNCHER} \
  -DCMAKE_RUNTIME_OUTPUT_DIRECTORY="$bin" > "$root/llama.cpp-configure.log"
echo "build_llama_cpp: building ${missing[*]} (a few minutes on two cores)"
# llama.cpp's sources warn a lot under GCC 12; the full output goes to a log, shown on failure.
if ! cmake --build "$build" --target "${missing[@]}" -j "${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    > "$build/build.log" 2>&1; then
  tail -n 40 "$build/build.log" >&2
  echo "build_llama_cpp: build failed (full log: $build/build.log)" >&2
  exit 1
fi
for tool in "${tools[@]}"; do
  [[ -x $bin/$tool ]] || { echo "build_llama_cpp: $bin/$tool was not built" >&2; exit 1; }
done
echo "build_llama_cpp: built ${tools[*]} in $bin"
