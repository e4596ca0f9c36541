"""What an exchange reads of its committed answer as it passes to the client (spec §8,
§11 "Stored responses"): its statistics (``routing.stats.StatsMeter``), and on the Responses
route the id of the response its engine stored, recorded against the node that served it
so that a follow-up (``previous_response_id``) goes there."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from nvpair.proxy.dispatch.answering import statsDialect
from nvpair.proxy.placement.responses import ResponseIdSniffer
from nvpair.proxy.routing.stats import StatsMeter

if TYPE_CHECKING:
    from nvpair.proxy.engines import Engine
    from nvpair.proxy.placement.responses import ResponseTable

__all__ = ["ResponsesMeter", "meterFor"]

RESPONSES_DIALECT = "responses"


class ResponsesMeter(StatsMeter):
    """The meter of a 2xx answer on the Responses route, which also finds the id of the
    response the engine stored (``ResponseIdSniffer``: from its first bytes, each copied
    once) and hands it to ``record`` once, when found or at the end."""

    __slots__ = ("_sniffer", "_record")

    def __init__(self, dialect: str, createdAt: float, record: Callable[[str], None]) -> None:
        super().__init__(dialect, createdAt)
        self._sniffer = ResponseIdSniffer()
        self._record = record

    def feed(self, data: bytes) -> None:
        super().feed(data)
        found = self._sniffer.feed(data)
        if found is not None:
            self._record(found)

    def result(self, now: float) -> dict[str, object] | None:
        found = self._sniffer.finish()
        if found is not None:
            self._record(found)
        return super().result(now)


def meterFor(
    engine: Engine,
    path: bytes,
    status: int,
    createdAt: float,
    responses: ResponseTable,
    nodeId: str,
) -> StatsMeter:
    """The meter of an inference answer committed with ``status`` on ``nodeId``: on the
    Responses route with a 2xx, one that records the stored response's id in
    ``responses``."""
    dialect = statsDialect(engine, path)
    if dialect == RESPONSES_DIALECT and 200 <= status < 300:
        return ResponsesMeter(dialect, createdAt, lambda found: responses.record(found, nodeId))
    return StatsMeter(dialect, createdAt)
