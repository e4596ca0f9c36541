"""nvpair-proxy's tests: unit tests on injected reactors, integration tests on the real process.

Under CI (``CI`` set) hypothesis runs derandomized, so a property test cannot turn red on
a run that changed nothing; locally it explores new examples every run.
"""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
