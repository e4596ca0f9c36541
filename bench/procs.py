"""Processes the benchmark starts (fake engine, nginx, the proxy) and what it reads from them.

Every process started here is registered and ended by its own pid (SIGTERM, then SIGKILL
after a grace period) when the benchmark stops, however it stops.  All servers listen on
127.0.0.1 only.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

from nvpair.proxy.engines import ENGINES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = os.path.join(ROOT, ".venv", "bin", "python")
CLK_TCK = os.sysconf("SC_CLK_TCK")

_started: list[subprocess.Popen[bytes]] = []


def _cleanup() -> None:
    for proc in reversed(_started):
        stop(proc)


def _onSignal(signum: int, frame: Any) -> None:
    _cleanup()
    sys.exit(128 + signum)


atexit.register(_cleanup)
signal.signal(signal.SIGTERM, _onSignal)
signal.signal(signal.SIGHUP, _onSignal)


def spawn(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """Start a process and register it for cleanup."""
    proc = subprocess.Popen(argv, cwd=kwargs.pop("cwd", ROOT), **kwargs)
    _started.append(proc)
    return proc


def stop(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """End one process we started: SIGTERM, then SIGKILL after ``grace`` seconds."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        except ProcessLookupError:
            pass
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    if proc in _started:
        _started.remove(proc)


def freePort() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def readJSONLine(proc: subprocess.Popen[bytes], what: str, timeout: float) -> dict[str, Any]:
    """The first line ``proc`` writes on stdout, as JSON (its ready line), within ``timeout``."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    os.set_blocking(proc.stdout.fileno(), False)
    buf = b""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before announcing its port")
        chunk = proc.stdout.read()
        if chunk:
            buf += chunk
            if b"\n" in buf:
                os.set_blocking(proc.stdout.fileno(), True)
                return dict(json.loads(buf.split(b"\n", 1)[0]))
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not announce its port within {timeout:.0f}s")


class Server:
    """A started server: the process to account (``pid``), its port, and what to stop."""

    def __init__(self, name: str, port: int, pid: int, procs: list[subprocess.Popen[bytes]]):
        self.name = name
        self.port = port
        self.pid = pid
        self.procs = procs
        self.engineKind = ""
        self.extraEvents = 0
        self.extraPids: dict[str, int] = {}

    def close(self) -> None:
        """Stop every process of this server, last started first."""
        for proc in reversed(self.procs):
            stop(proc)


# The benchmark's engine: the Node fake engine of the shared bench folder (~65k req/s on this
# kind of machine, so it never limits nginx), or nvpair.proxy.testing.fakeengine where Node or
# the file is missing (it caps nginx near 26k req/s: ratios against nginx then flatter the proxy).
NODE_ENGINE = os.environ.get(
    "BENCH_ENGINE_JS", os.path.join(os.path.dirname(ROOT), "shared", "bench", "fake_engine.js")
)
MODEL = "bench"  # the one model both engines answer for and list


def startEngine(chunks: int, chunkDelay: float = 0.0) -> Server:
    """The fake OpenAI-dialect engine serving model ``bench`` on a free port.

    ``server.extraEvents`` is how many SSE events a stream carries besides its ``chunks``.
    """
    node = shutil.which("node")
    if node and os.path.isfile(NODE_ENGINE):
        port = freePort()
        env = dict(
            os.environ,
            HOST="127.0.0.1",
            PORT=str(port),
            FAKE_CHUNKS=str(chunks),
            FAKE_DELAY_MS=str(int(chunkDelay * 1000)),
        )
        proc = spawn([node, NODE_ENGINE], env=env, stdout=subprocess.DEVNULL)
        waitForPort(port, "node fake engine", proc)
        server = Server("direct", port, proc.pid, [proc])
        server.engineKind, server.extraEvents = "node", 1  # [DONE]
        return server
    missing = "node" if node is None else NODE_ENGINE
    print(
        f"bench: {missing} not found: the Python fake engine serves instead (slower, and its"
        " figures are not comparable with the Node engine's; BENCH_ENGINE_JS names the file)",
        file=sys.stderr,
    )
    proc = spawn(
        [
            PYTHON,
            "-m",
            "nvpair.proxy.testing.fakeengine",
            "--port",
            "0",
            "--dialect",
            "openai",
            "--models",
            MODEL,
            "--chunks",
            str(chunks),
            "--chunk-delay",
            str(chunkDelay),
        ],
        stdout=subprocess.PIPE,
    )
    port = int(readJSONLine(proc, "fake engine", 30)["port"])
    server = Server("direct", port, proc.pid, [proc])
    server.engineKind, server.extraEvents = "python", 2  # the usage event and [DONE]
    return server


NGINX_CONF = """\
daemon off;
master_process off;
worker_processes 1;
worker_rlimit_nofile {nofile};
pid {out}/nginx.pid;
error_log {out}/nginx-error.log warn;
events {{ worker_connections {conns}; }}
http {{
    access_log off;
    client_body_temp_path {out}/tmp/client;
    proxy_temp_path {out}/tmp/proxy;
    fastcgi_temp_path {out}/tmp/fastcgi;
    uwsgi_temp_path {out}/tmp/uwsgi;
    scgi_temp_path {out}/tmp/scgi;
    keepalive_requests 10000000;
    upstream engine {{
{servers}
        keepalive 256;
        keepalive_requests 10000000;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 300s;
        }}
    }}
}}
"""


def nginxBinary() -> str | None:
    """The nginx executable, if installed."""
    return shutil.which("nginx") or (
        "/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None
    )


def startNginx(enginePort: int | list[int], outDir: str, nofile: int) -> Server:
    """nginx in the foreground, one process, its own config and temp dirs under ``outDir``;
    several engine ports are balanced round robin (nginx's default)."""
    binary = nginxBinary()
    if binary is None:
        raise RuntimeError("nginx is not installed")
    port = freePort()
    ports = enginePort if isinstance(enginePort, list) else [enginePort]
    servers = "\n".join(f"        server 127.0.0.1:{p};" for p in ports)
    base = tempfile.mkdtemp(prefix="nginx-", dir=outDir)
    os.makedirs(os.path.join(base, "tmp"), exist_ok=True)
    conf = os.path.join(base, "nginx.conf")
    with open(conf, "w") as f:
        f.write(
            NGINX_CONF.format(
                out=base, servers=servers, port=port, nofile=nofile, conns=max(1024, nofile - 64)
            )
        )
    proc = spawn([binary, "-e", os.path.join(base, "nginx-error.log"), "-p", base, "-c", conf])
    waitForPort(port, "nginx", proc)
    return Server("nginx", port, proc.pid, [proc])


def startProxyBroker(enginePort: int, maxConnections: int) -> Server:
    """The proxy under a scripted broker (``bench.brokerhost``): one facade, one node."""
    state = tempfile.mkdtemp(prefix="nvpair-bench-state-")
    port = freePort()
    proc = spawn(
        [
            PYTHON,
            "-m",
            "bench.brokerhost",
            "--engine-port",
            str(enginePort),
            "--facade-port",
            str(port),
            "--state-dir",
            state,
            "--max-connections",
            str(maxConnections),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    info = readJSONLine(proc, "scripted broker", 60)
    server = Server("nvpair", int(info["port"]), int(info["pid"]), [proc])
    server.extraPids["broker"] = proc.pid
    waitForRoute(server.port)
    return server


# BENCH_PUBLIC_WRITES=1 runs the proxy with ``fastwrite.DIRECT`` off (every write through
# the transport's public ``write``): the B side of the A/B that justifies that module.
_PUBLIC_WRITES = (
    "import sys, nvpair.proxy.http.fastwrite as f; f.DIRECT = False; sys.argv[0] = 'twistd'; "
    "from twisted.scripts.twistd import run; run()"
)


def twistdCommand() -> list[str]:
    """The argv that starts ``twistd`` from the project's venv (see BENCH_PUBLIC_WRITES)."""
    if os.environ.get("BENCH_PUBLIC_WRITES") == "1":
        return [PYTHON, "-c", _PUBLIC_WRITES]
    return [PYTHON, os.path.join(ROOT, ".venv", "bin", "twistd")]


def standaloneState(engine: str = "llamacpp") -> tuple[str, int]:
    """A temp state dir holding a persisted facade port for ``engine``: (dir, port)."""
    state = tempfile.mkdtemp(prefix="nvpair-bench-state-")
    port = freePort()
    with open(os.path.join(state, ENGINES[engine].portFile), "w") as f:
        json.dump({"port": port}, f)
    return state, port


def standaloneArgv(
    backends: list[str], state: str, *options: str, opsPort: int = 0, engine: str = "llamacpp"
) -> list[str]:
    """The argv of ``twistd`` running the proxy in ``--standalone`` mode (its ``engine``
    facade) over ``backends`` (URLs), its state in ``state``, ``options`` added."""
    return [
        *twistdCommand(),
        "--reactor=nvpair",
        "-n",
        "--pidfile=",
        "nvpair-proxy",
        "--standalone",
        "--engines",
        engine,
        *(f"--backend={engine}={url}" for url in backends),
        "--state-dir",
        state,
        "--ops-port",
        str(opsPort),
        *options,
    ]


def spawnStandalone(
    backends: list[str], *options: str, opsPort: int = 0, engine: str = "llamacpp"
) -> Server:
    """The proxy in ``--standalone`` mode (its ``engine`` facade, llama.cpp by default) over
    ``backends`` (URLs), with ``options`` added, a persisted facade port in a temp state
    dir, the operations listener on ``opsPort`` (0: any); returned once the facade listens."""
    state, port = standaloneState(engine)
    argv = standaloneArgv(backends, state, *options, opsPort=opsPort, engine=engine)
    proc = spawn(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=state,
    )
    waitForPort(port, "standalone proxy", proc)
    return Server("nvpair", port, proc.pid, [proc])


def waitForFleet(
    server: Server, opsPort: int, n: int, timeout: float = 30, engine: str = "llamacpp"
) -> None:
    """Wait until the standalone proxy's ``/status`` shows ``n`` nodes of its ``engine``
    facade that each list a model."""
    (proc,) = server.procs
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the proxy exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{opsPort}/status", timeout=5) as r:
                doc = json.loads(r.read())
            nodes = doc["facades"][engine]["nodes"]
            if len(nodes) == n and all(node["models"] for node in nodes):
                return
        except (OSError, KeyError, ValueError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the proxy did not see {n} engines with models within {timeout:.0f}s")


def startProxyStandalone(enginePort: int, maxConnections: int) -> Server:
    """The standalone proxy over the one engine, once a chat completion passes."""
    server = spawnStandalone(
        [f"http://127.0.0.1:{enginePort}"], "--max-connections", str(maxConnections)
    )
    waitForRoute(server.port)
    return server


def waitForPort(port: int, what: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """Wait until something accepts on 127.0.0.1:port."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout:.0f}s")


CHAT = b'{"model":"bench","messages":[{"role":"user","content":"hi"}]}'


def post(port: int, body: bytes = CHAT, timeout: float = 10) -> tuple[int, dict[str, str]]:
    """One chat completion; returns the status and headers (body read and dropped)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers)


def waitForRoute(port: int, timeout: float = 30) -> None:
    """Wait until a chat completion through ``port`` answers 200 (the route is known)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            status, _ = post(port, timeout=5)
            if status == 200:
                return
            last = status
        except OSError as e:
            last = e
        time.sleep(0.2)
    raise RuntimeError(f"no 200 through port {port} within {timeout:.0f}s (last: {last})")


def cpuSeconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rssKiB(pid: int) -> int:
    """Current resident set size of a process, in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def openFds(pid: int) -> int:
    """How many file descriptors a process has open."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1
