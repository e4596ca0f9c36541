"""``python -m nvpair.proxy.testing.fakeengine``: run a fake engine (see ``cli``)."""

from nvpair.proxy.testing.fakeengine.cli import main

main()
