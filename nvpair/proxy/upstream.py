"""Reaching a node (protocol §4): direct plaintext engines, the local backend, and peers over mTLS.

One persistent connection pool serves every facade (the lean client of ``httpclient`` for
plaintext nodes; twisted.web's Agent over pinned TLS for peers).  A node's addresses are tried in
order until one connects; the one that connected is remembered per facade until a
transport error makes dispatch forget it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
from twisted.internet.error import ConnectError
from twisted.internet.interfaces import IConsumer, IStreamClientEndpoint
from twisted.web._newclient import _ensureValidMethod, _ensureValidURI
from twisted.web.client import URI, Agent, HTTPConnectionPool, _HTTP11ClientFactory
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgentEndpointFactory, IBodyProducer, IResponse
from zope.interface import implementer

from nvpair.proxy._interfaces import IUpstream
from nvpair.proxy.httpclient import serializeRequest
from nvpair.proxy.httppool import ConnectionPool, DirectTCP


@implementer(IBodyProducer)
class BytesProducer:
    """A request body already in memory, written in one go."""

    def __init__(self, body: bytes) -> None:
        self._body = body
        self.length = len(body)

    def startProducing(self, consumer: IConsumer) -> defer.Deferred[None]:
        consumer.write(self._body)
        return defer.succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


class _QuietClientFactory(_HTTP11ClientFactory):
    """The pool's connection factory, without a log line per connection."""

    noisy = False


class _Pool(HTTPConnectionPool):
    """The shared pool, able to tell one request when its connection is ready.

    ``Agent.request`` asks the pool for a connection synchronously, so ``Upstream.request``
    sets ``onConnected`` just around that call: the hook fires when a new connection is
    established, or at once for a cached one (the end of the dial, §5.1).
    """

    onConnected: Callable[[], None] | None = None

    def getConnection(self, key: Any, endpoint: IStreamClientEndpoint) -> Any:
        hook, self.onConnected = self.onConnected, None
        d = super().getConnection(key, endpoint)
        if hook is not None:
            d.addCallback(_notifyConnected, hook)
        return d


def _notifyConnected(protocol: Any, hook: Callable[[], None]) -> Any:
    hook()
    return protocol


_BODY_METHODS = (b"POST", b"PUT", b"PATCH")
_VALID_METHODS: set[bytes] = set()  # methods ``_ensureValidMethod`` accepted (a few)


class _Target:
    """A parsed plaintext node URL."""

    __slots__ = ("key", "host", "prefix", "endpoint")

    def __init__(
        self,
        key: Any,
        host: bytes,
        prefix: bytes,
        endpoint: Callable[[], IStreamClientEndpoint | DirectTCP],
    ) -> None:
        self.key = key
        self.host = host
        self.prefix = prefix
        self.endpoint = endpoint


class NotReachable(ConnectError):
    """A node address that cannot be dialled (e.g. a peer while this node is not a member)."""


def splitHostPort(address: str) -> tuple[str, int]:
    """Parse ``host:port`` or ``[v6]:port``."""
    if address.startswith("["):
        host, sep, port = address[1:].partition("]:")
    else:
        host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError("address must be host:port")
    return host, int(port)


@implementer(IAgentEndpointFactory)
class _PeerEndpoints:
    """Endpoints to one peer node's facades: TLS presenting our certificate, pinned to its id."""

    def __init__(self, reactor: Any, nodeId: str, trust: Any, dialTimeout: float) -> None:
        self._reactor = reactor
        self._nodeId = nodeId
        self._trust = trust
        self._dialTimeout = dialTimeout

    def endpointForURI(self, uri: Any) -> IStreamClientEndpoint:
        """A pinned TLS endpoint; ``NotReachable`` when not a member, no certificate or no pin."""
        try:
            creator = self._trust.clientCreatorFor(self._nodeId)
        except Exception as e:  # ClusterError: this node cannot reach peers right now
            raise NotReachable(str(e)) from None
        host = uri.host.decode("ascii")
        tcp = HostnameEndpoint(self._reactor, host, uri.port, timeout=self._dialTimeout)
        return wrapClientTLS(creator, tcp)


class _PeerAgent(Agent):
    """An Agent to one peer whose pooled connections are keyed by what authenticated them.

    The pool key holds the node id, its current pin and this node's own identity, so a
    connection made under an old pin, an old certificate or another node id is never
    reused: a trust change takes effect on the next request (old connections idle out).
    """

    _nodeId: str
    _trust: Any

    def request(
        self,
        method: bytes,
        uri: bytes,
        headers: Headers | None = None,
        bodyProducer: IBodyProducer | None = None,
    ) -> defer.Deferred[IResponse]:
        parsed = URI.fromBytes(uri)
        try:
            endpoint = self._endpointFactory.endpointForURI(parsed)
        except NotReachable:
            return defer.fail()
        trust = self._trust
        key = ("nvpair-peer", self._nodeId, trust.pinFor(self._nodeId), trust.nodeId,
               trust.fingerprint, parsed.host, parsed.port)
        return self._requestWithEndpoint(
            key,  # type: ignore[arg-type]
            endpoint, method, parsed, headers, bodyProducer, parsed.originForm
        )


@implementer(IUpstream)
class Upstream:
    """Opens requests to nodes over the shared pool."""

    def __init__(
        self,
        reactor: Any,
        dialTimeout: float,
        trust: Any = None,
        maxPersistentPerHost: int = 64,
        idleTimeout: int = 90,
    ) -> None:
        self._reactor = reactor
        self._dialTimeout = dialTimeout
        self.trust = trust
        # Plaintext nodes (the hot path): the lean client.  Peers: twisted.web's Agent over
        # pinned TLS endpoints, pooled by node id + pin + own identity.
        self.pool = ConnectionPool(reactor, maxPersistentPerHost, idleTimeout)
        self.peerPool = _Pool(reactor, persistent=True)
        self.peerPool.maxPersistentPerHost = maxPersistentPerHost
        self.peerPool.cachedConnectionTimeout = idleTimeout
        self.peerPool.retryAutomatically = False
        self.peerPool._factory = _QuietClientFactory
        self._peers: dict[str, Agent] = {}
        self._targets: dict[str, _Target] = {}

    def _peerAgent(self, nodeId: str) -> Agent:
        agent = self._peers.get(nodeId)
        if agent is None:
            if self.trust is None:
                raise NotReachable("not a cluster member")
            agent = _PeerAgent.usingEndpointFactory(
                self._reactor,
                _PeerEndpoints(self._reactor, nodeId, self.trust, self._dialTimeout or 30.0),
                pool=self.peerPool,
            )
            agent._nodeId = nodeId
            agent._trust = self.trust
            self._peers[nodeId] = agent
        return agent

    def request(
        self,
        node: Any,
        address: str | None,
        method: bytes,
        path: bytes,
        headers: Headers,
        body: bytes,
        connected: Callable[[], None] | None = None,
    ) -> defer.Deferred[IResponse]:
        """Send one request to ``address`` of ``node`` (an ``http://`` URL or a peer ``host:port``).

        ``connected`` is called once the connection is established (the dial is over).
        """
        if address is None:
            return defer.fail(NotReachable("no address"))
        if address.startswith("http://"):
            target = self._targets.get(address)
            try:
                if target is None:
                    target = self._target(address)
                if method not in _VALID_METHODS:
                    _ensureValidMethod(method)
                    if len(_VALID_METHODS) < 64:
                        _VALID_METHODS.add(method)
                _ensureValidURI(path)
            except Exception:
                return defer.fail()
            sendBody = body if body or method in _BODY_METHODS else None
            data = serializeRequest(method, target.prefix + path, target.host, headers, sendBody)
            sent: defer.Deferred[Any] = self.pool.request(
                target.key, target.endpoint, data, method, connected
            )
            return sent
        producer = BytesProducer(body) if body or method in _BODY_METHODS else None
        try:
            host, port = splitHostPort(address)
            agent = self._peerAgent(node.id)
        except Exception as e:
            return defer.fail(NotReachable(str(e)))
        hostPart = f"[{host}]" if ":" in host else host
        url = f"https://{hostPart}:{port}".encode("ascii") + path
        pool = self.peerPool
        pool.onConnected = connected
        try:
            return agent.request(method, url, headers, producer)
        finally:
            pool.onConnected = None

    def _target(self, address: str) -> _Target:
        """Parse a plaintext node URL once: pool key, Host header, path prefix, endpoint."""
        uri = URI.fromBytes(address.encode("ascii"))
        if uri.scheme != b"http" or not uri.host:
            raise ValueError("not an http URL")
        hostValue = b"[%s]" % uri.host if b":" in uri.host else uri.host
        if uri.port != 80:
            hostValue = b"%s:%d" % (hostValue, uri.port)
        host = uri.host.decode("ascii")
        port = uri.port
        reactor, timeout = self._reactor, self._dialTimeout or 30.0

        endpoint: Callable[[], IStreamClientEndpoint | DirectTCP]
        if isIPAddress(host) or isIPv6Address(host):
            # An IP literal needs no name resolution: dial it directly, without the
            # endpoint's per-connection wrappers (memory per held stream).
            direct = DirectTCP(reactor, host, port, timeout)

            def endpoint() -> IStreamClientEndpoint | DirectTCP:
                return direct
        else:

            def endpoint() -> IStreamClientEndpoint | DirectTCP:
                return HostnameEndpoint(reactor, host, port, timeout=timeout)

        # The address's path, then the request's (what Agent sent for address + path).
        target = _Target(("http", uri.host, port), hostValue, uri.path, endpoint)
        if len(self._targets) < 4096:
            self._targets[address] = target
        return target

    def close(self) -> defer.Deferred[None]:
        """Close every pooled connection."""
        closing: defer.Deferred[Any] = defer.gatherResults(
            [self.pool.closeCachedConnections(), self.peerPool.closeCachedConnections()]
        )
        return closing.addCallback(lambda _: None)


_NONE: tuple[str, ...] = ()


def addressesFor(
    node: Any, localBackend: str | None, confirmed: str | None
) -> tuple[str, ...]:
    """The addresses to try for ``node``, the confirmed one first; the local backend for self.

    The node's own tuple is returned when it is already in that order (no copy).
    """
    if node.isSelf:
        return (localBackend,) if localBackend else _NONE
    addresses: tuple[str, ...] = node.addresses
    if confirmed is None or not addresses or addresses[0] == confirmed:
        return addresses
    if confirmed not in addresses:
        return addresses
    reordered = list(addresses)
    reordered.remove(confirmed)
    return (confirmed, *reordered)

