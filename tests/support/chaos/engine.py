"""The chaos fake engine: each request draws its behaviour at random (seeded) and is recorded.

The draw is weighted by route kind (inference or verbatim); ``refuse`` also stops listening
for ``refuseFor`` seconds so new connections are refused.

Each request is recorded as it is read, before it is answered, with what the kernel knows of
it (``socketFacts``): under CPU starvation the engines read requests late and out of the
order the proxy sent them, and the oracle orders attempts by those facts, not by the read.
"""

from __future__ import annotations

import random
import socket
import struct
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, ISystemHandle

from nvpair.proxy.testing.fakeengine import (
    Answer,
    Behaviour,
    DieMidStream,
    Drop,
    FakeEngine,
    HangAfterHeaders,
    SlowFirstByte,
    Status,
)
from tests.support.chaos.records import ChaosConfig, Ledger
from tests.support.harness import CANARY

CHAOS_HEADER = "x-chaos-id"
STATUS_BODY = b'{"error":"fake engine busy ' + CANARY.encode() + b'"}'
INFERENCE_WEIGHTS = {
    "answer": 40,
    "s503": 10,
    "s429": 7,
    "hang": 4,
    "slow": 10,
    "slowlong": 3,
    "die": 9,
    "drop": 8,
    "refuse": 9,
}
VERBATIM_WEIGHTS = {
    "answer": 50,
    "s503": 12,
    "s429": 8,
    "slow": 10,
    "die": 8,
    "drop": 6,
    "refuse": 6,
}


_ESTABLISHED = 1  # tcpi_state of a connection neither side has reset or closed
_LAST_DATA_RECV = 52  # offset of tcpi_last_data_recv (ms since data last arrived) in tcp_info


def socketFacts(transport: Any, now: float) -> tuple[float | None, bool]:
    """When the last bytes reached the connection's socket (``now`` minus the kernel's
    ``tcpi_last_data_recv``, a few milliseconds coarse), and whether the peer had already
    reset or closed the connection; ``(None, False)`` when the socket cannot tell."""
    handle = ISystemHandle(transport, None)
    sock = handle.getHandle() if handle is not None else None
    if not isinstance(sock, socket.socket):
        return None, False
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    except OSError:
        return None, False
    if len(info) < _LAST_DATA_RECV + 4:
        return None, False
    (sinceMs,) = struct.unpack_from("I", info, _LAST_DATA_RECV)
    return now - sinceMs / 1000.0, info[0] != _ESTABLISHED


class ChaosEngine(FakeEngine):
    """A fake engine whose every request draws its behaviour at random and records it."""

    def __init__(self, reactor: Any, ledger: Ledger, config: ChaosConfig, **kw: Any) -> None:
        super().__init__(reactor, record=False, **kw)
        self.ledger = ledger
        self.config = config
        self.refusing = False
        self.refusals = 0
        self._relisten: IDelayedCall | None = None
        self._closed = False

    def requestReceived(
        self, proto: Any, method: bytes, target: bytes, headers: dict[str, list[str]], body: bytes
    ) -> None:
        path = target.split(b"?", 1)[0]
        ids = headers.get(CHAOS_HEADER)
        if (method == b"GET" and path in self.lists) or not ids:
            super().requestReceived(proto, method, target, headers, body)
            return
        chaosId = ids[0]
        inference = self.routes.get(path) is not None and method == b"POST"
        seen = sum(1 for a in self.ledger.byId.get(chaosId, ()) if a.engine == self.name)
        rng = random.Random(f"{self.config.seed}:{chaosId}:{self.name}:{seen}")
        weights = INFERENCE_WEIGHTS if inference else VERBATIM_WEIGHTS
        label = rng.choices(list(weights), list(weights.values()))[0]
        now = self.clock.seconds()
        arrival, abandoned = socketFacts(proto.transport, now)
        self.ledger.record(chaosId, self.name, label, arrival, now, abandoned)
        if label == "refuse":
            self._refuse()
        self.behaviours[:] = [self._behaviour(label, rng)]
        super().requestReceived(proto, method, target, headers, body)

    def _behaviour(self, label: str, rng: random.Random) -> Behaviour:
        timeout = self.config.responseTimeout
        if label == "answer":
            return Answer(chunks=rng.randint(1, 6))
        if label == "s503":
            return Status(503, STATUS_BODY)
        if label == "s429":
            return Status(429, STATUS_BODY)
        if label == "hang":
            return HangAfterHeaders()
        if label == "slow":
            return SlowFirstByte(self.config.slowDelay)
        if label == "slowlong":
            # Later than the first-content cap even when the proxy reads the headers late
            # (its cap starts when it reads them): after the whole job deadline.
            return SlowFirstByte(timeout + self.config.jobDeadline)
        if label == "die":
            return DieMidStream(rng.randint(1, 2))
        return Drop()  # drop, refuse

    def _refuse(self) -> None:
        """Stop listening for a while (new connections are refused), then listen again."""
        if self.refusing or self._closed:
            return
        self.refusing = True
        self.refusals += 1
        port = self.port
        self.stopListening()

        def relisten(tries: int = 0) -> None:
            self._relisten = None
            if self._closed:
                return
            try:
                self.listen(port)
            except Exception:
                if tries < 50:
                    self._relisten = self.clock.callLater(0.05, relisten, tries + 1)
                return
            self.refusing = False

        self._relisten = self.clock.callLater(self.config.refuseFor, relisten)

    def close(self) -> defer.Deferred[None]:
        """Close, cancelling a pending re-listen."""
        self._closed = True
        if self._relisten is not None and self._relisten.active():
            self._relisten.cancel()
        return super().close()
