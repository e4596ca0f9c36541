"""What a client's trace headers become on the way to the engine (spec §9a, issue 32): a
valid ``tracestate`` of the trace we continue goes on, anything else is dropped; span names
stay short whatever the path."""

from __future__ import annotations

from tests.support.cases.spancase import BODY, CLIENT_TRACE, TRACEPARENT, SpanCase, parentOf
from tests.support.exchangecase import SSE
from tests.support.fakerequest import FakeRequest
from tests.support.fakeupstream import startExchange


class TracestateTests(SpanCase):
    """The ``tracestate`` the engine receives, by what the client sent."""

    def sent(self, headers: dict[bytes, list[bytes]]) -> tuple[list[bytes] | None, bytes]:
        """(tracestate, traceparent) of the attempt's request to the engine."""
        self.start(headers)
        call = self.upstream.last()
        response = call.respond(200)
        response.send(SSE)
        response.end()
        [traceparent] = call.headers.getRawHeaders(b"traceparent")
        return call.headers.getRawHeaders(b"tracestate"), traceparent

    def test_valid(self) -> None:
        """A valid one (two header lines) goes on with the client's trace, as one line."""
        state, parent = self.sent(
            {b"traceparent": [TRACEPARENT], b"tracestate": [b"rojo=00f067aa0ba902b7", b"congo=t61"]}
        )
        self.assertEqual(state, [b"rojo=00f067aa0ba902b7,congo=t61"])
        self.assertEqual(parentOf(parent)[0], CLIENT_TRACE)

    def test_invalidDropped(self) -> None:
        """Broken grammar, 8-bit bytes, a repeated key, 33 members or 513 characters: the
        trace is continued, the ``tracestate`` is not passed on at all."""
        for bad in (
            [b"no-equals"],
            [b"k=\x9b31m"],
            [b"k=v,k=w"],
            [b",".join(b"k%d=v" % i for i in range(33))],
            [b"a=" + b"v" * 254 + b",b=" + b"v" * 254],
        ):
            self.upstream.calls.clear()
            state, parent = self.sent({b"traceparent": [TRACEPARENT], b"tracestate": bad})
            self.assertIsNone(state, bad)
            self.assertEqual(parentOf(parent)[0], CLIENT_TRACE)

    def test_withoutTraceparent(self) -> None:
        """A ``tracestate`` with no (or an invalid) ``traceparent`` belongs to no trace we
        continue: dropped, and the engine gets our new trace."""
        for parent in (None, b"00-zz-bad-01"):
            self.upstream.calls.clear()
            headers = {b"tracestate": [b"vendor=abc"]}
            if parent is not None:
                headers[b"traceparent"] = [parent]
            state, sent = self.sent(headers)
            self.assertIsNone(state)
            self.assertNotEqual(parentOf(sent)[0], CLIENT_TRACE)


class SpanNameTests(SpanCase):
    """A span's name carries the path cut to 256 characters."""

    def test_longPath(self) -> None:
        """A 60 KiB path names the server span by its first 256 characters."""
        path = b"/v1/chat/completions/" + b"p" * 60_000
        request = FakeRequest(path=path)
        startExchange(self.context, self.facade, request, body=BODY)
        call = self.upstream.last()
        response = call.respond(200)
        response.send(SSE)
        response.end()
        server = self.capture.server()
        self.assertEqual(server.name, "POST " + path[:256].decode())
