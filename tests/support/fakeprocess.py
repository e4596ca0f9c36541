"""The fakes of the supervisor tests: a process reactor handing out in-memory process
transports, and the shared set-up of a ``ProxyProcess`` recording its callbacks."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
from twisted.internet.error import ProcessDone, ProcessExitedAlready, ProcessTerminated
from twisted.internet.interfaces import (
    IAddress,
    IProcessProtocol,
    IProcessTransport,
    IReactorProcess,
)
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from nvpair.proxy.broker import jsonrpc
from nvpair.supervisor.process import (
    ExitInfo,
    ProxyProcess,
)


@implementer(IAddress)
class ProcessAddress:
    """The address of a spawned process (it has none to speak of)."""


@implementer(IProcessTransport)
class FakeProcessTransport:
    """An in-memory process transport recording stdin writes, closes and signals."""

    def __init__(self, pid: int, protocol: IProcessProtocol) -> None:
        self.pid: int | None = pid
        self.protocol = protocol
        self.written: list[bytes] = []
        self.stdinClosed = False
        self.signals: list[str | int] = []

    def write(self, data: bytes) -> None:
        assert not self.stdinClosed, "write after closeStdin"
        self.written.append(data)

    def writeSequence(self, data: Iterable[bytes]) -> None:
        for chunk in data:
            self.write(chunk)

    def writeToChild(self, childFD: int, data: bytes) -> None:
        assert childFD == 0
        self.write(data)

    def loseConnection(self) -> None:
        self.closeStdin()

    def getPeer(self) -> ProcessAddress:
        return ProcessAddress()

    def getHost(self) -> ProcessAddress:
        return ProcessAddress()

    def closeStdin(self) -> None:
        self.stdinClosed = True

    def closeStdout(self) -> None:
        pass

    def closeStderr(self) -> None:
        pass

    def closeChildFD(self, descriptor: int) -> None:
        if descriptor == 0:
            self.closeStdin()

    def signalProcess(self, signalID: str | int) -> None:
        if self.pid is None:
            raise ProcessExitedAlready()
        self.signals.append(signalID)

    # test helpers

    def messages(self) -> list[dict[str, Any]]:
        """Everything written to stdin, one parsed JSON object per line."""
        data = b"".join(self.written)
        assert data == b"" or data.endswith(b"\n")
        return [json.loads(line) for line in data.splitlines()]

    def last(self) -> dict[str, Any]:
        return self.messages()[-1]

    def stdout(self, data: bytes) -> None:
        self.protocol.childDataReceived(1, data)

    def stderr(self, data: bytes) -> None:
        self.protocol.childDataReceived(2, data)

    def send(self, message: dict[str, Any]) -> None:
        self.stdout(jsonrpc.encode(message))

    def answer(self, value: object = None, id: int | None = None) -> None:
        """Answer request ``id`` (default: the last message written) with ``value``."""
        self.send(jsonrpc.result(self.last()["id"] if id is None else id, value))

    def end(self, exitCode: int | None = 0, signal: int | None = None) -> None:
        self.pid = None
        reason: Exception
        if exitCode == 0 and signal is None:
            reason = ProcessDone(0)
        else:
            reason = ProcessTerminated(exitCode, signal)
        self.protocol.processEnded(Failure(reason))


@attrs.define
class Spawn:
    protocol: IProcessProtocol
    executable: str
    args: list[str]
    env: Mapping[str, str] | None
    path: str | None
    transport: FakeProcessTransport


@implementer(IReactorProcess)
class ProcessReactor(MemoryReactorClock):
    """A MemoryReactorClock whose spawnProcess hands out FakeProcessTransports."""

    def __init__(self) -> None:
        super().__init__()
        self.spawned: list[Spawn] = []

    def spawnProcess(
        self,
        processProtocol: IProcessProtocol,
        executable: bytes | str,
        args: Sequence[bytes | str] = (),
        env: Mapping[Any, Any] | None = None,
        path: bytes | str | None = None,
        uid: int | None = None,
        gid: int | None = None,
        usePTY: bool = False,
        childFDs: Mapping[int, int | str] | None = None,
    ) -> FakeProcessTransport:
        transport = FakeProcessTransport(1000 + len(self.spawned), processProtocol)
        self.spawned.append(
            Spawn(
                processProtocol,
                str(executable),
                [str(a) for a in args],
                env,
                None if path is None else str(path),
                transport,
            )
        )
        processProtocol.makeConnection(transport)
        return transport

    @property
    def transport(self) -> FakeProcessTransport:
        return self.spawned[-1].transport


class Harness(SynchronousTestCase):
    """Shared set-up: a fake reactor and a ProxyProcess recording its callbacks."""

    def setUp(self) -> None:
        self.reactor = ProcessReactor()
        self.logs: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.crashes: list[ExitInfo] = []

    def make(self, **kwargs: Any) -> ProxyProcess:
        kwargs.setdefault("onLog", self.logs.append)
        kwargs.setdefault("onProtocolError", self.errors.append)
        kwargs.setdefault("onCrash", self.crashes.append)
        return ProxyProcess(self.reactor, ["--state-dir", "/s"], **kwargs)

    def started(self, **kwargs: Any) -> tuple[ProxyProcess, FakeProcessTransport]:
        proxy = self.make(**kwargs)
        d = proxy.start()
        self.reactor.transport.answer({})
        self.successResultOf(d)
        return proxy, self.reactor.transport
