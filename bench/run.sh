#!/usr/bin/env bash
# The benchmark in one command, from anywhere: bench/run.sh [--quick] [options of bench/run.py]
# Installs what it needs (wrk and nginx-light from Debian, matplotlib, py-spy, sglang-router
# and vllm-router into bench/.venv), raises the fd limit, runs `python -m bench.run` with the project's venv and
# ends it (by its pid) if this script is interrupted.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

missing=()
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
command -v ss >/dev/null 2>&1 || missing+=(iproute2)
if [ ${#missing[@]} -gt 0 ]; then
  echo "bench: installing ${missing[*]} from Debian's packages" >&2
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null || {
    # nginx-light is not in every release; plain nginx serves as well
    missing=("${missing[@]/nginx-light/nginx}")
    apt-get install -y -qq "${missing[@]}" >/dev/null
  }
fi

if [ ! -x bench/.venv/bin/py-spy ] || ! bench/.venv/bin/python -c 'import matplotlib' 2>/dev/null; then
  echo "bench: creating bench/.venv (matplotlib, py-spy)" >&2
  python3 -m venv bench/.venv
  bench/.venv/bin/pip install -q --disable-pip-version-check matplotlib py-spy
fi
# The Rust routers measured beside nginx (bench/peers.py) and by bench.routing: binary wheels
if [ ! -x bench/.venv/bin/sglang-router ] || [ ! -x bench/.venv/bin/vllm-router ]; then
  echo "bench: installing sglang-router and vllm-router into bench/.venv" >&2
  bench/.venv/bin/pip install -q --disable-pip-version-check --only-binary=:all: \
    sglang-router vllm-router || echo "bench: the Rust routers are not installed: skipped" >&2
fi

ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

export BENCH_COMMAND="bench/run.sh $*"
.venv/bin/python -m bench.run "$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null || true; wait "$child" 2>/dev/null || true' EXIT INT TERM
status=0
wait "$child" || status=$?
trap - EXIT INT TERM
exit $status
