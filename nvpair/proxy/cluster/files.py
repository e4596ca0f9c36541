"""The cluster directory's files: reading them safely and parsing their formats (protocol §6).

``readSmallFile`` and the stat signatures are the I/O; ``parseMember``, ``parsePins`` and
``loadCredentials`` are pure functions from file bytes to values.  Each parser raises
``BadClusterFile`` with a message naming the file and the problem, and never echoes file
content or anything about key material.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat as statmod
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa

PrivateKey = (
    rsa.RSAPrivateKey
    | ec.EllipticCurvePrivateKey
    | ed25519.Ed25519PrivateKey
    | ed448.Ed448PrivateKey
    | dsa.DSAPrivateKey
)

_HEX = frozenset("0123456789abcdef")

# The cluster files are tiny; anything bigger is refused rather than read on the reactor.
_MAX_FILE = 1 << 20

Signature = tuple[int, int, int, int, int] | None
_SPKI = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo


class BadClusterFile(Exception):
    """A part of the cluster directory is invalid; the message names file and problem."""


@dataclass(frozen=True)
class Membership:
    """The parsed content of ``member.json``."""

    clusterId: str
    nodeId: str


@dataclass(frozen=True)
class Credentials:
    """This node's certificate and key, loaded and known to match."""

    certificate: x509.Certificate
    privateKey: PrivateKey
    fingerprint: str

    def sameAs(self, other: Credentials) -> bool:
        """Whether ``other`` is the same certificate with the same public key."""
        return self.fingerprint == other.fingerprint and _publicKeyOf(
            self.privateKey
        ) == _publicKeyOf(other.privateKey)


def fingerprintOf(certDER: bytes) -> str:
    """Return the lowercase hex SHA-256 of a certificate's DER encoding."""
    return hashlib.sha256(certDER).hexdigest()


def isFingerprint(value: object) -> bool:
    """Whether ``value`` is 64 hex digits (either case)."""
    return isinstance(value, str) and len(value) == 64 and set(value.lower()) <= _HEX


def signatureOf(st: os.stat_result) -> Signature:
    """The cheap change detector of a file: mtime, ctime, size, inode, device."""
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_dev)


def statSignature(path: str) -> Signature:
    """Stat signature of ``path``, or None when it does not exist (any stat error counts)."""
    try:
        return signatureOf(os.stat(path))
    except OSError:
        return None


def readSmallFile(path: str) -> tuple[bytes, os.stat_result]:
    """Read a whole (small, regular) file and return it with the stat of what was read."""
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


def errnoName(e: OSError) -> str:
    """A short description of an OS error (never file content)."""
    if e.strerror:
        return e.strerror
    if e.errno is not None and e.errno in errno.errorcode:
        return errno.errorcode[e.errno]
    return type(e).__name__


def parseMember(data: bytes | None) -> Membership | None:
    """Parse ``member.json`` (absent means not a member)."""
    if data is None:
        return None
    obj = _loadJSON("member.json", data)
    if not isinstance(obj, dict):
        raise BadClusterFile("member.json: not a JSON object")
    nodeId = obj.get("nodeId")
    clusterId = obj.get("clusterId")
    if not isinstance(nodeId, str) or not nodeId:
        raise BadClusterFile("member.json: nodeId must be a non-empty string")
    if not isinstance(clusterId, str) or not clusterId:
        raise BadClusterFile("member.json: clusterId must be a non-empty string")
    return Membership(clusterId=clusterId, nodeId=nodeId)


def parsePins(data: bytes | None) -> dict[str, str]:
    """Parse ``pins.json`` into node id to lowercase fingerprint (absent means no pins)."""
    pins: dict[str, str] = {}
    if data is None:
        return pins
    obj = _loadJSON("pins.json", data)
    if not isinstance(obj, dict) or not isinstance(obj.get("pins"), dict):
        raise BadClusterFile('pins.json: expected an object with a "pins" object')
    byFingerprint: dict[str, str] = {}
    for nodeId, fp in obj["pins"].items():
        if not nodeId:
            raise BadClusterFile("pins.json: empty node id")
        if not isFingerprint(fp):
            raise BadClusterFile(f"pins.json: pin of node {nodeId!r} is not 64 hex digits")
        fp = fp.lower()
        if fp in byFingerprint:
            raise BadClusterFile(
                f"pins.json: nodes {byFingerprint[fp]!r} and {nodeId!r} have the same fingerprint"
            )
        byFingerprint[fp] = nodeId
        pins[nodeId] = fp
    return pins


def loadCredentials(certData: bytes | None, keyData: bytes | None) -> Credentials | None:
    """Load ``tls/node.crt`` and ``tls/node.key``; None when both are absent.

    Either one missing, unparseable, of an unsupported type, or the two not matching, is a
    ``BadClusterFile``.
    """
    if certData is None and keyData is None:
        return None
    if certData is None:
        raise BadClusterFile("tls/node.crt: missing")
    if keyData is None:
        raise BadClusterFile("tls/node.key: missing")
    try:
        certificate = x509.load_pem_x509_certificate(certData)
    except Exception:  # noqa: BLE001 - any parse failure is the same problem
        raise BadClusterFile("tls/node.crt: not a PEM certificate") from None
    try:
        privateKey = serialization.load_pem_private_key(keyData, password=None)
    except TypeError:
        raise BadClusterFile("tls/node.key: the private key is encrypted") from None
    except Exception:  # noqa: BLE001 - never echo anything about key material
        raise BadClusterFile("tls/node.key: not a PEM private key") from None
    if not isinstance(privateKey, PrivateKey):
        raise BadClusterFile("tls/node.key: unsupported private key type")
    try:
        matches = certificate.public_key().public_bytes(*_SPKI) == _publicKeyOf(privateKey)
    except Exception:  # noqa: BLE001 - an odd key type simply does not match
        matches = False
    if not matches:
        raise BadClusterFile("tls/node.key: does not match the certificate in tls/node.crt")
    fp = fingerprintOf(certificate.public_bytes(serialization.Encoding.DER))
    return Credentials(certificate, privateKey, fp)


def _publicKeyOf(privateKey: PrivateKey) -> bytes:
    """The DER SubjectPublicKeyInfo of a private key's public half."""
    return privateKey.public_key().public_bytes(*_SPKI)


def _loadJSON(name: str, data: bytes) -> object:
    """Decode a JSON file or raise ``BadClusterFile`` naming it."""
    try:
        value: object = json.loads(data.decode("utf-8"))
        return value
    except UnicodeDecodeError:
        raise BadClusterFile(f"{name}: not UTF-8") from None
    except json.JSONDecodeError as e:
        raise BadClusterFile(
            f"{name}: invalid JSON ({e.msg} at line {e.lineno} column {e.colno})"
        ) from None
