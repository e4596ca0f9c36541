"""Cluster trust: membership, this node's TLS identity and peer pins (protocol §6, spec §7).

``ClusterTrust`` is the live view of the cluster directory::

    <cluster-dir>/member.json     {"clusterId": "...", "nodeId": "..."}
    <cluster-dir>/tls/node.crt    this node's certificate (PEM)
    <cluster-dir>/tls/node.key    its private key (PEM)
    <cluster-dir>/pins.json       {"pins": {"<nodeId>": "<hex SHA-256 of the cert DER>"}}

It polls the files' stat signatures on the injected clock and re-reads only what changed.
The directory has three independent parts (membership, TLS identity, pins); a part whose
files are half-written or invalid keeps its last good value and is reported once through
``onProblem``.  A missing ``member.json`` is not a problem: it means "not a member", at once.

From the current state it builds the mutual-TLS connections of the cluster personality:
``serverContextFactory`` for the listener (client certificate required and pinned) and
``clientCreatorFor(nodeId)`` for reaching a peer (server certificate must equal that node's
pin).  There is no CA and no hostname check: a certificate is trusted exactly when the
SHA-256 of its DER is pinned, whatever OpenSSL thinks of its chain or validity dates.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat as statmod
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
from OpenSSL import SSL, crypto
from twisted.internet.interfaces import (
    IOpenSSLClientConnectionCreator,
    IOpenSSLServerConnectionCreator,
    IReactorTime,
)
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer

__all__ = [
    "ClusterError",
    "ClusterTrust",
    "NoCredentials",
    "NoPin",
    "NotAMember",
    "fingerprintOf",
]

_PrivateKey = (
    rsa.RSAPrivateKey
    | ec.EllipticCurvePrivateKey
    | ed25519.Ed25519PrivateKey
    | ed448.Ed448PrivateKey
    | dsa.DSAPrivateKey
)

_HEX = frozenset("0123456789abcdef")

# The cluster files are tiny; anything bigger is refused rather than read on the reactor.
_MAX_FILE = 1 << 20

_SERVER_OPTIONS = (
    SSL.OP_NO_SSLv2
    | SSL.OP_NO_SSLv3
    | SSL.OP_NO_TLSv1
    | SSL.OP_NO_TLSv1_1
    | SSL.OP_NO_COMPRESSION
    | SSL.OP_CIPHER_SERVER_PREFERENCE
    | SSL.OP_NO_TICKET
    | SSL.OP_SINGLE_ECDH_USE
    | getattr(SSL, "OP_NO_RENEGOTIATION", 0)
)


class ClusterError(Exception):
    """The cluster personality cannot be used to reach a peer."""


class NotAMember(ClusterError):
    """This node is not a cluster member (no valid ``member.json``)."""


class NoCredentials(ClusterError):
    """This node is a member but has no usable certificate and key in ``tls/``."""


class NoPin(ClusterError):
    """The node id has no pin in ``pins.json``."""


class _Bad(Exception):
    """A part of the cluster directory is invalid; the message names file and problem."""


def fingerprintOf(certDER: bytes) -> str:
    """Return the lowercase hex SHA-256 of a certificate's DER encoding."""
    return hashlib.sha256(certDER).hexdigest()


def _fingerprintOfX509(cert: crypto.X509 | x509.Certificate) -> str:
    """Fingerprint of a pyOpenSSL or cryptography certificate object."""
    if isinstance(cert, crypto.X509):
        cert = cert.to_cryptography()
    return fingerprintOf(cert.public_bytes(serialization.Encoding.DER))


def _isFingerprint(value: object) -> bool:
    """Whether ``value`` is 64 hex digits (either case)."""
    return isinstance(value, str) and len(value) == 64 and set(value.lower()) <= _HEX


@dataclass(frozen=True)
class _Membership:
    """The parsed content of ``member.json``."""

    clusterId: str
    nodeId: str


@dataclass(frozen=True)
class _Credentials:
    """This node's certificate and key, loaded and known to match."""

    certificate: x509.Certificate
    privateKey: _PrivateKey
    fingerprint: str


_Signature = tuple[int, int, int, int, int] | None


@dataclass
class _Part:
    """Bookkeeping for one independently applied part of the cluster directory."""

    paths: tuple[str, ...]
    signatures: tuple[_Signature, ...] | None = None
    racy: bool = False
    contents: tuple[bytes | None, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _signatureOf(st: os.stat_result) -> _Signature:
    """The cheap change detector of a file: mtime, ctime, size, inode, device."""
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_dev)


def _statSignature(path: str) -> _Signature:
    """Stat signature of ``path``, or None when it does not exist (any stat error counts)."""
    try:
        return _signatureOf(os.stat(path))
    except OSError:
        return None


@implementer(IOpenSSLServerConnectionCreator)
class _ServerCreator:
    """Builds server-side cluster TLS connections from the trust's current state."""

    def __init__(self, trust: ClusterTrust) -> None:
        self._trust = trust

    def serverConnectionForTLS(self, tlsProtocol: object) -> SSL.Connection:
        """Return a fresh server connection (one that fails its handshake when not a member)."""
        return SSL.Connection(self._trust._serverContext(), None)


@implementer(IOpenSSLClientConnectionCreator)
class _ClientCreator:
    """Builds client-side cluster TLS connections that accept only one node's pin."""

    def __init__(self, trust: ClusterTrust, nodeId: str) -> None:
        self._trust = trust
        self._nodeId = nodeId

    def clientConnectionForTLS(self, tlsProtocol: object) -> SSL.Connection:
        """Return a fresh client connection verifying the server against the node's pin."""
        return self._trust._clientConnection(self._nodeId)


@implementer(IPolicyForHTTPS)
class _NodePolicy:
    """An HTTPS policy that reaches one cluster node whatever the netloc."""

    def __init__(self, trust: ClusterTrust, nodeId: str) -> None:
        self._trust = trust
        self._nodeId = nodeId

    def creatorForNetloc(self, hostname: bytes, port: int) -> IOpenSSLClientConnectionCreator:
        """Return the pinned creator for the node (raises ``ClusterError`` subclasses)."""
        return self._trust.clientCreatorFor(self._nodeId)


class ClusterTrust:
    """The live view of a cluster directory and the mutual-TLS connections built from it.

    ``racyWindow``: a file whose mtime or ctime is less than this many seconds old (by the
    wall clock, which is what file times use) is re-read on the next poll even if its stat
    signature looks unchanged, because file timestamps are coarse and an atomic replace can
    reuse an inode, so two quick same-size writes could otherwise go unnoticed.  A re-read
    whose bytes are unchanged changes nothing.

    Server side: ``serverContextFactory`` builds each connection from the current state.
    When this node is not a member, or has no usable certificate, the connection it builds
    carries no certificate and rejects every peer, so its handshake fails (it never
    raises); a caller that already knows the connection is TLS may check ``isMember`` and
    close it early instead.
    """

    log = Logger()

    def __init__(
        self,
        clusterDir: str | None,
        clock: IReactorTime,
        onProblem: Callable[[str], None],
        interval: float = 1.0,
        racyWindow: float = 2.0,
    ) -> None:
        self._dir = clusterDir
        self._racyNs = int(racyWindow * 1e9)
        self._clock = clock
        self._onProblem = onProblem
        self._interval = interval
        self._loop: LoopingCall | None = None

        self.generation = 0
        self._membership: _Membership | None = None
        self._credentials: _Credentials | None = None
        self._pins: Mapping[str, str] = MappingProxyType({})
        self._byFingerprint: dict[str, str] = {}
        self._noCredentialsReported: object = None

        self._serverCtx: tuple[int, SSL.Context] | None = None
        self._clientCtx: tuple[int, SSL.Context] | None = None
        self._refusingServerCtx: SSL.Context | None = None
        self._refusingClientCtx: SSL.Context | None = None
        self._peerFingerprints: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._localFingerprints: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()

        self._parts: dict[str, _Part] = {}
        if clusterDir is not None:
            tlsDir = os.path.join(clusterDir, "tls")
            self._parts = {
                "member": _Part((os.path.join(clusterDir, "member.json"),)),
                "tls": _Part((os.path.join(tlsDir, "node.crt"), os.path.join(tlsDir, "node.key"))),
                "pins": _Part((os.path.join(clusterDir, "pins.json"),)),
            }
        self._serverCreator = _ServerCreator(self)

    # -- state -----------------------------------------------------------------------

    @property
    def clusterDir(self) -> str | None:
        """The watched directory, or None when clustering is off."""
        return self._dir

    @property
    def isMember(self) -> bool:
        """Whether a valid ``member.json`` is present."""
        return self._membership is not None

    @property
    def nodeId(self) -> str | None:
        """This node's id from ``member.json``, or None when not a member."""
        return None if self._membership is None else self._membership.nodeId

    @property
    def clusterId(self) -> str | None:
        """The cluster id from ``member.json``, or None when not a member."""
        return None if self._membership is None else self._membership.clusterId

    @property
    def hasCredentials(self) -> bool:
        """Whether a certificate and matching key have been loaded from ``tls/``."""
        return self._credentials is not None

    @property
    def fingerprint(self) -> str | None:
        """This node's own certificate fingerprint, or None without credentials."""
        return None if self._credentials is None else self._credentials.fingerprint

    @property
    def pins(self) -> Mapping[str, str]:
        """Node id to lowercase fingerprint, read-only."""
        return self._pins

    def pinFor(self, nodeId: str) -> str | None:
        """Return the pinned (lowercase) fingerprint of a node id, or None."""
        return self._pins.get(nodeId)

    def fingerprintAllowed(self, fp: str) -> str | None:
        """Return the node id pinned to fingerprint ``fp`` (any case), or None."""
        return self._byFingerprint.get(fp.lower())

    # -- watching --------------------------------------------------------------------

    def start(self) -> None:
        """Check the directory now and then every ``interval`` seconds (no-op without one)."""
        if self._dir is None:
            return
        if self._loop is not None and self._loop.running:
            return
        loop = LoopingCall(self._poll)
        loop.clock = self._clock
        self._loop = loop
        loop.start(self._interval, now=True)

    def stop(self) -> None:
        """Stop polling; the current state stays as it is."""
        loop, self._loop = self._loop, None
        if loop is not None and loop.running:
            loop.stop()

    def _poll(self) -> None:
        """One timer tick: ``reload``, never letting an unexpected error stop the loop."""
        try:
            self.reload()
        except Exception as e:  # noqa: BLE001 - report and keep watching
            self._report(f"cluster directory check failed: {type(e).__name__}")

    def reload(self) -> None:
        """Check every file once now and apply whatever changed."""
        if self._dir is None:
            return
        before = self.generation
        self._checkPart(self._parts["member"], self._applyMember)
        self._checkPart(self._parts["tls"], self._applyTLS)
        self._checkPart(self._parts["pins"], self._applyPins)
        self._checkMemberCredentials()
        if self.generation != before:
            self.log.info(
                "cluster-changed", generation=self.generation, member=self.isMember,
                nodeId=self.nodeId, credentials=self.hasCredentials, pins=len(self._pins),
            )

    def _checkPart(self, part: _Part, apply: Callable[[tuple[bytes | None, ...]], None]) -> None:
        """Re-read a part when its stat signature moved (or it was recently written)."""
        signatures = tuple(_statSignature(p) for p in part.paths)
        if signatures == part.signatures and not part.racy:
            return
        contents: list[bytes | None] = []
        readSignatures: list[_Signature] = []
        racy = False
        nowNs = time.time_ns()
        for path in part.paths:
            try:
                data, st = self._readFile(path)
            except FileNotFoundError:
                contents.append(None)
                readSignatures.append(None)
                continue
            except OSError as e:
                # Unreadable (permissions, a directory, ...): a problem for that version.
                part.signatures = None
                part.racy = True
                key = ("oserror", path, e.errno)
                if part.extra.get("lastError") != key:
                    part.extra["lastError"] = key
                    self._report(f"{self._rel(path)}: cannot be read ({_errnoName(e)})")
                return
            contents.append(data)
            readSignatures.append(_signatureOf(st))
            if nowNs - max(st.st_mtime_ns, st.st_ctime_ns) < self._racyNs:
                racy = True
        part.extra.pop("lastError", None)
        part.signatures = tuple(readSignatures)
        part.racy = racy
        newContents = tuple(contents)
        if newContents == part.contents:
            return
        try:
            apply(newContents)
        except _Bad as e:
            part.contents = newContents
            self._report(str(e))
        except BaseException:
            part.signatures = None  # not applied: try this version again next time
            raise
        else:
            part.contents = newContents

    def _readFile(self, path: str) -> tuple[bytes, os.stat_result]:
        """Read a whole (small) file and return it with the stat of what was read."""
        # O_NONBLOCK: opening a FIFO planted here must not block the reactor.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as f:
            st = os.fstat(fd)
            if not statmod.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            if st.st_size > _MAX_FILE:
                raise OSError(errno.EFBIG, "file too large")
            data = f.read(_MAX_FILE + 1)
            if len(data) > _MAX_FILE:
                raise OSError(errno.EFBIG, "file too large")
            return data, st

    def _rel(self, path: str) -> str:
        """A path relative to the cluster directory, for messages."""
        assert self._dir is not None
        return os.path.relpath(path, self._dir)

    def _report(self, message: str) -> None:
        """Hand one problem to the owner, never letting its failure stop the watch."""
        try:
            self._onProblem(message)
        except Exception:  # noqa: BLE001 - a reporting failure must not break polling
            pass

    def _changed(self) -> None:
        """Record an applied change: bump the generation, drop cached contexts."""
        self.generation += 1
        self._serverCtx = None
        self._clientCtx = None

    # -- parsing ---------------------------------------------------------------------

    def _applyMember(self, contents: tuple[bytes | None, ...]) -> None:
        """Parse and apply ``member.json`` (absent means not a member)."""
        (data,) = contents
        membership: _Membership | None
        if data is None:
            membership = None
        else:
            obj = _loadJSON("member.json", data)
            if not isinstance(obj, dict):
                raise _Bad("member.json: not a JSON object")
            nodeId = obj.get("nodeId")
            clusterId = obj.get("clusterId")
            if not isinstance(nodeId, str) or not nodeId:
                raise _Bad("member.json: nodeId must be a non-empty string")
            if not isinstance(clusterId, str) or not clusterId:
                raise _Bad("member.json: clusterId must be a non-empty string")
            membership = _Membership(clusterId=clusterId, nodeId=nodeId)
        if membership != self._membership:
            self._membership = membership
            self._changed()

    def _applyPins(self, contents: tuple[bytes | None, ...]) -> None:
        """Parse and apply ``pins.json`` (absent means no pins)."""
        (data,) = contents
        pins: dict[str, str] = {}
        if data is not None:
            obj = _loadJSON("pins.json", data)
            if not isinstance(obj, dict) or not isinstance(obj.get("pins"), dict):
                raise _Bad('pins.json: expected an object with a "pins" object')
            byFingerprint: dict[str, str] = {}
            for nodeId, fp in obj["pins"].items():
                if not nodeId:
                    raise _Bad("pins.json: empty node id")
                if not _isFingerprint(fp):
                    raise _Bad(f"pins.json: pin of node {nodeId!r} is not 64 hex digits")
                fp = fp.lower()
                if fp in byFingerprint:
                    raise _Bad(
                        f"pins.json: nodes {byFingerprint[fp]!r} and {nodeId!r} "
                        "have the same fingerprint"
                    )
                byFingerprint[fp] = nodeId
                pins[nodeId] = fp
        if pins != dict(self._pins):
            self._pins = MappingProxyType(pins)
            self._byFingerprint = {fp: nodeId for nodeId, fp in pins.items()}
            self._changed()

    def _applyTLS(self, contents: tuple[bytes | None, ...]) -> None:
        """Load and apply ``tls/node.crt`` and ``tls/node.key`` (they must match)."""
        certData, keyData = contents
        if certData is None and keyData is None:
            if self._credentials is not None:
                raise _Bad(
                    "tls/node.crt and tls/node.key: missing; keeping the previous certificate"
                )
            return
        if certData is None:
            raise _Bad("tls/node.crt: missing")
        if keyData is None:
            raise _Bad("tls/node.key: missing")
        try:
            certificate = x509.load_pem_x509_certificate(certData)
        except Exception:  # noqa: BLE001 - any parse failure is the same problem
            raise _Bad("tls/node.crt: not a PEM certificate") from None
        try:
            privateKey = serialization.load_pem_private_key(keyData, password=None)
        except TypeError:
            raise _Bad("tls/node.key: the private key is encrypted") from None
        except Exception:  # noqa: BLE001 - never echo anything about key material
            raise _Bad("tls/node.key: not a PEM private key") from None
        if not isinstance(
            privateKey,
            rsa.RSAPrivateKey
            | ec.EllipticCurvePrivateKey
            | ed25519.Ed25519PrivateKey
            | ed448.Ed448PrivateKey
            | dsa.DSAPrivateKey,
        ):
            raise _Bad("tls/node.key: unsupported private key type")
        spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        try:
            matches = certificate.public_key().public_bytes(*spki) == (
                privateKey.public_key().public_bytes(*spki)
            )
        except Exception:  # noqa: BLE001 - an odd key type simply does not match
            matches = False
        if not matches:
            raise _Bad("tls/node.key: does not match the certificate in tls/node.crt")
        fp = fingerprintOf(certificate.public_bytes(serialization.Encoding.DER))
        if self._credentials is not None and self._credentials.fingerprint == fp:
            old = self._credentials.privateKey.public_key().public_bytes(*spki)
            if old == privateKey.public_key().public_bytes(*spki):
                return
        self._credentials = _Credentials(certificate, privateKey, fp)
        self._changed()

    def _checkMemberCredentials(self) -> None:
        """Report, once per membership, being a member without a usable certificate."""
        if self._membership is None or self._credentials is not None:
            self._noCredentialsReported = None
            return
        if self._noCredentialsReported == self._membership:
            return
        self._noCredentialsReported = self._membership
        if self._parts["tls"].contents in (None, (None, None)):
            self._report(
                "member.json present but tls/node.crt and tls/node.key are missing; "
                "cluster TLS is unavailable"
            )

    # -- TLS -------------------------------------------------------------------------

    @property
    def serverContextFactory(self) -> IOpenSSLServerConnectionCreator:
        """The server connection creator for the cluster personality (see the class doc)."""
        return self._serverCreator

    def clientCreatorFor(self, nodeId: str) -> IOpenSSLClientConnectionCreator:
        """Return a creator that presents this node's certificate and accepts only ``nodeId``.

        Raises ``NotAMember``, ``NoCredentials`` or ``NoPin``.  The membership and the pin
        are checked again on each connection the creator builds.
        """
        self._requireClientUsable(nodeId)
        return _ClientCreator(self, nodeId)

    def policyForNode(self, nodeId: str) -> IPolicyForHTTPS:
        """Return an HTTPS policy reaching ``nodeId`` whatever netloc it is asked for."""
        self._requireClientUsable(nodeId)
        return _NodePolicy(self, nodeId)

    def peerNodeId(self, transport: object) -> str | None:
        """Return the pinned node id of an established connection's peer certificate.

        ``transport`` is anything with ``getPeerCertificate()`` (the TLS protocol, or a
        request's transport).  None when not a member, no certificate, or no pin any more.
        """
        if self._membership is None:
            return None
        fp = self._peerFingerprint(transport)
        if fp is None:
            return None
        return self._byFingerprint.get(fp)

    def presentsCurrentIdentity(self, transport: object) -> bool:
        """Whether an established connection was made with this node's current certificate.

        ``transport`` is the TLS protocol (anything with ``getHandle()`` returning the
        ``SSL.Connection``).  False after a rotation, so a kept-alive connection made under
        the old certificate can be cut on its next request.
        """
        credentials = self._credentials
        if credentials is None:
            return False
        try:
            cached = self._localFingerprints.get(transport)
        except TypeError:
            cached = None
        if cached is None:
            getHandle = getattr(transport, "getHandle", None)
            try:
                cert = getHandle().get_certificate() if getHandle is not None else None
            except Exception:  # noqa: BLE001 - no TLS session yet or already torn down
                return False
            if not isinstance(cert, crypto.X509 | x509.Certificate):
                return False
            cached = _fingerprintOfX509(cert)
            try:
                self._localFingerprints[transport] = cached
            except TypeError:
                pass
        return cached == credentials.fingerprint

    def _peerFingerprint(self, transport: object) -> str | None:
        """The peer certificate's fingerprint, cached per transport object."""
        try:
            cached = self._peerFingerprints.get(transport)
        except TypeError:
            cached = None
        if cached is not None:
            return cached
        getPeerCertificate = getattr(transport, "getPeerCertificate", None)
        if getPeerCertificate is None:
            return None
        try:
            cert = getPeerCertificate()
        except Exception:  # noqa: BLE001 - no TLS session yet or already torn down
            return None
        if not isinstance(cert, crypto.X509 | x509.Certificate):
            return None
        fp = _fingerprintOfX509(cert)
        try:
            self._peerFingerprints[transport] = fp
        except TypeError:
            pass
        return fp

    def _requireClientUsable(self, nodeId: str) -> None:
        """Raise the ``ClusterError`` that forbids reaching ``nodeId`` now, if any."""
        if self._membership is None:
            raise NotAMember("this node is not a cluster member")
        if self._credentials is None:
            raise NoCredentials("no usable certificate and key in tls/")
        if nodeId not in self._pins:
            raise NoPin(f"no pin for node {nodeId!r}")

    def _serverContext(self) -> SSL.Context:
        """The server context of the current generation (or the refusing one)."""
        if self._membership is None or self._credentials is None:
            return self._refusingContext(server=True)
        cached = self._serverCtx
        if cached is not None and cached[0] == self.generation:
            return cached[1]
        ctx = self._baseContext(self._credentials)
        ctx.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, self._verifyClient)
        # Required for client certificates with session-aware OpenSSL; sessions are off.
        ctx.set_session_id(b"nvpair-cluster")
        ctx.set_session_cache_mode(SSL.SESS_CACHE_OFF)
        self._serverCtx = (self.generation, ctx)
        return ctx

    def _clientConnection(self, nodeId: str) -> SSL.Connection:
        """A client connection for ``nodeId`` (one that fails its handshake when unusable)."""
        if self._membership is None or self._credentials is None:
            return SSL.Connection(self._refusingContext(server=False), None)
        cached = self._clientCtx
        if cached is not None and cached[0] == self.generation:
            ctx = cached[1]
        else:
            ctx = self._baseContext(self._credentials)
            ctx.set_session_cache_mode(SSL.SESS_CACHE_OFF)
            ctx.set_verify(SSL.VERIFY_PEER, _refuseAll)
            self._clientCtx = (self.generation, ctx)
        connection = SSL.Connection(ctx, None)
        connection.set_verify(SSL.VERIFY_PEER, self._serverVerifierFor(nodeId))
        return connection

    def _baseContext(self, credentials: _Credentials) -> SSL.Context:
        """A TLS 1.2+ context presenting this node's certificate and key."""
        ctx = SSL.Context(SSL.TLS_METHOD)
        ctx.set_min_proto_version(SSL.TLS1_2_VERSION)
        ctx.set_options(_SERVER_OPTIONS)
        ctx.set_mode(SSL.MODE_RELEASE_BUFFERS)
        ctx.use_certificate(credentials.certificate)
        ctx.use_privatekey(credentials.privateKey)
        ctx.check_privatekey()
        return ctx

    def _refusingContext(self, server: bool) -> SSL.Context:
        """A context with no certificate that rejects every peer: its handshakes fail."""
        if server:
            if self._refusingServerCtx is None:
                ctx = SSL.Context(SSL.TLS_METHOD)
                ctx.set_min_proto_version(SSL.TLS1_2_VERSION)
                ctx.set_options(_SERVER_OPTIONS)
                ctx.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, _refuseAll)
                ctx.set_session_id(b"nvpair-cluster")
                ctx.set_session_cache_mode(SSL.SESS_CACHE_OFF)
                self._refusingServerCtx = ctx
            return self._refusingServerCtx
        if self._refusingClientCtx is None:
            ctx = SSL.Context(SSL.TLS_METHOD)
            ctx.set_min_proto_version(SSL.TLS1_2_VERSION)
            ctx.set_options(_SERVER_OPTIONS)
            ctx.set_verify(SSL.VERIFY_PEER, _refuseAll)
            ctx.set_session_cache_mode(SSL.SESS_CACHE_OFF)
            self._refusingClientCtx = ctx
        return self._refusingClientCtx

    def _verifyClient(
        self, conn: SSL.Connection, cert: crypto.X509, errnum: int, depth: int, ok: int
    ) -> bool:
        """Server verify callback: the client's leaf certificate must be pinned."""
        if depth > 0:
            return True
        if self._membership is None:
            return False
        try:
            return _fingerprintOfX509(cert) in self._byFingerprint
        except Exception:  # noqa: BLE001 - an unreadable certificate is refused
            return False

    def _serverVerifierFor(
        self, nodeId: str
    ) -> Callable[[SSL.Connection, crypto.X509, int, int, int], bool]:
        """Client verify callback: the server's leaf must equal the current pin of ``nodeId``."""

        def verify(
            conn: SSL.Connection, cert: crypto.X509, errnum: int, depth: int, ok: int
        ) -> bool:
            if depth > 0:
                return True
            pin = self._pins.get(nodeId)
            if pin is None or self._membership is None:
                return False
            try:
                return _fingerprintOfX509(cert) == pin
            except Exception:  # noqa: BLE001 - an unreadable certificate is refused
                return False

        return verify


def _refuseAll(conn: SSL.Connection, cert: crypto.X509, errnum: int, depth: int, ok: int) -> bool:
    """A verify callback that rejects every certificate."""
    return False


def _loadJSON(name: str, data: bytes) -> Any:
    """Decode a JSON file or raise ``_Bad`` naming it."""
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise _Bad(f"{name}: not UTF-8") from None
    except json.JSONDecodeError as e:
        raise _Bad(f"{name}: invalid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None


def _errnoName(e: OSError) -> str:
    """A short description of an OS error (never file content)."""
    if e.strerror:
        return e.strerror
    if e.errno is not None and e.errno in errno.errorcode:
        return errno.errorcode[e.errno]
    return type(e).__name__
