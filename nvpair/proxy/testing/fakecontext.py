"""Fakes of the request context's seam (``interfaces.IRequestContext``) for unit tests."""

from __future__ import annotations

import attrs
from zope.interface import implementer

from nvpair.proxy.engines import Engine
from nvpair.proxy.interfaces import IExchangeReport, IRequestContext, IWorkload


@implementer(IExchangeReport)
@attrs.frozen
class ExchangeReport:
    """What the context's hooks read of an exchange, as a record: hand it to
    ``attemptFailed``, ``committed`` and ``requestEnded`` in place of an ``Exchange``."""

    context: IRequestContext
    engine: Engine
    inference: bool = True
    model: str | None = None
    createdAt: float = 0.0
    committedStatus: int | None = None
    answered: bool = False
    clientGone: bool = False
    written: int = 0
    workload: IWorkload | None = None
