"""The fleet file cannot freeze or shrink the fleet, against the real process (issue 32,
item 6): a named pipe at its path is refused at start, by ``--check-fleet`` and on a reload
(the facades keep serving); a reload never applies a file still being written."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import treq
from twisted.internet import defer, reactor
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

from tests.support.cases.command import COMMAND, TWISTD
from tests.support.cases.fleettext import backend
from tests.support.cases.requestcase import PLAIN, asyncTest
from tests.support.harness import startEngine
from tests.support.kitprocess import killAtCleanup
from tests.support.standaloneharness import StandaloneProxy, backendUp

BOUND = 20.0  # seconds a refusal may take; main waited on the pipe until killed


class _Collect(ProcessProtocol):
    """Collects stdout and stderr; ``ended`` fires with the exit code."""

    def __init__(self) -> None:
        self.out = b""
        self.err = b""
        self.ended: defer.Deferred[Any] = defer.Deferred()

    def outReceived(self, data: bytes) -> None:
        self.out += data

    def errReceived(self, data: bytes) -> None:
        self.err += data

    def processEnded(self, reason: Failure) -> None:
        self.ended.callback(getattr(reason.value, "exitCode", None))


class FleetSafetyTests(TestCase):
    """A fleet file that is a pipe, or one caught half-written."""

    timeout = 120

    def fleetFile(self, text: str) -> str:
        fd, path = tempfile.mkstemp(suffix=".toml")
        os.write(fd, text.encode())
        os.close(fd)
        self.addCleanup(os.remove, path)
        return path

    def pipe(self) -> str:
        path = os.path.join(tempfile.mkdtemp(prefix="nvpair-fifo-"), "fleet.toml")
        os.mkfifo(path)
        self.addCleanup(os.rmdir, os.path.dirname(path))
        self.addCleanup(os.remove, path)
        return path

    async def bounded(self, executable: str, args: list[str]) -> tuple[Any, bytes, bytes]:
        """(exit code, stdout, stderr) of a command, killed if it runs past ``BOUND``."""
        proto = _Collect()
        process = reactor.spawnProcess(
            proto, executable, [executable, *args], env=dict(os.environ), path=tempfile.gettempdir()
        )
        killAtCleanup(self, process, proto.ended)
        killer = reactor.callLater(BOUND, process.signalProcess, "KILL")
        code = await proto.ended
        if killer.active():
            killer.cancel()
        return code, proto.out, proto.err

    @asyncTest
    async def test_pipeAtStart(self) -> None:
        """``--fleet`` and ``--check-fleet`` naming a named pipe exit 2 at once with one
        line saying it is not a regular file; nothing is written on stdout."""
        fifo = self.pipe()
        start = ["-n", "--pidfile=", "nvpair-proxy", "--standalone", "--fleet", fifo]
        for executable, args, option in (
            (TWISTD, start, "--fleet"),
            (COMMAND, ["--check-fleet", fifo], "--check-fleet"),
        ):
            code, out, err = await self.bounded(executable, args)
            self.assertEqual((code, out), (2, b""), err)
            self.assertEqual(
                err.decode().splitlines(),
                [f"nvpair-proxy: {option}: {fifo}: cannot read: not a regular file (a named pipe)"],
            )

    async def running(self, text: str) -> tuple[StandaloneProxy, str]:
        path = self.fleetFile(text)
        proxy = StandaloneProxy(self, reactor, ("llamacpp",), fleet=path)
        await proxy.start()
        return proxy, path

    async def chat(self, proxy: StandaloneProxy) -> tuple[int, str]:
        response = await treq.post(
            proxy.url("llamacpp") + "/v1/chat/completions", json=PLAIN, persistent=False
        ).addTimeout(10, reactor)
        await response.content()
        return response.code, response.headers.getRawHeaders("x-nvpair-node", [""])[0]

    @asyncTest
    async def test_pipeOnReload(self) -> None:
        """The file replaced by a named pipe, then SIGHUP: the reload is refused with its
        reason, the fleet is kept and the facade keeps answering."""
        a = startEngine(self, reactor, "openai", ["m1"], name="A")
        proxy, path = await self.running(backend(a.url))
        await proxy.waitForLog(backendUp(a.url))
        os.remove(path)
        os.mkfifo(path)
        proxy.signal("HUP")
        refused = await proxy.waitForLog(lambda r: r.get("event") == "fleet-invalid")
        self.assertEqual(
            refused["problem"], f"{path}: cannot read: not a regular file (a named pipe)"
        )
        self.assertEqual(await self.chat(proxy), (200, a.url))

    @asyncTest
    async def test_slowWriter(self) -> None:
        """A writer truncates the file, writes one backend of two (valid TOML) and SIGHUP
        comes: the reload waits for the file to be quiet, so once the writer is done the
        fleet is read whole and unchanged; the second backend is never dropped."""
        a = startEngine(self, reactor, "openai", ["m1"], name="A")
        b = startEngine(self, reactor, "openai", ["m1"], name="B")
        whole = backend(a.url) + backend(b.url)
        proxy, path = await self.running(whole)
        await proxy.waitForLog(backendUp(b.url))
        with open(path, "w") as writer:
            writer.write(backend(a.url))
            writer.flush()
            proxy.signal("HUP")
            first = await proxy.waitForLog(
                lambda r: (
                    r.get("event") in ("fleet-reload-waiting", "fleet-loaded")
                    and r.get("trigger") == "signal"
                )
            )
            self.assertEqual(first["event"], "fleet-reload-waiting", first)
            writer.write(backend(b.url))
        done = await proxy.waitForLog(
            lambda r: (
                r.get("event") in ("fleet-unchanged", "fleet-loaded", "fleet-invalid")
                and r.get("trigger") != "start"
            )
        )
        self.assertEqual((done["event"], done["trigger"]), ("fleet-unchanged", "signal"))
        self.assertEqual(proxy.events("fleet-loaded")[1:], [])  # only the start's
        nodes = {(await self.chat(proxy))[1] for _ in range(4)}
        self.assertLessEqual(nodes, {a.url, b.url})
