"""How an exchange and its attempts end (spec §5.2-§5.4): an attempt committed, with how its
body then ends, or failed uncommitted, with why; and the client's side of the exchange.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Final

from zope.interface import Interface, implementer

from nvpair.proxy.endings import BodyEnding, FailureKind
from nvpair.proxy.interfaces import IAttemptReport
from nvpair.proxy.placement.interfaces import IOutcome

if TYPE_CHECKING:
    from nvpair.proxy.routing.nodes import Node


class ClientState(Enum):
    """The client's side of an exchange."""

    OPEN = "open"  # connected (or not known to be gone yet)
    GONE = "gone"  # it left, or was cut off for not reading
    CUT = "cut"  # the proxy cut its response short (the engine's was): its loss is ours


# The members as module constants: on Python 3.11 ``Enum.MEMBER`` is an attribute lookup
# through the enum's metaclass, several times slower than a global, and these are read on
# every request.
OPEN: Final = ClientState.OPEN
GONE: Final = ClientState.GONE
CUT: Final = ClientState.CUT
COMPLETE: Final = BodyEnding.COMPLETE
TRUNCATED: Final = BodyEnding.TRUNCATED
CLIENT_GONE: Final = BodyEnding.CLIENT_GONE
STOPPED: Final = BodyEnding.STOPPED
NO_CONTENT: Final = FailureKind.NO_CONTENT


class ICommittedBody(Interface):
    """The committed attempt, as the exchange serving its body sees it."""

    def stopBody() -> None:
        """Stop reading the committed body (the client is gone, or the process stops)."""


@implementer(IOutcome)
class Committed:
    """The attempt's response is the client's answer.

    ``ending`` is how its body ended: None while it streams, and once set the attempt
    reports nothing more.
    """

    __slots__ = ("node", "status", "attempt", "ending")

    committed = True
    kind = None

    def __init__(self, node: Node, status: int, attempt: ICommittedBody) -> None:
        self.node = node
        self.status = status
        self.attempt = attempt
        self.ending: BodyEnding | None = None


@implementer(IOutcome, IAttemptReport)
class Failed:
    """The attempt ended without committing."""

    __slots__ = ("kind", "status", "node", "retryAfter")

    committed = False

    def __init__(
        self,
        kind: FailureKind,
        node: Node,
        status: int | None = None,
        retryAfter: float | None = None,
    ) -> None:
        self.kind = kind
        self.node = node
        self.status = status
        self.retryAfter = retryAfter  # the engine's ``Retry-After`` seconds, when it sent one
