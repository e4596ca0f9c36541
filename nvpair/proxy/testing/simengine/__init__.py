"""A simulated inference engine: slots, a FIFO, an LRU prefix cache and simulated costs.

It speaks llama.cpp's, LM Studio's or Ollama's dialect, with their state endpoints
(``/slots``, ``/metrics``, ``/api/ps``, ``/api/v0/models``) and their way of reporting
cached prompt tokens, so placement, queueing and failure handling can be tested on a clock
and measured in benchmarks. In a test::

    engine = SimEngine(MemoryReactorClock(), SimConfig(slots=2, prefillMs=1, decodeMs=10))
    engine.listen()

As a process: ``python -m nvpair.proxy.testing.simengine --port 0 --slots 2`` (see ``cli``;
it prints ``{"port": N, "url": ...}`` once listening).

The modules: ``tokens`` (tokenizer, template, block digests), ``cache`` (the LRU of
blocks), ``slots`` (slots and FIFO), ``run`` (one request's timeline), ``replies`` (answer
bodies and usage per dialect), ``state`` (state and probe documents), ``routes`` and
``control`` (what each path does), ``engine`` and ``cli``.
"""

from nvpair.proxy.testing.simengine.cache import PrefixCache
from nvpair.proxy.testing.simengine.cli import configFromArgs, engineFromArgs, main
from nvpair.proxy.testing.simengine.config import DIALECTS, Failure, SimConfig
from nvpair.proxy.testing.simengine.engine import SimEngine
from nvpair.proxy.testing.simengine.slots import Job, Slots

__all__ = [
    "DIALECTS",
    "Failure",
    "Job",
    "PrefixCache",
    "SimConfig",
    "SimEngine",
    "Slots",
    "configFromArgs",
    "engineFromArgs",
    "main",
]
