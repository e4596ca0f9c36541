"""``python -m nvpair.proxy.testing.simengine``: run a simulated engine (see ``cli``)."""

from nvpair.proxy.testing.simengine.cli import main

main()
