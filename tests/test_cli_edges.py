"""The driver's and the command line's rough edges a newcomer meets (issue "One pipeline driver", item 6):
``KUMIKO_DEBUG`` levels 1-5, ``KUMIKO_DUMP``, ``compile --dump`` without ``--out``, help texts derived from
the stage tables, the cuda extra's install hint, README's error sample, and ``print(graph)``."""
import json
import re
import sys
from pathlib import Path

import pytest

import kumiko
from kumiko.cli import main
from kumiko.diagnostics import KumikoError
from kumiko.pipeline import DRAWINGS, DUMPS, STAGES

ROOT = Path(__file__).parents[1]
GEMM = str(ROOT / "examples" / "gemm_bias_relu.json")
SMALL = ["--shapes", "M=8,N=8,K=8"]


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    """A developer's own KUMIKO_DEBUG / KUMIKO_DUMP must not change what these tests see."""
    monkeypatch.delenv("KUMIKO_DEBUG", raising=False)
    monkeypatch.delenv("KUMIKO_DUMP", raising=False)


# 1. KUMIKO_DEBUG ----------------------------------------------------------------------------------------

#: what each level adds on stderr for `compile GEMM --target cuda-emu` (nothing built: the emulator builds
#: on the first call); a level shows its own lines and every lower level's, never a higher one's
LEVEL_MARKS = {
    1: ["kumiko: stage load gemm_bias_relu.json", "kumiko: stage region: ", "kumiko: stage plan: ",
        "kumiko: stage kernel (GPU IR): ", "kumiko: stage source (CUDA C): ",
        "kumiko: stage compile gemm_bias_relu for cuda-emu: "],
    2: ["kumiko: kernel kumiko_0_k_C2: region k_C2, block "],
    3: ["kumiko: plan k_C2: simt (sm80"],
    4: ["kumiko: generated source of gemm_bias_relu (cuda-emu):\n", '#include "kumiko_cuda.cuh"'],
    5: ["kumiko: frontend IR of gemm_bias_relu:\n", "kumiko: tiny IR of gemm_bias_relu:\n", '"uops"',
        "kumiko: indexbook IR of gemm_bias_relu:\n", "kumiko: poly_view IR of gemm_bias_relu:\n",
        "kumiko: region IR of gemm_bias_relu:\n", "kumiko: gpu_ir IR of gemm_bias_relu:\n"],
}


@pytest.mark.parametrize("level", range(6))
def test_debug_levels(level, monkeypatch, capsys):
    monkeypatch.setenv("KUMIKO_DEBUG", str(level))
    assert main(["compile", GEMM, "--target", "cuda-emu", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["target"] == "cuda-emu"          # stdout stays the command's own output
    for lvl, marks in LEVEL_MARKS.items():
        for m in marks:
            assert (m in err) == (lvl <= level), (lvl, m, err[:2000])
    if level == 0:
        assert err == ""


def test_debug_cpu_stages_builds_and_kernel_times(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("KUMIKO_DEBUG", "2")
    monkeypatch.setenv("KUMIKO_CACHE", str(tmp_path))    # a build of its own (not a module this process loaded)
    assert main(["run", GEMM, *SMALL]) == 0
    err = capsys.readouterr().err
    assert "kumiko: stage binary (gcc): " in err and "kumiko: build_c gemm_bias_relu: " in err
    assert re.search(r"kumiko: kernel kumiko_0_k_C2: region k_C2\n", err)
    assert re.search(r"kumiko: cpu kumiko_0_k_C2: [0-9.]+ ms", err)        # the run, kernel by kernel
    assert "kumiko: plan " not in err


def test_debug_emulator_build_and_launch_times(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("KUMIKO_DEBUG", "2")
    monkeypatch.setenv("KUMIKO_CACHE", str(tmp_path))
    assert main(["run", GEMM, *SMALL, "--target", "cuda-emu"]) == 0
    err = capsys.readouterr().err
    assert "kumiko: build_emu gemm_bias_relu (deferred+round_robin): " in err
    assert re.search(r"kumiko: cuda-emu kumiko_0_k_C2 grid \[1, 1, 1\] block 256 smem 0: [0-9.]+ ms", err)


def test_debug_level_three_prints_the_plans_compile_reports(monkeypatch, capsys):
    monkeypatch.setenv("KUMIKO_DEBUG", "3")
    assert main(["compile", GEMM]) == 0
    out, err = capsys.readouterr()
    report = re.search(r"  k_C2: (.*)", out).group(1)
    assert f"kumiko: plan k_C2: {report}\n" in err


# 2. KUMIKO_DUMP ----------------------------------------------------------------------------------------

def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.mark.parametrize("target, ext", [("cpu", "c"), ("cuda-emu", "cu")])
def test_kumiko_dump_equals_compile_dump(target, ext, tmp_path, monkeypatch, capsys):
    by_cli = tmp_path / "cli"
    assert main(["compile", GEMM, "--target", target, "--dump", "all", "--out", str(by_cli)]) == 0
    monkeypatch.setenv("KUMIKO_DUMP", str(tmp_path / "env"))
    assert main(["compile", GEMM, "--target", target]) == 0
    env = _files(tmp_path / "env")
    jsons = ("frontend", "tiny", "indexbook", "poly_view", "region", "plan") + (("gpu_ir",) if ext == "cu" else ())
    assert set(env) == {f"gemm_bias_relu.{s}.json" for s in jsons} | {f"gemm_bias_relu.{ext}"}
    assert env == _files(by_cli)
    assert json.loads(env["gemm_bias_relu.tiny.json"])["uops"]


def test_kumiko_dump_from_python_writes_what_was_built(tmp_path, monkeypatch):
    """The eval target forms no regions and builds no source; a Tiny IR program has no frontend stage."""
    monkeypatch.setenv("KUMIKO_DUMP", str(tmp_path))
    g = kumiko.load(GEMM)
    kumiko.compile(g, target="eval")
    analyses = {"gemm_bias_relu.indexbook.json", "gemm_bias_relu.poly_view.json"}
    assert set(_files(tmp_path)) == {"gemm_bias_relu.frontend.json", "gemm_bias_relu.tiny.json"} | analyses
    kumiko.compile(g.tiny, target="cuda-emu")
    assert set(_files(tmp_path)) == {"gemm_bias_relu.frontend.json", "gemm_bias_relu.tiny.json", *analyses,
                                     "gemm_bias_relu.region.json", "gemm_bias_relu.plan.json",
                                     "gemm_bias_relu.gpu_ir.json", "gemm_bias_relu.cu"}


def test_kumiko_dump_that_cannot_be_written_is_e1502(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("KUMIKO_DUMP", str(blocker))
    assert main(["compile", GEMM, "--target", "cuda-emu"]) == 2
    err = capsys.readouterr().err
    assert "E1502" in err and str(blocker) in err and "Traceback" not in err
    with pytest.raises(KumikoError) as e:
        kumiko.compile(kumiko.load(GEMM), target="eval")
    assert e.value.code == "E1502"


# 3. compile --dump without --out -------------------------------------------------------------------------

def test_compile_dump_without_out_is_a_diagnostic(capsys):
    assert main(["compile", GEMM, "--dump", "region,plan"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "E1010" in err and "--out" in err
    assert f"kumiko dump {GEMM} --stage region" in err         # the command that prints a stage
    assert main(["compile", GEMM, "--dump", "plan", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["diagnostics"][0]["code"] == "E1010"


def test_compile_dump_unknown_stage_is_refused_before_compiling(tmp_path, capsys):
    assert main(["compile", GEMM, "--dump", "regoin", "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert "E1010" in err and "'regoin'" in err and all(s in err for s in DUMPS)
    assert not (tmp_path / "d").exists()


# 4. help texts from the stage tables ---------------------------------------------------------------------

def _help(*cmd: str, capsys) -> str:
    with pytest.raises(SystemExit):
        main([*cmd, "--help"])
    return " ".join(capsys.readouterr().out.split())       # argparse wraps lines


def test_dump_help_names_every_picture(capsys):
    text = _help("dump", capsys=capsys)
    assert f"a picture of the stage ({', '.join(DRAWINGS)})" in text
    assert "region" in DRAWINGS


def test_compile_help_names_every_stage(capsys):
    text = _help("compile", capsys=capsys)
    assert f"({', '.join([*DUMPS, 'all'])})" in text and " -> ".join(STAGES) in text
    assert "KUMIKO_DUMP" in text and "KUMIKO_DEBUG" in text


def test_region_picture_exists(capsys):
    assert main(["dump", GEMM, "--stage", "region", "--format", "dot"]) == 0
    assert capsys.readouterr().out.startswith("digraph")


def test_region_picture_is_the_targets(tmp_path, capsys):
    """A conv + ReLU pooled whole over 7 x 7 pixels: the cpu target runs the pool apart (R-pool), the GPU
    targets fused; each target's picture has as many regions as its JSON dump (it had drawn a target-neutral
    formation whatever the target)."""
    from kumiko import Tensor
    x, w = Tensor.input("x", [1, 16, 7, 7]), Tensor.input("w", [24, 16, 3, 3], role="param")
    src = tmp_path / "pool.json"
    src.write_text(json.dumps(x.conv2d(w, padding=1).relu().mean((2, 3)).graph("y").to_json()))
    for target, regions in (("cpu", 2), ("cuda-emu", 1)):
        assert main(["dump", str(src), "--stage", "region", "--target", target]) == 0
        assert len(json.loads(capsys.readouterr().out)["regions"]) == regions
        assert main(["dump", str(src), "--stage", "region", "--format", "dot", "--target", target]) == 0
        assert capsys.readouterr().out.count('subgraph "cluster_') == regions, target


# 5. the cuda extra ---------------------------------------------------------------------------------------

def test_missing_cuda_bindings_says_how_to_install_from_a_checkout(monkeypatch):
    from kumiko.runtime.cuda_driver import driver_module
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)       # `from cuda.bindings import driver` fails
    with pytest.raises(KumikoError) as e:
        driver_module()
    assert e.value.code == "E1501"
    assert "pip install -e '.[cuda]'" in e.value.suggestion and "kumiko[cuda]" not in e.value.suggestion
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r"^cuda = \[", pyproject, re.M)               # the extra the hint names exists


# 6. README's error sample is the real output ------------------------------------------------------------

def test_readme_error_sample_is_real(tmp_path, monkeypatch, capsys):
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"```\n\$ kumiko check (\S+)\n(.*?)```", readme, re.S)
    assert m, "README shows `$ kumiko check FILE` and its output"
    graph = json.loads(Path(GEMM).read_text())
    graph["tensors"]["B"]["shape"] = ["J", "N"]                  # what the README says it changed
    (tmp_path / m.group(1)).write_text(json.dumps(graph))
    monkeypatch.chdir(tmp_path)
    assert main(["check", m.group(1)]) == 2
    assert capsys.readouterr().err == m.group(2)


# 7. print(graph) ---------------------------------------------------------------------------------------

def test_graph_prints_one_op_per_line():
    g = kumiko.load(GEMM)
    assert str(g) == repr(g) == "\n".join([
        "Graph gemm_bias_relu(A: fp32[M, K], B: fp32[K, N], bias: fp32[N] (param)) -> (C2: fp32[M, N])",
        "  symbols: M=256, N=128, K=64",
        "  gemm = GEMM(A, B) -> C0: fp32[M, N]",
        "  bias_add = Elementwise.add(C0, bias) -> C1: fp32[M, N]",
        "  relu = Elementwise.relu(C1) -> C2: fp32[M, N]",
        "  (3 ops)"])


def test_big_graph_prints_its_ends_and_a_count():
    x = kumiko.Tensor.input("x", ("M", 4))
    for _ in range(40):
        x = (x + 1.0).relu()
    g = x.graph("y")
    lines = str(g).splitlines()
    ends = g.STR_ENDS
    assert len(lines) == 1 + 2 * ends + 1 + 1
    assert lines[1 + ends] == f"  ... {len(g.nodes) - 2 * ends} more ops ..."
    assert lines[-2].endswith("-> y: fp32[M, 4]") and lines[-1] == f"  ({len(g.nodes)} ops)"


def test_an_option_a_target_does_not_take_is_a_diagnostic():
    """Target factories no longer swallow unknown options (``**_``): a typo is E1010 naming the options."""
    g = kumiko.load(GEMM)
    with pytest.raises(KumikoError) as e:
        kumiko.compile(g, "cpu", tunee=True)
    assert e.value.code == "E1010" and "tunee" in e.value.why and "tune" in e.value.suggestion
    with pytest.raises(KumikoError) as e:
        kumiko.compile(g, "eval", shapes={"M": 4})
    assert e.value.code == "E1010"
    with pytest.raises(KumikoError) as e:
        kumiko.compile(g, "nowhere")
    assert e.value.code == "E1501"


def test_tune_on_a_gpu_target_is_refused_not_ignored(capsys):
    assert main(["compile", GEMM, "--target", "cuda-emu", "--tune"]) == 2
    assert "E1010" in capsys.readouterr().err
