"""Watching the cluster directory: membership, TLS identity and pins, last good state kept.

``ClusterDirectory`` is the live view of::

    <cluster-dir>/member.json     {"clusterId": "...", "nodeId": "..."}
    <cluster-dir>/tls/node.crt    this node's certificate (PEM)
    <cluster-dir>/tls/node.key    its private key (PEM)
    <cluster-dir>/pins.json       {"pins": {"<nodeId>": "<hex SHA-256 of the cert DER>"}}

It polls the files' stat signatures on the injected clock and re-reads only what changed.
The directory has three independent parts (membership, TLS identity, pins); a part whose
files are half-written or invalid keeps its last good value and is reported once through
``onProblem``.  A missing ``member.json`` is not a problem: it means "not a member", at once.
Reading the files and their formats are ``cluster.files``' business.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from nvpair.proxy.cluster.files import (
    BadClusterFile,
    Credentials,
    Membership,
    Signature,
    errnoName,
    loadCredentials,
    parseMember,
    parsePins,
    readSmallFile,
    signatureOf,
    statSignature,
)


@dataclass
class _Part:
    """Bookkeeping for one independently applied part of the cluster directory."""

    paths: tuple[str, ...]
    signatures: tuple[Signature, ...] | None = None
    racy: bool = False
    contents: tuple[bytes | None, ...] | None = None
    # The last read failure reported, ("oserror", path, errno): reported once, not per poll.
    lastError: tuple[str, str, int | None] | None = None


class Standing(Enum):
    """Where this node stands in the cluster, by the directory's last good state."""

    OFF = "off"  # no cluster directory
    NOT_MEMBER = "not-member"  # no valid ``member.json``
    NO_CREDENTIALS = "no-credentials"  # a member without a usable certificate and key
    MEMBER = "member"  # a member that can present its certificate


class ClusterDirectory:
    """The live, last-good view of a cluster directory (see the module doc).

    ``racyWindow``: a file whose mtime or ctime is less than this many seconds old (by the
    wall clock, which is what file times use) is re-read on the next poll even if its stat
    signature looks unchanged, because file timestamps are coarse and an atomic replace can
    reuse an inode, so two quick same-size writes could otherwise go unnoticed.  A re-read
    whose bytes are unchanged changes nothing.  Every applied change bumps ``generation``.
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
        self._membership: Membership | None = None
        self._credentials: Credentials | None = None
        self._pins: Mapping[str, str] = MappingProxyType({})
        self._byFingerprint: dict[str, str] = {}
        self._noCredentialsReported: Membership | None = None

        self._parts: dict[str, _Part] = {}
        if clusterDir is not None:
            tlsDir = os.path.join(clusterDir, "tls")
            self._parts = {
                "member": _Part((os.path.join(clusterDir, "member.json"),)),
                "tls": _Part((os.path.join(tlsDir, "node.crt"), os.path.join(tlsDir, "node.key"))),
                "pins": _Part((os.path.join(clusterDir, "pins.json"),)),
            }

    # -- state -----------------------------------------------------------------------

    @property
    def clusterDir(self) -> str | None:
        """The watched directory, or None when clustering is off."""
        return self._dir

    @property
    def standing(self) -> Standing:
        """Whether clustering is on, this node a member, and able to present its certificate."""
        if self._dir is None:
            return Standing.OFF
        if self._membership is None:
            return Standing.NOT_MEMBER
        if self._credentials is None:
            return Standing.NO_CREDENTIALS
        return Standing.MEMBER

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
    def credentials(self) -> Credentials | None:
        """This node's loaded certificate and key, or None."""
        return self._credentials

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
                "cluster-changed",
                generation=self.generation,
                member=self.isMember,
                nodeId=self.nodeId,
                credentials=self.hasCredentials,
                pins=len(self._pins),
            )

    def _checkPart(self, part: _Part, apply: Callable[[tuple[bytes | None, ...]], None]) -> None:
        """Re-read a part when its stat signature moved (or it was recently written)."""
        signatures = tuple(statSignature(p) for p in part.paths)
        if signatures == part.signatures and not part.racy:
            return
        contents: list[bytes | None] = []
        readSignatures: list[Signature] = []
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
                if part.lastError != key:
                    part.lastError = key
                    self._report(f"{self._rel(path)}: cannot be read ({errnoName(e)})")
                return
            contents.append(data)
            readSignatures.append(signatureOf(st))
            if nowNs - max(st.st_mtime_ns, st.st_ctime_ns) < self._racyNs:
                racy = True
        part.lastError = None
        part.signatures = tuple(readSignatures)
        part.racy = racy
        newContents = tuple(contents)
        if newContents == part.contents:
            return
        try:
            apply(newContents)
        except BadClusterFile as e:
            part.contents = newContents
            self._report(str(e))
        except BaseException:
            part.signatures = None  # not applied: try this version again next time
            raise
        else:
            part.contents = newContents

    def _readFile(self, path: str) -> tuple[bytes, os.stat_result]:
        """Read a whole (small) file and return it with the stat of what was read."""
        return readSmallFile(path)

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
        """Record an applied change (subclasses also drop what they built from the state)."""
        self.generation += 1

    # -- applying --------------------------------------------------------------------

    def _applyMember(self, contents: tuple[bytes | None, ...]) -> None:
        """Parse and apply ``member.json`` (absent means not a member)."""
        (data,) = contents
        membership = parseMember(data)
        if membership != self._membership:
            self._membership = membership
            self._changed()

    def _applyPins(self, contents: tuple[bytes | None, ...]) -> None:
        """Parse and apply ``pins.json`` (absent means no pins)."""
        (data,) = contents
        pins = parsePins(data)
        if pins != dict(self._pins):
            self._pins = MappingProxyType(pins)
            self._byFingerprint = {fp: nodeId for nodeId, fp in pins.items()}
            self._changed()

    def _applyTLS(self, contents: tuple[bytes | None, ...]) -> None:
        """Load and apply ``tls/node.crt`` and ``tls/node.key`` (they must match)."""
        certData, keyData = contents
        credentials = loadCredentials(certData, keyData)
        if credentials is None:
            if self._credentials is not None:
                raise BadClusterFile(
                    "tls/node.crt and tls/node.key: missing; keeping the previous certificate"
                )
            return
        if self._credentials is not None and self._credentials.sameAs(credentials):
            return
        self._credentials = credentials
        self._changed()

    def _checkMemberCredentials(self) -> None:
        """Report, once per membership, being a member without a usable certificate."""
        if self.standing is not Standing.NO_CREDENTIALS:
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
