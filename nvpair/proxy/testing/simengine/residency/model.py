"""Which models a simulated engine holds in memory, and what loading one costs (spec §16).

* **Installed** are the configured models (``--models``); **resident** the ones loaded, at
  most ``--max-loaded`` of them (0: no limit), plus the one loading.
* **Loads are serial**: one model loads at a time per engine, in the order they were first
  wanted; the others wait.  Loading model *m* takes its ``--load-ms`` (per model:
  ``--load-ms 3000,big=9000``).
* **Eviction is least recently used, idle only**: to make room, the resident model unused
  for longest *with no request running or waiting for a slot* unloads; when every resident
  model is busy the load waits until one is idle (as llama-server's router and Ollama's
  scheduler do).
* **Keep-alive**: an idle model unused for its keep-alive (``--keep-alive-s``, or the
  ``keep_alive`` its last Ollama request gave: ``-1`` forever, ``0`` at once) unloads.
* Counted: ``loads``, ``evictions`` (to make room), ``expired`` (keep-alive) and
  ``unloads`` (asked through an API or ``/sim/unload``).

A request ``want``s its model (a callback when it is resident, with the seconds it waited
for it), ``hold``s it while it runs and ``release``s it at the end.  Everything is timed on
the engine's clock; nothing grows per request beyond the waiters, which the engine's FIFO
bound limits.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable

import attrs
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from nvpair.proxy.testing.simengine.config import SimConfig

Ready = Callable[[float], None]


@attrs.define(eq=False)
class _Waiter:
    model: str
    ready: Ready | None  # None: an explicit load nobody waits on
    arrived: float


@attrs.define
class ResidencyStats:
    """Loads and unloads since start (or ``/sim/reset``)."""

    loads: int = 0
    evictions: int = 0
    expired: int = 0
    unloads: int = 0

    def reset(self) -> None:
        """Zero every counter."""
        self.loads = self.evictions = self.expired = self.unloads = 0


class Residency:
    """The resident set of one simulated engine (the module docstring says the rules)."""

    def __init__(self, clock: IReactorTime, config: SimConfig) -> None:
        self.clock = clock
        self.config = config
        self.installed = tuple(config.models)
        self.stats = ResidencyStats()
        now = clock.seconds()
        initial = config.models if config.loaded is None else config.loaded
        self.loaded: OrderedDict[str, float] = OrderedDict((m, now) for m in initial)
        """Loaded model -> when it was last used (least recent first)."""
        self.running: dict[str, int] = {}
        self.keep: dict[str, float | None] = {}  # model -> its own keep-alive (None: ever)
        self.loading: str | None = None
        self.loadingSince = 0.0
        self._timer: IDelayedCall | None = None
        self._waiters: deque[_Waiter] = deque()
        self._dropWhenIdle: set[str] = set()
        self._loadMs = dict(config.loadMsPerModel)

    def loadSeconds(self, model: str) -> float:
        """How long loading ``model`` takes."""
        return self._loadMs.get(model, self.config.loadMs) / 1000.0

    def keepAlive(self, model: str) -> float | None:
        """Seconds ``model`` stays loaded once idle (None: for ever)."""
        return self.keep.get(model, self.config.keepAlive)

    def setKeepAlive(self, model: str, seconds: float | None) -> None:
        """``model``'s keep-alive from now on (an Ollama request's ``keep_alive``)."""
        if model in self.installed:
            self.keep[model] = seconds
            self._expire()

    def isLoaded(self, model: str) -> bool:
        """Whether ``model`` is loaded now (not merely loading)."""
        self._expire()
        return model in self.loaded

    def status(self, model: str) -> str:
        """``loaded``, ``loading`` or ``unloaded`` (llama-server router mode's words)."""
        if self.isLoaded(model):
            return "loaded"
        return "loading" if model == self.loading else "unloaded"

    def busy(self, model: str) -> bool:
        """Whether requests run on ``model`` (or wait for a slot holding it)."""
        return self.running.get(model, 0) > 0

    def loadedModels(self) -> list[tuple[str, float | None]]:
        """The models loaded now, least recently used first, each with when it unloads if
        left idle (None: never)."""
        self._expire()
        now = self.clock.seconds()
        out: list[tuple[str, float | None]] = []
        for model, used in self.loaded.items():
            keep = self.keepAlive(model)
            if keep is None or keep < 0:
                out.append((model, None))
            else:
                out.append((model, (now if self.busy(model) else used) + keep))
        return out

    # -- requests --

    def want(self, model: str, ready: Ready) -> Callable[[], None]:
        """Call ``ready(seconds waited)`` once ``model`` is loaded (at once when it is);
        returns a function that gives up waiting."""
        if self.isLoaded(model) and not self._waitingFor(model):
            self.loaded[model] = self.clock.seconds()
            self.loaded.move_to_end(model)
            ready(0.0)
            return lambda: None
        waiter = _Waiter(model, ready, self.clock.seconds())
        self._waiters.append(waiter)
        self._pump()

        def cancel() -> None:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

        return cancel

    def hold(self, model: str) -> None:
        """A request runs on ``model`` (it cannot be evicted until released)."""
        self.running[model] = self.running.get(model, 0) + 1
        if model in self.loaded:
            self.loaded[model] = self.clock.seconds()
            self.loaded.move_to_end(model)

    def release(self, model: str) -> None:
        """A request on ``model`` ended (it may now be evicted, and a load may start)."""
        left = self.running.get(model, 0) - 1
        if left > 0:
            self.running[model] = left
        else:
            self.running.pop(model, None)
            if model in self._dropWhenIdle:
                self._dropWhenIdle.discard(model)
                self._drop(model)
                self.stats.unloads += 1
        if model in self.loaded:
            self.loaded[model] = self.clock.seconds()
            self.loaded.move_to_end(model)
        self._pump()

    # -- management --

    def load(self, model: str, ready: Ready | None = None) -> bool:
        """Load ``model`` (an API's load); False when it is loaded or loading already."""
        if self.isLoaded(model) or model == self.loading or self._waitingFor(model):
            return False
        self._waiters.append(_Waiter(model, ready, self.clock.seconds()))
        self._pump()
        return True

    def unload(self, model: str) -> bool:
        """Unload ``model`` (an API's unload): at once when idle, else when its requests
        end; False when it is not loaded (a model still loading cannot be unloaded)."""
        if not self.isLoaded(model):
            return False
        if self.busy(model):
            self._dropWhenIdle.add(model)
            return True
        self._drop(model)
        self.stats.unloads += 1
        self._pump()
        return True

    def stop(self) -> None:
        """The engine stops: abandon the load in progress."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def statsDocument(self) -> dict[str, object]:
        """``/sim/stats``'s ``residency`` object."""
        return {
            "loads": self.stats.loads,
            "evictions": self.stats.evictions,
            "expired": self.stats.expired,
            "unloads": self.stats.unloads,
            "loaded": [m for m, _ in self.loadedModels()],
            "loading": self.loading,
            "waiting": len(self._waiters),
            "max_loaded": self.config.maxLoaded,
        }

    # -- the loader --

    def _waitingFor(self, model: str) -> bool:
        return any(w.model == model for w in self._waiters)

    def _drop(self, model: str) -> None:
        self.loaded.pop(model, None)
        self.keep.pop(model, None)

    def _expire(self) -> None:
        now = self.clock.seconds()
        for model, used in list(self.loaded.items()):
            keep = self.keepAlive(model)
            if keep is None or keep < 0 or self.busy(model) or self._waitingFor(model):
                continue
            if used + keep <= now:
                self._drop(model)
                self.stats.expired += 1

    def _pump(self) -> None:
        """Start the next load when none runs and there is (or can be made) room."""
        self._expire()
        while self.loading is None and self._waiters:
            model = self._waiters[0].model
            if model in self.loaded:
                self._serve(model)
                continue
            limit = self.config.maxLoaded
            while limit and len(self.loaded) >= limit:
                victim = next((m for m in self.loaded if not self.busy(m)), None)
                if victim is None:
                    return  # every resident model is busy: wait for one to go idle
                self._drop(victim)
                self.stats.evictions += 1
            self.loading, self.loadingSince = model, self.clock.seconds()
            self._timer = self.clock.callLater(self.loadSeconds(model), self._loaded)

    def _loaded(self) -> None:
        model, self.loading, self._timer = self.loading, None, None
        if model is None:
            return
        self.loaded[model] = self.clock.seconds()
        self.loaded.move_to_end(model)
        self.stats.loads += 1
        self._serve(model)
        self._pump()

    def _serve(self, model: str) -> None:
        """Hand ``model`` to everyone waiting for it (they hold it before anything else can
        evict it)."""
        now = self.clock.seconds()
        waiting = [w for w in self._waiters if w.model == model]
        for waiter in waiting:
            self._waiters.remove(waiter)
        for waiter in waiting:
            if waiter.ready is not None:
                waiter.ready(now - waiter.arrived)
