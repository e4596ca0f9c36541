"""How attempts and committed bodies end (spec §5.2-§5.4), as named values: a leaf that
the dispatch path, the interfaces its readers are typed by, and the traces all name."""

from __future__ import annotations

from enum import Enum, StrEnum

__all__ = ["BodyEnding", "FailureKind"]


class FailureKind(StrEnum):
    """Why an attempt ended uncommitted (the names metrics and history report).

    On the final permitted attempt ``NO_CONTENT`` answers 504; every other kind answers 502.
    """

    TRANSPORT = "transport"  # dial failure, connection lost before the first body byte
    HEADER_TIMEOUT = "header_timeout"  # connected, but no headers within the header cap
    STATUS = "status"  # a retryable status on a non-final attempt
    NO_CONTENT = "no_content"  # headers arrived, the first body byte did not (first-content cap)
    LEFT = "left"  # the target left discovery before commit
    MOVED = "moved"  # it waited in its engine's queue while another owner had room


class BodyEnding(Enum):
    """How the body of a committed response ended."""

    COMPLETE = "complete"  # cleanly: the client's response is finished
    TRUNCATED = "truncated"  # uncleanly: the client's response is cut where the engine's was
    CLIENT_GONE = "client_gone"  # the client left first
    STOPPED = "stopped"  # the exchange stopped it (client gone, shutdown): nothing to report
