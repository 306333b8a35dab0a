"""What keeps a whole network's cpu build short: kernels that are the same function are emitted once, the
program is compiled as one translation unit per distinct kernel by parallel gcc processes, and every
object is cached, so an identical graph compiles nothing and a changed layer compiles one object.

No timings here: the counters of ``kumiko.runtime.cpu.STATS`` say what was compiled."""
import json

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.backend.cpu import CpuBackend, choose_cpu_plans
from kumiko.diagnostics import KumikoError
from kumiko.region import form_regions
from kumiko.render.cpu_program import canonical_kernel, lift_constants, render_cpu_source
from kumiko.runtime import cpu as cpu_rt
from kumiko.runtime import host
from kumiko.runtime.program import CpuProgram


def chain(couts, name="y", xname="x", size=10):
    """Convolutions with ReLU, one per entry of ``couts`` (output channels), 3x3 with padding 1."""
    x = Tensor.input(xname, (2, 4, size, size))
    h, c = x, 4
    for i, co in enumerate(couts):
        h = h.conv2d(Tensor.input(f"w{i}", (co, c, 3, 3)), padding=1).relu()
        c = co
    return h.graph(name)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty cache of this test's own, and nothing loaded: the counters see every build."""
    monkeypatch.setenv("KUMIKO_CACHE", str(tmp_path))
    cpu_rt.forget_loaded()
    yield tmp_path / "cpu"
    cpu_rt.forget_loaded()


def compile_counting(g, layout="as_given"):
    """kumiko.compile(g, "cpu") as a new process would (nothing loaded), and how the counters moved. The
    graph's own layouts by default: what is compiled here is the program ``rendered`` renders (channels-last
    convs have a first and a last layer of their own: ``test_identical_layers_share_one_function``)."""
    before = dict(cpu_rt.STATS)
    cpu_rt.forget_loaded()
    exe = kumiko.compile(g, "cpu", layout=layout)
    return exe, {k: cpu_rt.STATS[k] - before[k] for k in before}


def check_against_eval(g, exe, seed=0):
    ins = exe.random_inputs(seed)
    out, want = exe(**ins), kumiko.compile(g, "eval")(**ins)
    for k in want:
        a, b = np.asarray(out[k], np.float64), np.asarray(want[k], np.float64)
        assert a.shape == b.shape
        assert np.linalg.norm(a - b) <= 1e-5 * max(np.linalg.norm(b), 1e-30), k     # deep chains grow large


def functions(source: str) -> int:
    return source.count("\nint kumiko_")


def rendered(g):
    program = form_regions(g.tiny, **CpuBackend().formation())     # as the cpu target forms them
    return program, render_cpu_source(program, choose_cpu_plans(g.tiny, program, None, cpu_rt.cpu_features()))


# ------------------------------------------------------------------------------------------------
# one function for identical kernels

def test_identical_layers_share_one_function(fresh_cache):
    g = chain([4, 4, 4])
    exe = kumiko.compile(g, "cpu", layout="as_given")
    run = exe._run
    fns = [s.fn for s in run.runner.steps]
    assert len(run.program.regions) == 3 and len(fns) == 3
    # the first conv reads the graph input before its weights (other buffer positions): its own function;
    # the second and third are the same function with other buffers
    assert fns[1] == fns[2] != fns[0]
    assert functions(run.source) == 2
    check_against_eval(g, exe)
    # channels-last between the convs: the first reads the image as given, the last writes the graph's output
    # channels-first, the ones between are one function
    g = chain([4, 4, 4, 4])
    run = kumiko.compile(g, "cpu")._run
    fns = [s.fn for s in run.runner.steps]
    assert len(fns) == 4 and fns[1] == fns[2] and len({fns[0], fns[1], fns[3]}) == 3
    assert functions(run.source) == 3


def test_layers_whose_epilogue_reduces_share_one_function(fresh_cache):
    """A matmul whose epilogue normalises its rows (a LayerNorm after a residual, BERT's) runs its sums into a
    scratch array first: the array's name comes from the layer's nodes, yet the layers after the first are one
    function (the name had been Raw text the canonical form does not see: BERT-base compiled each of its 12
    layers' two such kernels apart, 30 units instead of 8)."""
    rng = np.random.default_rng(3)
    h = Tensor.input("x", (16, 32))
    for i in range(3):
        w = Tensor((rng.standard_normal((32, 32)) / 6).astype(np.float32), name=f"w{i}", role="param")
        y = h @ w + h
        d = y - y.mean(-1, keepdim=True)
        h = d * ((d * d).mean(-1, keepdim=True) + 1e-5).rsqrt()
    g = h.graph("y")
    exe = kumiko.compile(g, "cpu")
    fns = [s.fn for s in exe._run.runner.steps]
    assert len(fns) == 3 and fns[1] == fns[2] and "kumiko_tmp_alloc" in exe._run.source
    check_against_eval(g, exe)


def test_shared_function_keeps_the_first_kernels_text():
    program, c = rendered(chain([4, 4, 4]))
    kept = c.steps[1].fn
    assert f"int {kept}(" in c.source
    assert f"int {c.steps[0].fn}(" in c.source
    # the dropped copy's name is nowhere; the kept one has its comments (the notes of its region)
    assert "kumiko_2_" not in c.source
    assert "/* root " in c.source.split(f"int {kept}(")[0].rsplit("}", 1)[-1]
    assert c.names == {r.name: s.fn for s in c.steps for r in program.regions if r.name in s.regions}


def test_rendering_is_deterministic():
    g = chain([4, 6, 6, 4])
    _, a = rendered(g)
    _, b = rendered(g)
    assert a == b


def test_different_kernels_are_not_merged():
    """Other sizes are other functions, even where only a constant differs."""
    _, c = rendered(chain([4, 6, 8]))
    assert functions(c.source) == 3 and len({s.fn for s in c.steps}) == 3


def test_canonical_form_renames_locals_and_the_function_only():
    from kumiko.kernel.loops import Decl, Kernel, Param, Store
    def kern(name, local):
        body = (Decl("float", local, "b0[0] * 2.0f"), Store("b1", "0", f"kk_maxf({local}, 0.0f)"))
        return Kernel(name, (Param("b0", "float", True), Param("b1", "float", False)), (), body, notes=(name,))
    from kumiko.render.c import render_kernel
    a, b = kern("kumiko_0_a", "v_v_n5"), kern("kumiko_7_b", "v_v_n93")
    ca, cb = (canonical_kernel(render_kernel(k), k) for k in (a, b))
    assert ca == cb and "kumiko_fn(" in ca and "v_v_n" not in ca and "/*" not in ca
    assert "kk_maxf" in ca                                  # a name the kernel does not declare stays
    c = Kernel("kumiko_1_c", a.params, (), (Decl("float", "v_v_n5", "b0[0] * 3.0f"),) + a.body[1:])
    assert canonical_kernel(render_kernel(c), c) != ca


# ------------------------------------------------------------------------------------------------
# the parallel build and its cache

def test_parallel_build_matches_the_evaluator(fresh_cache):
    x = Tensor.input("x", (2, 4, 12, 12))
    h = x.conv2d(Tensor.input("w0", (8, 4, 3, 3)), padding=1).relu()
    h = h.conv2d(Tensor.input("w1", (8, 8, 3, 3)), padding=1).relu().max_pool2d(2, 2)
    h = h.conv2d(Tensor.input("w2", (8, 8, 3, 3)), padding=1).relu()
    g = (h.sum(axis=3).softmax(-1)).graph("y")
    exe, moved = compile_counting(g)
    assert moved["objects_compiled"] >= 3 and moved["links"] == 1 and moved["compiles"] == 1
    check_against_eval(g, exe)
    check_against_eval(g, exe, seed=1)


def test_program_source_still_builds_as_one_unit(fresh_cache):
    """``build_c`` on the whole program's source (the single-unit path) gives the same results."""
    g = chain([4, 4, 6])
    program, c = rendered(g)
    exe = kumiko.compile(g, "cpu", layout="as_given")
    one = CpuProgram(program, cpu_rt.build_c(c.source, name="one_unit"), c.names, steps=c.steps)
    ins = exe.random_inputs(0)
    args = {k: np.ascontiguousarray(v) for k, v in ins.items()}
    want = exe(**ins)
    got = one(args, {})
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_second_compile_of_an_identical_graph_compiles_nothing(fresh_cache):
    g = chain([4, 4, 6])
    _, first = compile_counting(g)
    assert first["objects_compiled"] >= 3 and first["compiles"] == 1
    exe, second = compile_counting(g)
    assert second["objects_compiled"] == 0 and second["links"] == 0 and second["compiles"] == 0
    assert second["objects_cached"] == 0            # the library itself was in the cache: no object looked at
    assert second["disk_hits"] == 1 and exe._run.module.cached
    before = dict(cpu_rt.STATS)
    kumiko.compile(g, "cpu", layout="as_given")      # same process: the loaded module
    assert cpu_rt.STATS["memory_hits"] == before["memory_hits"] + 1
    assert cpu_rt.STATS["objects_compiled"] == before["objects_compiled"]
    check_against_eval(g, exe)


def test_changing_one_layer_recompiles_one_object(fresh_cache):
    _, first = compile_counting(chain([4, 4, 4, 4]))
    exe, moved = compile_counting(chain([4, 4, 4, 6]))
    assert moved["objects_compiled"] == 1 and moved["objects_cached"] == first["objects_compiled"]
    assert moved["links"] == 1
    check_against_eval(chain([4, 4, 4, 6]), exe)


def test_a_network_sharing_kernels_compiles_none_of_them(fresh_cache):
    """Another graph (more layers: other node names, other positions) made of the same kernels: linked from
    cached objects only."""
    compile_counting(chain([4, 4, 4]))
    g = chain([4, 4, 4, 4, 4], name="z", xname="image")
    exe, moved = compile_counting(g)
    assert moved["objects_compiled"] == 0 and moved["links"] == 1
    check_against_eval(g, exe)


def test_corrupt_cached_object_is_rebuilt(fresh_cache):
    g = chain([4, 6])
    exe, first = compile_counting(g)
    objects = sorted(fresh_cache.glob("*.o"))
    assert len(objects) == first["objects_compiled"]
    victim = max(objects, key=lambda p: p.stat().st_size)
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])                      # truncated, its sidecar intact
    other = next(p for p in objects if p != victim)
    other.with_suffix(".json").unlink()                              # an object without its sidecar
    exe._run.module.path.unlink()                                    # the library must be linked again
    exe2, moved = compile_counting(g)
    assert moved["objects_compiled"] == 2 and moved["rebuilt_corrupt"] == 2 and moved["links"] == 1
    assert len(victim.read_bytes()) == json.loads(victim.with_suffix(".json").read_text())["size"]
    check_against_eval(g, exe2)


def test_no_temporaries_left_and_sidecars_beside_each_entry(fresh_cache):
    exe, _ = compile_counting(chain([4, 6]))
    names = [p.name for p in fresh_cache.iterdir()]
    assert not [n for n in names if n.startswith(".") or n.endswith(".tmp")]
    for p in fresh_cache.glob("*.o"):
        info = json.loads(p.with_suffix(".json").read_text())
        assert info["size"] == p.stat().st_size and p.with_suffix(".c").is_file()
    assert json.loads(exe._run.module.path.with_suffix(".json").read_text())["objects"]


# ------------------------------------------------------------------------------------------------
# build_units itself

UNIT = """int %s(void** bufs, const long long* syms) {
  float* y = (float*)bufs[0];
  for (long long i = 0; i < syms[0]; ++i) y[i] = (float)i * %s;
  return 0;
}
"""


def test_build_units_links_many_units_with_aliases(fresh_cache):
    units = [UNIT % (f"k{i}", f"{i}.0f") for i in range(5)]
    mod = cpu_rt.build_units(units, name="many", jobs=3, aliases=[("scale_by_two", "k2")])
    for i in range(5):
        y = np.zeros(4, np.float32)
        assert mod.fn(f"k{i}")([y], [4]) == 0
        np.testing.assert_array_equal(y, np.arange(4, dtype=np.float32) * i)
    y = np.zeros(3, np.float32)
    mod.fn("scale_by_two")([y], [3])
    np.testing.assert_array_equal(y, [0, 2, 4])


def test_a_unit_that_does_not_compile_is_e1701_and_leaves_no_entry(fresh_cache):
    good = UNIT % ("fine", "1.0f")
    bad = "int broken(void** bufs, const long long* syms) { return undeclared_name; }\n"
    with pytest.raises(KumikoError) as e:
        cpu_rt.build_units([good, bad], name="broken_units", jobs=2)
    assert e.value.code == "E1701" and "undeclared_name" in str(e.value)
    assert not list(fresh_cache.glob("*.so"))
    bad_key = cpu_rt.cache_key(bad, cpu_rt.unit_flags(cpu_rt.DEFAULT_FLAGS)[0])
    assert not (fresh_cache / f"{bad_key}.o").exists()


def test_shared_state_is_defined_once():
    """The contraction helpers' per-thread scratch is one definition for the whole library (the kernels share
    it, as in one unit), hidden from other libraries."""
    _, c = rendered(chain([4, 4]))
    defining = [u for u in c.units if "_Thread_local void* kk_scratch_p" in u and "extern" not in
                u.split("kk_scratch_p")[0].rsplit("\n", 1)[-1]]
    assert len(defining) == 1 and "visibility(\"hidden\")" in defining[0]
    assert all("extern __attribute__((visibility(\"hidden\"))) _Thread_local void* kk_scratch_p" in u
               for u in c.units if u is not defining[0] and "kk_scratch(" in u)


def test_precompiled_prefix_is_built_once_and_reused(fresh_cache, monkeypatch):
    monkeypatch.setattr(cpu_rt, "_PCH_MIN_UNITS", 1)
    exe, first = compile_counting(chain([4, 6]))
    assert first["pch_compiled"] == 1 and len(list(fresh_cache.glob("*.gch"))) == 1
    check_against_eval(chain([4, 6]), exe)
    g = chain([4, 8])
    exe, second = compile_counting(g)
    assert second["pch_compiled"] == 0 and second["pch_cached"] == 1 and second["objects_compiled"] >= 1
    check_against_eval(g, exe)


def test_a_network_begins_its_precompiled_header_before_its_python_stages(fresh_cache, monkeypatch):
    """A program with reductions enough (``PCH_EARLY_REDUCES``) has its precompiled header begun when the compile
    starts, on another thread; the build then takes it from the cache (built once, not twice) and the answers
    are the evaluator's. A small program begins none."""
    from kumiko.backend import cpu as cpu_be
    from kumiko.render.c import render_unit
    began = []
    real = cpu_be.start_precompiled
    monkeypatch.setattr(cpu_be, "start_precompiled", lambda *a, **k: began.append(real(*a, **k)) or began[-1])
    monkeypatch.setattr(cpu_rt, "_PCH_MIN_UNITS", 1)
    small = chain([4, 6])
    compile_counting(small)
    assert began == []                                  # 2 reductions: below PCH_EARLY_REDUCES
    monkeypatch.setattr(cpu_be, "PCH_EARLY_REDUCES", 2)
    g = chain([4, 6, 5])
    cpu_rt.forget_loaded()
    for gch in fresh_cache.glob("*.gch"):
        gch.unlink()
    exe, counts = compile_counting(g)
    assert began == [True]
    assert counts["pch_compiled"] == 1 and counts["pch_cached"] == 1 and len(list(fresh_cache.glob("*.gch"))) == 1
    check_against_eval(g, exe)
    assert not cpu_rt._pch_early                         # nothing left in flight
    assert cpu_rt.start_precompiled(render_unit([])) is False      # in the cache now: nothing to begin


def test_errors_in_a_unit_after_the_prefix_keep_their_line_numbers(fresh_cache, monkeypatch):
    """A unit compiled with its prefix precompiled reports the line of the source that is kept for the report."""
    from kumiko.render.c import render_unit
    monkeypatch.setattr(cpu_rt, "_PCH_MIN_UNITS", 1)
    prefix = render_unit([])
    bad = prefix + "int bad_line(void** bufs, const long long* syms) {\n  return nope;\n}\n"
    line = bad.splitlines().index("  return nope;") + 1
    with pytest.raises(KumikoError) as e:
        cpu_rt.build_units([prefix + UNIT % ("ok_line", "1.0f"), bad], prefix=prefix, name="lines", jobs=2)
    assert f".c:{line}:" in str(e.value)


def test_a_warm_compile_runs_no_gcc(fresh_cache, monkeypatch):
    """Everything cached, in a new process (nothing loaded, no compiler query remembered in memory): the
    compiler's version and -march=native's macros come from the cache too, and gcc is never started."""
    queries = (host.compiler_version, host.native_macros, host._toolchain_file)
    g = chain([4, 6])
    for f in queries:
        f.cache_clear()                 # as in a first process on this cache: the queries are asked and kept
    compile_counting(g)
    for f in queries:
        f.cache_clear()

    def no_gcc(cmd, **kw):
        raise AssertionError(f"gcc ran in a warm compile: {cmd}")
    monkeypatch.setattr(cpu_rt, "run_tool", no_gcc)
    monkeypatch.setattr(host, "run_tool", no_gcc)
    try:
        exe, moved = compile_counting(g)
    finally:
        for f in queries:
            f.cache_clear()
    assert moved["disk_hits"] == 1 and moved["objects_compiled"] == 0
    check_against_eval(g, exe)


def test_a_damaged_compiler_memo_is_asked_again(fresh_cache):
    queries = (host.compiler_version, host.native_macros, host._toolchain_file)
    try:
        for f in queries:
            f.cache_clear()
        version, macros = host.compiler_version(), host.native_macros()
        memo = host._toolchain_file()
        assert memo is None or json.loads(memo.read_text())["compiler_version"] == version
        if memo is None:
            pytest.skip("no /proc/cpuinfo: the compiler is asked in every process")
        for junk in ("not json", json.dumps(["a list"]), json.dumps({"compiler_version": 3, "native_macros": "x"})):
            memo.write_text(junk)
            for f in queries:
                f.cache_clear()
            assert host.compiler_version() == version and host.native_macros() == macros
            assert json.loads(memo.read_text())["compiler_version"] == version
    finally:
        for f in queries:
            f.cache_clear()


# ------------------------------------------------------------------------------------------------
# flags by kind of unit

def test_each_kind_of_unit_gets_its_flags(fresh_cache):
    """A contraction with a pointwise epilogue builds at -O1 with the vectoriser (``UNIT_FLAGS``), a constant
    operand's pack function at plain -O1, one whose epilogue reduces (a softmax's rows) and a loop nest at the
    default -O3; every object's sidecar says what it was built with, and the answers are the evaluator's."""
    rng = np.random.default_rng(3)
    x, w, b = Tensor.input("x", (40, 96)), Tensor.input("w", (96, 72)), Tensor.input("b", (72,))
    w2 = Tensor(rng.standard_normal((72, 72)).astype(np.float32), name="w2", role="param")    # bound: packed once
    h = (x @ w + b).relu()
    s = (h @ w2).softmax(-1)
    g = (s.exp() * 2.0).sum(axis=0).graph("y")
    program = form_regions(g.tiny, **CpuBackend().formation())     # as the cpu target forms them
    consts = frozenset({"w2"})
    c = render_cpu_source(program, choose_cpu_plans(g.tiny, program, None, cpu_rt.cpu_features(),
                                                    constants=consts), constants=consts)
    kinds = dict(zip(c.units, c.unit_kinds))
    assert {"contraction", "contraction+reduce", "loops", "pack"} <= set(kinds.values())
    exe, _ = compile_counting(g)
    check_against_eval(g, exe)
    seen = set()
    want = {k: list(v) for k, v in cpu_rt.UNIT_FLAGS.items()}
    assert want["pack"] == ["-O1"] and "-O1" in want["contraction"]
    for obj in fresh_cache.glob("*.o"):
        unit = obj.with_suffix(".c").read_text()
        flags = json.loads(obj.with_suffix(".json").read_text())["flags"]
        kind = kinds[unit]
        own = want.get(kind)
        assert flags[-len(own):] == own if own else "-O1" not in flags and "-O3" in flags, (kind, flags)
        seen.add(kind)
    assert seen == set(kinds.values())


def test_the_pack_functions_of_a_program_share_one_unit(fresh_cache):
    """Bound weights of three convs and a matmul: their pack functions (one per distinct constant operand)
    are one unit of kind "pack" between them, built at the pack flags; each contraction keeps a unit of its
    own; the answers are the evaluator's."""
    rng = np.random.default_rng(5)
    x = Tensor.input("x", (1, 8, 12, 12))
    h, c = x, 8
    for i, co in enumerate((16, 24, 16)):
        w = Tensor((rng.standard_normal((co, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32), name=f"w{i}",
                   role="param")
        h, c = h.conv2d(w, padding=1).relu(), co
    wl = Tensor((rng.standard_normal((16 * 144, 10)) / 48).astype(np.float32), name="wl", role="param")
    g = (h.reshape(1, 16 * 144) @ wl).graph("y")
    program = form_regions(g.tiny, **CpuBackend().formation())     # as the cpu target forms them
    consts = frozenset({"w0", "w1", "w2", "wl"})
    c = render_cpu_source(program, choose_cpu_plans(g.tiny, program, None, cpu_rt.cpu_features(),
                                                    constants=consts), constants=consts)
    packs = [u for u, k in zip(c.units, c.unit_kinds) if k == "pack"]
    pack_fns = {fn for step in c.steps for fn in (pk.fn for pk in step.packs)}
    assert len(pack_fns) >= 3
    assert len(packs) == 1
    assert all(f"int {dict(c.aliases).get(fn, fn)}(" in packs[0] for fn in pack_fns)
    assert c.unit_kinds.count("contraction") >= 3
    exe, _ = compile_counting(g)
    check_against_eval(g, exe)
    flags = [json.loads(o.with_suffix(".json").read_text())["flags"] for o in fresh_cache.glob("*.o")
             if o.with_suffix(".c").read_text() == packs[0]]
    assert flags and flags[0][-1:] == list(cpu_rt.UNIT_FLAGS["pack"])


def test_lift_constants_takes_the_integer_literals_only():
    """A pack function's ``NLL`` literals come from ``bufs[n]`` in order of appearance; preprocessor lines,
    floats, plain ints and names that end in digits keep theirs."""
    text = ("int kumiko_3_k(void** bufs, const long long* syms) {\n"
            "  const long long kk_M = 64LL;\n"
            "#if KUMIKO_VW == 8LL\n"
            "  float v12LL = 1.5f; long long kk_lo = -(1LL << 62) + 147LL*kumiko_l3 + 2.0e10;\n"
            "#endif\n"
            "  int kk_r[6]; return 0;\n}")
    out, values = lift_constants(text, "kumiko_3_k", 5)
    assert values == (64, 1, 147)
    assert "  const long long* KUMIKO_RESTRICT kk_cst = (const long long*)bufs[5];" in out.splitlines()[1]
    assert "kk_M = kk_cst[0];" in out and "-(kk_cst[1] << 62) + kk_cst[2]*kumiko_l3 + 2.0e10" in out
    assert "#if KUMIKO_VW == 8LL" in out and "v12LL = 1.5f" in out and "kk_r[6]" in out
    bare = "int kumiko_4_k(void** bufs, const long long* syms) {\n  return 0;\n}"
    assert lift_constants(bare, "kumiko_4_k", 3) == (bare, ())        # nothing to lift: no buffer read
