"""Builds under hostile conditions (issue 20): a compiler that never returns (E1706, its whole process tree
killed, nothing half-written left), leftovers of builds killed with SIGKILL (swept by the next build), the
cache deleted during a build, cache paths occupied by the wrong kind of file, an unwritable cache, and
tune-cache entries of the wrong shape."""
from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path

import pytest

import kumiko
from kumiko.diagnostics import KumikoError, KumikoWarning
from kumiko.plan import tune as tuning
from kumiko.plan.choose import choose_plans
from kumiko.plan.cost import Machine, candidates
from kumiko.region import form_regions
from kumiko.runtime import toolchain
from kumiko.runtime.cpu import DEFAULT_FLAGS, build_c, cache_key, compiler_version, cpu_features, forget_loaded
from kumiko.runtime.program import program_symbols
from kumiko.util import files

EXAMPLES = Path(__file__).parents[2] / "examples"
ANSWER = "KUMIKO_KERNEL answer(void** bufs, const long long* syms) { (void)bufs; (void)syms; return %d; }\n"


def source(tag: int) -> str:
    """A C unit no other test builds (so the build is never a cache hit)."""
    return '#include "kumiko_cpu.h"\n' + ANSWER % (tag % 100) + f"/* {os.getpid()} {time.time_ns()} */\n"


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A private cache and temporary directory; the version queries done with the real compilers first."""
    compiler_version()
    cache_key("", DEFAULT_FLAGS)                 # gcc -march=native's macros, cached
    monkeypatch.setenv("KUMIKO_CACHE", str(tmp_path / "cache"))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setattr(toolchain, "_swept", set())
    forget_loaded()
    yield tmp_path
    forget_loaded()


def fake_tool(bindir: Path, name: str, body: str) -> Path:
    """An executable ``name`` in ``bindir`` that answers version queries and otherwise runs ``body``."""
    bindir.mkdir(exist_ok=True)
    path = bindir / name
    path.write_text("#!/bin/sh\ncase \"$1\" in --version|-dumpmachine) echo 'fake 1.0'; exit 0;; esac\n" + body)
    path.chmod(0o755)
    return path


def gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for init counts: it runs no more)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] in ("Z", "X")
    except OSError:
        return True


def leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


# -- timeouts ----------------------------------------------------------------------------------------------

HANG = 'sleep 30 &\necho $! > "$KUMIKO_TEST_CHILD"\nwait\n'


@pytest.fixture
def hanging(sandbox, monkeypatch):
    """gcc, g++ and nvcc on PATH that start a child which sleeps, and wait for it; a 1 s build limit."""
    bindir = sandbox / "bin"
    for name in ("gcc", "g++", "nvcc"):
        fake_tool(bindir, name, HANG)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("KUMIKO_TEST_CHILD", str(sandbox / "child.pid"))
    monkeypatch.setenv("KUMIKO_BUILD_TIMEOUT", "1")
    return sandbox


def _expect_timeout(sandbox: Path, build) -> KumikoError:
    t0 = time.monotonic()
    with pytest.raises(KumikoError) as e:
        build()
    assert time.monotonic() - t0 < 15
    err = e.value
    assert err.code == "E1706"
    assert err.details["limit_s"] == 1 and err.details["knob"] == "KUMIKO_BUILD_TIMEOUT"
    assert "KUMIKO_BUILD_TIMEOUT" in err.render() and err.details["command"]
    child = int((sandbox / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while not gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(child), "the compiler's child process was left running"
    assert not [p for p in (sandbox / "tmp").iterdir() if p.name.startswith("kumiko-")], "scratch left behind"
    return err


def test_gcc_timeout(hanging):
    err = _expect_timeout(hanging, lambda: build_c(source(1), name="hang"))
    assert "gcc" in err.details["command"]
    assert leftovers(hanging / "cache") == []


def test_emulator_gxx_timeout(hanging):
    from kumiko.runtime.emu import build
    err = _expect_timeout(hanging, lambda: build("// nothing\n", name="hang"))
    assert "g++" in err.details["command"]
    assert leftovers(hanging / "cache") == []


def test_nvcc_timeouts(hanging):
    from kumiko.runtime.cubin import build_cubin
    from kumiko.runtime.ptxas import nvcc_compile
    assert "nvcc" in _expect_timeout(hanging, lambda: build_cubin("// nothing\n", "sm_80")).details["command"]
    assert "nvcc" in _expect_timeout(hanging, lambda: nvcc_compile("// nothing\n", "sm_80")).details["command"]
    assert leftovers(hanging / "cache") == []


def test_no_limit_when_the_knob_is_zero(sandbox, monkeypatch):
    monkeypatch.setenv("KUMIKO_BUILD_TIMEOUT", "0")
    assert build_c(source(2), name="nolimit").fn("answer")([], []) == 2


# -- leftovers of killed builds ------------------------------------------------------------------------------

def _age(path: Path, seconds: float) -> Path:
    t = time.time() - seconds
    os.utime(path, (t, t))
    return path


def test_stale_scratch_and_partial_files_are_swept(sandbox):
    tmp, root = sandbox / "tmp", sandbox / "cache" / "cpu"
    root.mkdir(parents=True)
    dead = 4194304 + 12345                       # above any pid_max: no such process
    hour = 2 * toolchain.STALE_S
    made = {
        "dead_old": (tmp / f"kumiko-build-{dead}-abc_12", True, hour),
        "old_format": (tmp / "kumiko-build-q1w2e3r4", True, hour),
        "dead_young": (tmp / f"kumiko-build-{dead}-young", True, 10),
        "alive_old": (tmp / f"kumiko-cubin-build-{os.getppid()}-xyz", True, hour),
        "not_ours": (tmp / "other-build-dir", True, hour),
        "failed_source": (tmp / "kumiko-failed-x-0123.c", False, hour),
        "partial_old": (root / ".abc.so.k2j3h4.tmp", False, hour),
        "partial_young": (root / ".def.so.k2j3h4.tmp", False, 10),
        "entry": (root / "0123.so", False, hour),
    }
    for path, is_dir, age in made.values():
        if is_dir:
            path.mkdir()
            (path / "x.c").write_text("int x;")
        else:
            path.write_text("x")
        _age(path, age)
    assert build_c(source(3), name="sweep").fn("answer")([], []) == 3
    left = {k for k, (p, _, _) in made.items() if p.exists()}
    assert left == {"dead_young", "alive_old", "not_ours", "failed_source", "partial_young", "entry"}


# -- the cache changing under a build ------------------------------------------------------------------------

def test_cache_deleted_during_the_build(sandbox, monkeypatch):
    """gcc runs while the whole cache is deleted: the build is published into a cache made again."""
    cache = sandbox / "cache"
    fake_tool(sandbox / "bin", "gcc", f'rm -rf "{cache}"\nexec /usr/bin/gcc "$@"\n')
    monkeypatch.setenv("PATH", f"{sandbox / 'bin'}{os.pathsep}{os.environ['PATH']}")
    build_c(source(0), name="warm")                          # the cache exists before the next build
    mod = build_c(source(4), name="deleted")
    assert mod.fn("answer")([], []) == 4 and mod.path.is_file()


def test_build_directory_deleted_during_the_build(sandbox, monkeypatch):
    """The scratch directory vanishes under gcc: E1502 naming it, not E1701 blaming the code generator."""
    fake_tool(sandbox / "bin", "gcc", 'rm -rf "$PWD"\nexec /usr/bin/gcc "$@"\n')
    monkeypatch.setenv("PATH", f"{sandbox / 'bin'}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(KumikoError) as e:
        build_c(source(5), name="vanish")
    assert e.value.code == "E1502" and "kumiko-build-" in e.value.at and "vanished" in e.value.why


def test_emulator_cache_deleted_during_the_build(sandbox, monkeypatch):
    """The emulator keeps its sources in the cache: deleted under g++, that is E1502 naming them, not E1701."""
    from kumiko.runtime.emu import build
    cache = sandbox / "cache"
    fake_tool(sandbox / "bin", "g++", f'rm -rf "{cache}"\nexec /usr/bin/g++ "$@"\n')
    monkeypatch.setenv("PATH", f"{sandbox / 'bin'}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(KumikoError) as e:
        build("// nothing\n", name="deleted")
    assert e.value.code == "E1502" and str(cache) in e.value.at and "vanished" in e.value.why


def test_emulator_library_built_once_for_threads_that_need_it_together(sandbox, monkeypatch):
    """Threads of one process that need the same emulator library at once build it once: two builds at once
    each cleared the name the other was writing (CI saw E1502 "it is a directory" from four threads calling
    one cuda-emu Executable for the first time)."""
    from kumiko.runtime.emu import build
    log = sandbox / "gxx.log"
    fake_tool(sandbox / "bin", "g++", f'echo "run $*" >> "{log}"\nsleep 0.3\nexec /usr/bin/g++ "$@"\n')
    monkeypatch.setenv("PATH", f"{sandbox / 'bin'}{os.pathsep}{os.environ['PATH']}")
    start, got, errors = threading.Barrier(4), [], []

    def worker() -> None:
        start.wait()
        try:
            got.append(build("// built together\n", name="together"))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not errors and len(got) == 4
    runs = log.read_text().splitlines()             # the library, and the emulator's precompiled header
    assert len([r for r in runs if "c++-header" not in r]) == 1 and len(runs) <= 2
    assert all(m.path == got[0].path and m.path.is_file() for m in got)


def test_entry_paths_occupied_by_directories(sandbox):
    src = source(6)
    key = cache_key(src, DEFAULT_FLAGS)
    root = files.cache_root("cpu")
    for suffix in (".so", ".json", ".c"):
        (root / f"{key}{suffix}" / "junk").mkdir(parents=True)
    mod = build_c(src, name="squatted")
    assert mod.fn("answer")([], []) == 6
    assert all((root / f"{key}{s}").is_file() for s in (".so", ".json", ".c"))
    forget_loaded()
    assert build_c(src, name="squatted").cached


def test_cache_is_a_file(sandbox, monkeypatch):
    blocker = sandbox / "blocker"
    blocker.write_text("not a directory")
    for where in (blocker, blocker / "sub"):
        monkeypatch.setenv("KUMIKO_CACHE", str(where))
        forget_loaded()
        with pytest.raises(KumikoError) as e:
            build_c(source(7), name="blocked")
        assert e.value.code == "E1502" and str(blocker) in e.value.why


def test_unwritable_cache_builds_in_a_temporary_directory(sandbox, monkeypatch):
    ro = sandbox / "readonly"
    ro.mkdir()
    ro.chmod(0o555)
    if os.geteuid() == 0:                        # permissions do not stop root: refuse the write as they would
        real = files._probe

        def probe(root: Path) -> None:
            if ro in (root, *root.parents):
                raise PermissionError(13, "Permission denied", str(root))
            real(root)
        monkeypatch.setattr(files, "_probe", probe)
    monkeypatch.setenv("KUMIKO_CACHE", str(ro))
    forget_loaded()
    try:
        with pytest.warns(KumikoWarning, match="not writable|cannot write"):
            mod = build_c(source(8), name="readonly")
        assert mod.fn("answer")([], []) == 8
        assert ro not in mod.path.parents and mod.path.is_file()
    finally:
        ro.chmod(0o755)


# -- the tune cache ----------------------------------------------------------------------------------------

def _gemm():
    g = kumiko.load(EXAMPLES / "gemm_bias_relu.kumiko")
    program = form_regions(g.tiny)
    plans = dict(choose_plans(program, program_symbols(program), cpu_features()))
    return g, program, plans


@pytest.mark.parametrize("bad", ["[]", '{"plan": 5}', '{"plan": {}}', '{"plan": {"arch": "cpu_avx2", "x": 1}}',
                                 '{"plan": {"arch": "cpu_avx2", "algo": "packed", "micro": 5}}', '"plan"', "null"])
def test_tune_entries_of_the_wrong_shape_are_misses(sandbox, bad):
    """Valid JSON that is not ``{"plan": {...}}`` of a candidate: a plain compile ignores it, tuning
    overwrites it."""
    g, program, plans = _gemm()
    env, compiler = dict(g.tiny.symbols), compiler_version()
    keys = {r.name: tuning.tune_key(r, env, plans[r.name].arch, compiler) for r in program.regions}
    tune_dir = files.cache_root("tune")
    for key in keys.values():
        (tune_dir / f"{key}.json").write_text(bad)
        assert tuning.cached_plan(key) is None or bad.startswith('{"plan": {"arch"')
    exe = kumiko.compile(g, "cpu")                           # no traceback, the default plans
    ins = exe.random_inputs(0)
    assert exe(**ins)["C2"].shape == (256, 128)
    r = next(r for r in program.regions if len(candidates(plans[r.name], Machine())) > 1)
    cands = candidates(plans[r.name], Machine())
    out = tuning.tune(program, plans, env, cpu_features(), compiler,
                      lambda trial: 0.5 if trial[r.name] == cands[-1] else 1.0, report=lambda *a: None)
    assert out[r.name] == cands[-1]
    assert json.loads((tune_dir / f"{keys[r.name]}.json").read_text())["plan"] == cands[-1].to_json()


def test_tune_entry_occupied_by_a_directory(sandbox):
    g, program, plans = _gemm()
    env, compiler = dict(g.tiny.symbols), compiler_version()
    r = next(r for r in program.regions if len(candidates(plans[r.name], Machine())) > 1)
    key = tuning.tune_key(r, env, plans[r.name].arch, compiler)
    (files.cache_root("tune") / f"{key}.json" / "junk").mkdir(parents=True)
    assert tuning.cached_plan(key) is None
    cands = candidates(plans[r.name], Machine())
    tuning.tune(program, plans, env, cpu_features(), compiler,
                lambda trial: 0.5 if trial[r.name] == cands[1] else 1.0, report=lambda *a: None)
    assert tuning.cached_plan(key) == cands[1]

