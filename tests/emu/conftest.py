"""Shared fixtures for the CUDA emulator tests: kernel sources and builds made once per session.

The kernels under ``kernels/`` are hand-written CUDA (the code generator does not exist yet). Every
library is built once, into a private cache (never the user's ``~/.cache/kumiko``), two at a time
in the background, because g++ on the emulator header is the slow part of these tests; launches
then choose the cp.async mode and the scheduler at run time.
"""
from __future__ import annotations

import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from kumiko.accuracy import rel_l2  # noqa: F401  (the tests import it from here)
from kumiko.runtime.emu import CONFIGS, EmuConfig, EmuModule, build

KERNELS = Path(__file__).parent / "kernels"
#: dynamic shared memory of gemm_sm80.cu: STAGES * (BM*(BK+8) + BK*(BN+8)) halves
GEMM_SMEM = 3 * (128 * 40 + 32 * 136) * 2

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulator needs g++")


def kernel_source(name: str) -> str:
    return (KERNELS / name).read_text()


#: (source file, build name, config, defines) of every library the tests use
_BUILDS = {
    "fragments": ("fragments.cu", "fragments", CONFIGS["deferred+round_robin"], None),
    "semantics": ("semantics.cu", "semantics", CONFIGS["deferred+round_robin"], None),
    "faults": ("faults.cu", "faults", CONFIGS["deferred+round_robin"], None),
    "faults_asan": ("faults.cu", "faults", CONFIGS["asan"], None),
    "gemm": ("gemm_sm80.cu", "gemm_sm80", CONFIGS["deferred+round_robin"], {"GEMM_INJECT_BUGS": None}),
    "gemm_asan": ("gemm_sm80.cu", "gemm_sm80", CONFIGS["asan"], {"GEMM_INJECT_BUGS": None}),
}


@pytest.fixture(scope="session")
def emu_cache(tmp_path_factory) -> Path:
    """A private KUMIKO_CACHE for the session."""
    path = tmp_path_factory.mktemp("kumiko-emu-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("KUMIKO_CACHE", str(path))
    yield path
    mp.undo()


@pytest.fixture(scope="session")
def _build_pool(emu_cache):
    if shutil.which("g++") is None:
        yield {}
        return
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures: dict[str, Future] = {
            key: pool.submit(build, kernel_source(src), cfg, name=name, defines=defs)
            for key, (src, name, cfg, defs) in _BUILDS.items()
        }
        yield futures


@pytest.fixture(scope="session")
def emu_module(_build_pool):
    """``emu_module("gemm")`` -> the built EmuModule (waits for its background build)."""
    def get(key: str, config: EmuConfig | None = None) -> EmuModule:
        if key not in _build_pool:
            pytest.skip("the CUDA emulator needs g++")
        mod = _build_pool[key].result()
        return mod if config is None else mod.with_config(config)
    return get
