"""Shared fixtures, and the hypothesis profile.

`make test` and CI run hypothesis derandomized (profile "ci": the same examples every run, no
example database), so a red run is reproducible from a clean checkout. Set
HYPOTHESIS_PROFILE=explore to draw fresh random examples (and keep them in .hypothesis/); a
counterexample found that way is pinned as a test (tests/test_split_path.py shows one).
"""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
