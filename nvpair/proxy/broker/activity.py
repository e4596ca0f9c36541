"""In-flight dispatches per node, announced as ``discovery:node-activity`` (protocol §4)."""

from __future__ import annotations

from collections.abc import Callable
from json.encoder import encode_basestring

from zope.interface import implementer

from nvpair.proxy.broker.jsonrpc import Prepared
from nvpair.proxy.interfaces import IActivity, IBrokerSink


class _Change(Prepared):
    """The params ``{"nodeId": <str>, "inFlight": <int>}`` of one change, from a template."""

    __slots__ = ("_nodeId",)

    _nodeId: str  # ``self["nodeId"]``, typed

    def paramsJSON(self) -> str:
        return f'{{"nodeId":{encode_basestring(self._nodeId)},"inFlight":{self["inFlight"]}}}'


@implementer(IActivity)
class Activity:
    """Counts this process's in-flight dispatches per node and reports every change."""

    def __init__(self, sink: IBrokerSink) -> None:
        self._sink = sink
        self.inFlight: dict[str, int] = {}
        # Standalone's room ledger and residency view listen: ``listener(nodeId, delta,
        # model)`` after each change.
        self.listener: Callable[[str, int, str | None], None] | None = None

    def change(self, nodeId: str, delta: int, model: str | None = None) -> None:
        """Add ``delta`` to ``nodeId``'s count (a dispatch for ``model``, when it names
        one) and announce the new value."""
        count = self.inFlight.get(nodeId, 0) + delta
        if count <= 0:
            self.inFlight.pop(nodeId, None)
            count = 0
        else:
            self.inFlight[nodeId] = count
        if self.listener is not None:
            self.listener(nodeId, delta, model)
        if not self._sink.listening:
            return  # nobody receives notifications (standalone)
        if type(nodeId) is str and type(count) is int:
            params = _Change()
            params["nodeId"] = params._nodeId = nodeId
            params["inFlight"] = count
            self._sink.notify("discovery:node-activity", params)
        else:
            self._sink.notify("discovery:node-activity", {"nodeId": nodeId, "inFlight": count})

    def total(self) -> int:
        """All in-flight dispatches of the process."""
        return sum(self.inFlight.values())
