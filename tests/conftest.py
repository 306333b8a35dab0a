"""Settings for the whole test session.

Hypothesis draws new examples on every run. Under CI (``CI=true``, as the CI runner sets it) the draws are
derandomized: the examples depend only on each test's source, so a commit that passed CI passes it again
and a red run points at the change, not at a lucky draw. Developers' runs keep drawing anew; a failure
found there prints its reproduction blob (``@reproduce_failure``) and belongs in a regression test.
"""
import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
    settings.load_profile("ci")

# the program cache (kumiko.pipeline.cache) would hand a test that patches a stage the program an earlier
# test compiled; tests/test_program_cache.py turns it on for itself
os.environ.setdefault("KUMIKO_PROGRAM_CACHE", "0")
