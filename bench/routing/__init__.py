"""The placement benchmark: a seeded multi-tenant chat workload through each router.

``python -m bench.routing`` (see ``__main__``) starts four simulated llama.cpp engines
(``nvpair.proxy.testing.simengine``), fresh for each router, replays the same workload
through each router in turn and writes the "Placement: multi-tenant chat" section of
``bench/RESULTS.md``. The modules: ``workload`` (the seeded conversations), ``client``
(replaying them, timing the first content token), ``routers`` (starting each router and
the engines) and ``report`` (the figures and the markdown).
"""
