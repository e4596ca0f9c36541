"""Bytes after a complete facade request (issue 26, the server side): whatever follows, in
the same read or later ones, never alters the request already read; pipelined requests are
still served in order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from nvpair.proxy.http.interfaces import IDoor, IServerRequest
from tests.http.httpkit import GET, Connection, Door, post

# What the door sees of a request when it is handed over.
Seen = tuple[bytes, bytes, bytes, list[tuple[bytes, list[bytes]]], bytes | None, bool, bool]


@implementer(IDoor)
class SnapshotDoor(Door):
    """Holds every request unanswered and records what each looked like when handed over."""

    def __init__(self) -> None:
        super().__init__(hold=True)
        self.seen: list[Seen] = []

    def handle(self, request: IServerRequest) -> None:
        super().handle(request)
        self.seen.append(snapshot(request))


def snapshot(request: IServerRequest) -> Seen:
    """What a request holds now."""
    content = None if request.content is None else request.content.getvalue()
    headers = [(name, list(values)) for name, values in request.requestHeaders.getAllRawHeaders()]
    return (
        request.method,
        request.uri,
        request.clientproto,
        headers,
        content,
        request.tooLarge,
        request.persistent,
    )


def cut(raw: bytes, points: list[int]) -> list[bytes]:
    """``raw`` cut at ``points`` (positions taken modulo its length + 1), in order."""
    at = sorted({p % (len(raw) + 1) for p in points})
    edges = [0, *at, len(raw)]
    return [raw[a:b] for a, b in zip(edges, edges[1:], strict=False) if b > a]


def seenBy(reads: list[bytes]) -> SnapshotDoor:
    """A new facade connection fed ``reads``; its door."""
    door = SnapshotDoor()
    conn = Connection(door)
    for read in reads:
        conn.channel.dataReceived(read)
    return door


_TOKEN = st.sampled_from([b"X-A", b"Accept", b"User-Agent", b"X-Trace", b"Authorization"])
_VALUE = st.from_regex(rb"\A[!-~]([ -~]{0,20}[!-~])?\Z")


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """A valid request: any method, target, fields, a Content-Length or chunked body (or
    none), HTTP/1.1 or 1.0, kept alive or not, offering an upgrade or not."""
    method = draw(st.sampled_from([b"GET", b"POST", b"PUT", b"DELETE"]))
    target = b"/" + draw(st.from_regex(rb"\A[a-z0-9/]{0,12}(\?[a-z=&0-9]{0,8})?\Z"))
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0"]))
    head = b"%s %s %s\r\nHost: h\r\n" % (method, target, version)
    head += b"".join(b"%s: %s\r\n" % field for field in draw(st.lists(st.tuples(_TOKEN, _VALUE))))
    if draw(st.booleans()):
        head += b"Connection: close\r\n" if version == b"HTTP/1.1" else b""
    elif version == b"HTTP/1.0":
        head += b"Connection: keep-alive\r\n"
    elif draw(st.booleans()):
        head += b"Connection: Upgrade\r\nUpgrade: h2c\r\n"  # offered, never taken
    body = draw(st.binary(max_size=60))
    if method in (b"GET", b"DELETE") and not body:
        return head + b"\r\n"
    if version == b"HTTP/1.1" and draw(st.booleans()):
        pieces = cut(body, draw(st.lists(st.integers(0, 60), max_size=3)))
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
        return head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


_TAILS = st.one_of(
    st.binary(min_size=1, max_size=60),
    st.sampled_from([GET, post(b"{}"), b"\r\n", b"GET / HTTP/1.1\r\nHost: x\r\n", b"\x00"]),
)


class RequestEndTests(SynchronousTestCase):
    """Requests followed by bytes, at fixed points."""

    def test_pipelinedRequestsKeepTheirOwnParts(self) -> None:
        """A POST, then a GET in the same read: the POST's target, fields and body are its
        own, and the GET is queued behind it."""
        door = seenBy([post(b"abc", b"/first", b"X-A: 1\r\n") + GET])
        self.assertEqual(len(door.seen), 1)  # the GET waits for the POST's answer
        method, uri, _, headers, content, _, _ = door.seen[0]
        self.assertEqual((method, uri, content), (b"POST", b"/first", b"abc"))
        self.assertEqual(dict(headers)[b"X-A"], [b"1"])
        self.assertNotIn(b"X-a", dict(headers))

    def test_garbageAfterARequest(self) -> None:
        """A complete request, then bytes llhttp refuses: the request stands as it was."""
        alone = seenBy([post(b"abc")]).seen
        self.assertEqual(seenBy([post(b"abc") + b"\x00\x01 nonsense"]).seen, alone)


class RequestEndProperties(SynchronousTestCase):
    """Any valid request followed by any bytes, cut anywhere, reaches the door exactly."""

    @settings(max_examples=300, deadline=None)
    @given(requests(), _TAILS, st.lists(st.integers(0, 1 << 16), max_size=6))
    def test_bytesAfterNeverAlterTheRequest(
        self, raw: bytes, tail: bytes, points: list[int]
    ) -> None:
        """The request and its tail, cut at any points: the door gets first exactly what the
        request alone gives (method, target, version, fields, body, flags), and still holds
        it once every byte was read."""
        reference = seenBy([raw])
        alone = reference.seen
        self.assertEqual(len(alone), 1, raw)
        door = seenBy(cut(raw + tail, points))
        self.assertEqual(door.seen[:1], alone)
        self.assertEqual(snapshot(door.requests[0]), snapshot(reference.requests[0]))
