"""The server side of a facade connection: requests answered one at a time, in order.

``ServerChannel`` is one client connection.  Its ``RequestReader`` parses the bytes (llhttp)
and queues complete requests, and refusals, on the channel; queued requests go to the site's
door one at a time, in order.  llhttp cannot pause, so once the requests parsed ahead of the
answer in progress hold more than ``PIPELINE_HOLD`` bytes, the transport stops reading until
that answer ends (each read is at most 64 KiB, so what is held stays bounded).  A refusal is
answered in the engine's error shape when its turn comes, and closes the connection.
``Expect: 100-continue`` is answered once the request is next in line.

A client must send a whole head within ``headerReadTimeout`` of connecting or of its
previous answer, and must not leave a body idle for that long; otherwise it is cut.  No
deadline runs while a request is being answered.
"""

from __future__ import annotations

from collections import deque

from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from zope.interface import implementer

from nvpair.proxy.http.fastwrite import sendNow
from nvpair.proxy.http.interfaces import IServerChannel, IServerRequest, ISite, IStreamTransport
from nvpair.proxy.http.reader import STOPPED, RequestReader
from nvpair.proxy.http.refusal import Refusal
from nvpair.proxy.http.request import HTTP11, ServerRequest

_CLOSED = Failure(ConnectionDone())
PIPELINE_HOLD = 1 << 16
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


@implementer(IServerChannel)
class ServerChannel(Protocol):
    """One facade client connection: parses requests and serves them one at a time."""

    transport: IStreamTransport | None

    def __init__(self, site: ISite) -> None:
        self.site = site
        self._reader = RequestReader(self, site)
        # Complete requests waiting (with the bytes each holds), and the one answered.
        self._queue: deque[tuple[int, IServerRequest | Refusal]] = deque()
        self._current: IServerRequest | None = None
        self._ahead = 0
        self._serving = False
        self._answered = False
        self._closed = False
        self._paused = False
        # The read deadline is kept as a time; one timer per connection checks it and is
        # rescheduled only when it fires early, so arming it costs an attribute store.
        self._deadline: float | None = None
        self._timer: IDelayedCall | None = None

    # -- connection life --------------------------------------------------------------------

    def connectionMade(self) -> None:
        self._arm()

    def connectionLost(self, reason: Failure = _CLOSED) -> None:
        self._closed = True
        self._reader.stop()
        self._queue.clear()
        self._deadline = None
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None
        request, self._current = self._current, None
        if request is not None and not request.finished:
            request.connectionLost(reason)

    def _arm(self) -> None:
        timeout = self.site.headerReadTimeout
        if timeout > 0:
            clock = self.site.clock
            self._deadline = clock.seconds() + timeout
            if self._timer is None:
                self._timer = clock.callLater(timeout, self._checkDeadline)

    def _checkDeadline(self) -> None:
        self._timer = None
        deadline = self._deadline
        if deadline is None:
            return  # disarmed meanwhile; the next arming starts a timer again
        left = deadline - self.site.clock.seconds()
        if left > 0:
            self._timer = self.site.clock.callLater(left, self._checkDeadline)
            return
        self._deadline = None
        self.site.slowClients += 1
        if self.transport is not None:
            self.transport.abortConnection()

    # -- reading ----------------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        reader = self._reader
        if reader.reading is STOPPED:
            return  # after a refusal or a last request: read and dropped
        reader.feed(data)
        self._serve()
        if self._current is None:
            if reader.incoming is not None:
                self._arm()  # a body that keeps arriving is not idle
        elif not self._paused and self._held() > PIPELINE_HOLD:
            self._paused = True
            assert self.transport is not None
            self.transport.pauseProducing()

    def queue(self, size: int, item: IServerRequest | Refusal) -> None:
        """A complete request (holding ``size`` bytes), or a refusal, joins the queue."""
        self._ahead += size
        self._queue.append((size, item))

    def _held(self) -> int:
        """Bytes of requests parsed ahead of the answer in progress."""
        return self._ahead + self._reader.pending()

    # -- answering --------------------------------------------------------------------------

    def _serve(self) -> None:
        """Hand queued requests to the door while none is being answered."""
        if self._serving or self._closed:
            return
        self._serving = True
        try:
            while self._current is None and self._queue:
                size, item = self._queue.popleft()
                self._ahead -= size
                self._dispatch(item)
        finally:
            self._serving = False
        if self._current is None and not self._closed:
            if self._answered:
                self._answered = False
                self._arm()
            if self._reader.wantsContinue:
                self._reader.wantsContinue = False
                self.send(_CONTINUE)
        if self._paused and (self._current is None or self._held() <= PIPELINE_HOLD):
            self._paused = False
            assert self.transport is not None
            self.transport.resumeProducing()

    def _dispatch(self, item: IServerRequest | Refusal) -> None:
        self._deadline = None
        if isinstance(item, Refusal):
            request = self._current = ServerRequest(
                self, b"GET", item.path, HTTP11, Headers(), False
            )
            self.site.refuse(request, item.status, item.message)
            return
        self._current = item
        door = self.site.door
        try:
            door.handle(item)
        except Exception as e:
            door.crashed(item, e)

    def send(self, data: bytes) -> None:
        """Write answer bytes to the client (nothing once the connection is gone)."""
        transport = self.transport
        if transport is not None:
            sendNow(transport, data)

    def requestDone(self, request: IServerRequest) -> None:
        """The answer to ``request`` is complete: serve the next request, or close."""
        if request is not self._current:
            return
        self._current = None
        if not request.persistent:
            self._reader.stop()
            self._queue.clear()
            if self.transport is not None:
                self.transport.loseConnection()
            return
        self._answered = True
        self._serve()
