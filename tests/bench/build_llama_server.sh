#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` for tests/bench/serve.py, OUTSIDE the project.
#
# The source is the llama.cpp that the llama-cpp-python sdist vendors (vendor/llama.cpp),
# fetched from PyPI with pip; nothing of llama.cpp is committed here.
#
#   tests/bench/build_llama_server.sh            # default version, default dir
#   LLAMA_CPP_PYTHON_VERSION=0.3.36 MAXFX_BENCH_DIR=/tmp/bench tests/bench/build_llama_server.sh
#
# Prints the binary's path on its last line; tests/bench/serve.py looks for it at
# $MAXFX_BENCH_DIR/llama-cpp-python-$VERSION/vendor/llama.cpp/build/bin/llama-server
# (or takes --llama-server PATH / $LLAMA_SERVER).
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
BENCH_DIR="${MAXFX_BENCH_DIR:-$HOME/.cache/maxfx-bench}"
JOBS="${JOBS:-2}"
PIP="${PIP:-$(cd "$(dirname "$0")/../.." && pwd)/.venv/bin/pip}"
[ -x "$PIP" ] || PIP="python3 -m pip"

mkdir -p "$BENCH_DIR"
cd "$BENCH_DIR"
SRC="llama-cpp-python-$VERSION"
if [ ! -d "$SRC/vendor/llama.cpp" ]; then
    # --no-build-isolation is irrelevant here: pip only downloads, it builds nothing.
    $PIP download --no-binary :all: --no-deps --dest . "llama-cpp-python==$VERSION"
    tar xzf "llama_cpp_python-$VERSION.tar.gz" 2>/dev/null || tar xzf "llama-cpp-python-$VERSION.tar.gz"
    [ -d "$SRC" ] || mv "llama_cpp_python-$VERSION" "$SRC"
fi

cd "$SRC/vendor/llama.cpp"
# CURL off: the benchmark loads a local GGUF; native: the same CPU flags maxfx's XLA uses.
cmake -S . -B build -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
cmake --build build --target llama-server -j "$JOBS"
echo "$PWD/build/bin/llama-server"
