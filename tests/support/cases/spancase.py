"""The spans' unit case: a context with a tracer on a Clock and two owners of ``m1``, and a
client's trace context and request body (holding a secret no span may carry)."""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from nvpair.proxy.testing.fakecontext import FakeContext
from tests.support.fakerequest import FakeRequest
from tests.support.fakeupstream import makeFacade, node, startExchange
from tests.tracing.spankit import SpanCapture

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


CLIENT_SPAN = "00f067aa0ba902b7"


TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01".encode()


SECRET = "do-not-trace-this-prompt"


BODY = b'{"model":"m1","stream":true,"messages":[{"role":"user","content":"%s"}]}' % (
    SECRET.encode()
)


def parentOf(header: bytes) -> tuple[str, str, str]:
    """(trace id, span id, flags) of a ``traceparent`` value."""
    version, traceId, spanId, flags = header.decode().split("-")
    return traceId, spanId, flags


class SpanCase(SynchronousTestCase):
    """A context with a tracer on a Clock, two owners A and B of ``m1``."""

    settings: dict[str, Any] = {}

    def setUp(self) -> None:
        self.context = FakeContext(**self.settings)
        self.clock = self.context.clock
        self.capture = SpanCapture(self.clock)
        self.context.tracer = self.capture.tracer
        self.upstream = self.context.upstream
        self.facade = makeFacade(self.clock, [node("A"), node("B")])

    def start(self, headers: dict[bytes, list[bytes]] | None = None) -> FakeRequest:
        request = FakeRequest(headers=headers)
        startExchange(self.context, self.facade, request, body=BODY)
        return request
