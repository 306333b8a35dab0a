"""The program cache: a plain cpu compile of a program compiled before runs no stage (its region program,
plans and library come from ``<KUMIKO_CACHE>/program``) and computes the same; anything the result depends
on changes the key; compiles that want more than the binary bypass it; a bad entry is a miss."""
import numpy as np
import pytest

import kumiko
from kumiko.pipeline import cache as program_cache
from kumiko.tensor import Tensor

RNG = np.random.default_rng(5)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    from kumiko.util.files import forget_roots
    monkeypatch.setenv("KUMIKO_CACHE", str(tmp_path))
    monkeypatch.setenv("KUMIKO_PROGRAM_CACHE", "1")
    forget_roots()
    yield tmp_path / "program"
    forget_roots()


def _graph(scale=2.0, n=33):
    w = Tensor(RNG.standard_normal((n, 17)).astype(np.float32), name="w", role="param")
    x = Tensor.input("x", (5, n))
    return ((x @ w) * scale).relu().graph("y")


def _no_stages(monkeypatch):
    import kumiko.pipeline as pl

    def boom(*a, **k):
        raise AssertionError("a stage ran")
    monkeypatch.setitem(pl.STAGE_FNS, "region", boom)


def test_a_second_compile_runs_no_stage_and_computes_the_same(cache, monkeypatch):
    g = _graph()
    x = RNG.standard_normal((5, 33)).astype(np.float32)
    first = kumiko.compile(g, "cpu")
    assert len(list(cache.glob("*.pkl"))) == 1
    _no_stages(monkeypatch)
    again = kumiko.compile(g, "cpu")
    assert again.compilation.region is not None and again.compilation.plan
    want = kumiko.compile(g, "eval")(x=x)["y"]
    for exe in (first, again):
        np.testing.assert_allclose(exe(x=x)["y"], want, rtol=1e-5, atol=1e-5)


def test_what_the_result_depends_on_changes_the_key(cache, monkeypatch):
    g = _graph()
    tiny, opts = g.tiny, kumiko.backend.backend("cpu").options({})
    base = program_cache.key(tiny, "cpu", opts, {"w": 0})
    assert program_cache.key(_graph(scale=3.0).tiny, "cpu", opts, {"w": 0}) != base      # a constant in the graph
    assert program_cache.key(_graph(n=34).tiny, "cpu", opts, {"w": 0}) != base            # a shape
    assert program_cache.key(tiny, "cpu", opts, {}) != base                               # what is bound
    assert program_cache.key(tiny, "cpu", kumiko.backend.backend("cpu").options({"shapes": {"M": 3}}),
                             {"w": 0}) != base                                           # an option
    real = program_cache.source_digest()
    monkeypatch.setattr(program_cache, "source_digest", lambda: real[::-1])     # the compiler's source changed
    assert program_cache.key(tiny, "cpu", opts, {"w": 0}) != base


def test_dumps_tuning_and_the_knob_bypass_it(cache, monkeypatch, tmp_path):
    g = _graph()
    kumiko.compile(g, "cpu", plans=None)
    n = len(list(cache.glob("*.pkl")))
    monkeypatch.setenv("KUMIKO_DUMP", str(tmp_path / "dump"))
    exe = kumiko.compile(g, "cpu")
    assert exe.compilation.indexbook is not None and exe.compilation.kernel is not None    # every stage ran
    monkeypatch.delenv("KUMIKO_DUMP")
    kumiko.compile(Tensor.input("x", (3, 8)).relu().graph("y"), "cpu", tune=True)
    assert not list(cache.glob("*.pkl"))          # tuned winners may change any cached program's plans
    kumiko.compile(g, "cpu")
    monkeypatch.setenv("KUMIKO_PROGRAM_CACHE", "0")
    _no_stages(monkeypatch)
    with pytest.raises(AssertionError, match="a stage ran"):
        kumiko.compile(g, "cpu")
    assert len(list(cache.glob("*.pkl"))) == n


def test_a_bad_entry_is_a_miss_and_is_replaced(cache):
    g = _graph()
    x = RNG.standard_normal((5, 33)).astype(np.float32)
    kumiko.compile(g, "cpu")
    (entry,) = cache.glob("*.pkl")
    entry.write_bytes(b"not a pickle")
    exe = kumiko.compile(g, "cpu")
    assert exe.compilation.kernel is not None                     # compiled again
    np.testing.assert_allclose(exe(x=x)["y"], kumiko.compile(g, "eval")(x=x)["y"], rtol=1e-5, atol=1e-5)
    assert entry.read_bytes() != b"not a pickle"
