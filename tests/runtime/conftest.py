"""Runtime tests build into a private cache directory, never the user's ``~/.cache/kumiko``."""
import pytest

from kumiko.runtime.cpu import forget_loaded


@pytest.fixture(autouse=True, scope="session")
def _private_cpu_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("KUMIKO_CACHE", str(tmp_path_factory.mktemp("kumiko-cache")))
    forget_loaded()
    yield
    mp.undo()
    forget_loaded()
