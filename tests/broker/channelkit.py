"""Shared by the broker channel tests (``test_broker_requests``, ``test_broker_framing``,
``test_broker_output``): a scripted message handler, and ``ChannelCase``, a
``BrokerChannel`` over a ``StringTransport`` in front of that handler."""

from __future__ import annotations

from typing import Any

from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from nvpair.proxy.broker.channel import BrokerChannel
from nvpair.proxy.interfaces import IMessageHandler
from nvpair.proxy.testing.wire import drainLines, sendLine


@implementer(IMessageHandler)
class FakeHandler:
    """Records calls; answers from a script keyed by name."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, str, dict[str, Any]]] = []
        self.answers: dict[str, Any] = {}

    def handle(self, engine: str | None, name: str, params: dict[str, Any]) -> object:
        self.calls.append((engine, name, params))
        answer = self.answers.get(name, {"ok": True})
        if isinstance(answer, Exception):
            raise answer
        if callable(answer):
            return answer()
        return answer


class ChannelCase(SynchronousTestCase):
    """A ``BrokerChannel`` over a ``StringTransport`` with a fake handler."""

    def setUp(self) -> None:
        self.handler = FakeHandler()
        self.closed = 0
        self.channel = BrokerChannel(self.handler, self._closed)
        self.transport = StringTransport()
        self.channel.makeConnection(self.transport)

    def _closed(self) -> None:
        self.closed += 1

    def send(self, data: bytes | dict[str, Any]) -> None:
        sendLine(self.channel, data)

    def output(self) -> list[dict[str, Any]]:
        raw, messages = drainLines(self.transport)
        self.assertTrue(raw == b"" or raw.endswith(b"\n"))
        return messages

    def reports(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [m["params"] for m in messages if m.get("method") == "errors:report"]

    def assertOnlyProtocolReport(self) -> dict[str, Any]:
        out = self.output()
        self.assertEqual(len(out), 1, out)
        self.assertEqual(out[0]["method"], "errors:report")
        self.assertNotIn("id", out[0])
        params: dict[str, Any] = out[0]["params"]
        self.assertEqual(params["kind"], "protocol")
        return params
