"""The pipeline driver (``kumiko.pipeline``): every stage dumped, a dumped stage resumed, plans replaced from a
file, KUMIKO_DUMP equal to ``--dump all``, verification of a given stage, typed target options, and the
import rule of the stage packages."""
import ast
import json
from pathlib import Path

import pytest

import kumiko
from kumiko.backend import backend
from kumiko.cli import main
from kumiko.diagnostics import KumikoError
from kumiko.pipeline import DUMPS, STAGES, compile_program

ROOT = Path(__file__).parents[1]
ATTN = str(ROOT / "examples" / "attention_causal.json")
GEMM = str(ROOT / "examples" / "gemm_bias_relu.json")
SMALL = ["--shapes", "M=8,N=16,K=8"]


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.delenv("KUMIKO_DEBUG", raising=False)
    monkeypatch.delenv("KUMIKO_DUMP", raising=False)
    monkeypatch.delenv("KUMIKO_SPEC", raising=False)


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def _dump(path: str, out: Path, what: str = "all", *more: str) -> dict[str, bytes]:
    assert main(["compile", path, "--dump", what, "--out", str(out), *more]) == 0
    return _files(out)


def test_dump_all_writes_every_stage(tmp_path, capsys):
    files = _dump(ATTN, tmp_path / "d")
    assert set(files) == {f"attention_causal.{s}.json" for s in
                          ("frontend", "tiny", "indexbook", "poly_view", "region", "plan")} | {"attention_causal.c"}
    assert json.loads(files["attention_causal.poly_view.json"]) and json.loads(files["attention_causal.indexbook.json"])
    emu = _dump(GEMM, tmp_path / "e", "all", "--target", "cuda-emu")
    assert {"gemm_bias_relu.gpu_ir.json", "gemm_bias_relu.cu"} <= set(emu)
    assert json.loads(emu["gemm_bias_relu.gpu_ir.json"])["launches"]


def test_a_dumped_region_runs_and_checks(tmp_path, capsys):
    _dump(ATTN, tmp_path)
    capsys.readouterr()
    assert main(["run", str(tmp_path / "attention_causal.region.json"), "--check"]) == 0
    out = capsys.readouterr().out
    assert "check O: relative L2 error" in out and ": ok" in out


def _edited_region(tmp_path: Path, edit) -> Path:
    _dump(GEMM, tmp_path, "tiny,region")
    p = tmp_path / "gemm_bias_relu.region.json"
    d = json.loads(p.read_text())
    edit(d["regions"][0])
    p.write_text(json.dumps(d))
    return p


def test_the_resumed_region_is_the_one_compiled(tmp_path, capsys):
    """An edited region dump is what runs: bias multiplied instead of added is a mismatch with the program."""
    def mul_bias(r):
        (let,) = [x for x in r["lets"] if "add" in x["expr"]]
        let["expr"] = {"mul": let["expr"]["add"]}
    p = _edited_region(tmp_path, mul_bias)
    assert main(["run", str(p), *SMALL, "--check"]) == 2
    assert "E1705" in capsys.readouterr().err
    # the same through --resume, FILE giving the program
    assert main(["run", GEMM, "--resume", str(p), *SMALL, "--check"]) == 2
    assert "E1705" in capsys.readouterr().err


def test_a_resumed_region_is_verified(tmp_path, capsys, monkeypatch):
    """KUMIKO_SPEC's region verifier runs on a given stage: a read past B's last row is E1401."""
    def shift(r):
        r["lets"][0]["expr"]["reduce"]["body"]["mul"][1]["read"]["map"][0] = "r0 + 1"
    p = _edited_region(tmp_path, shift)
    assert main(["compile", str(p)]) == 2
    assert "E1401" in capsys.readouterr().err
    monkeypatch.setenv("KUMIKO_SPEC", "0")                   # verifiers off: it is compiled as given
    assert main(["compile", str(p), "--target", "cuda-emu"]) == 0


def test_spec_two_verifies_every_stage(monkeypatch):
    """KUMIKO_SPEC=2 makes the analyses for every compile and runs their verifiers and the region verifier."""
    monkeypatch.setenv("KUMIKO_SPEC", "2")
    c = compile_program(kumiko.load(ATTN), "cuda-emu")
    assert c.indexbook is not None and c.poly_view is not None
    from kumiko import Tensor
    x = Tensor.input("x", ("N",))
    with pytest.raises(KumikoError) as e:                     # in bounds only for N >= 4: strict level 2 refuses
        compile_program((x.shrink(((0, 4),)) * 2.0).graph("y"), "cuda-emu")
    assert e.value.code == "E1401"


def test_a_region_dump_needs_its_program(tmp_path, capsys):
    _dump(GEMM, tmp_path, "region")
    assert main(["run", str(tmp_path / "gemm_bias_relu.region.json")]) == 2
    err = capsys.readouterr().err
    assert "E1009" in err and "gemm_bias_relu.tiny.json" in err
    assert main(["run", ATTN, "--resume", str(tmp_path / "gemm_bias_relu.region.json")]) == 2
    assert "E1009" in capsys.readouterr().err and True        # another program's regions
    assert main(["run", GEMM, "--resume", GEMM]) == 2           # a frontend graph is not a stage to resume
    assert "E1009" in capsys.readouterr().err


def test_a_tiny_dump_resumes(tmp_path, capsys):
    _dump(GEMM, tmp_path, "tiny")
    assert main(["run", GEMM, "--resume", str(tmp_path / "gemm_bias_relu.tiny.json"), *SMALL, "--check"]) == 0


def test_plans_from_a_file(tmp_path, capsys):
    _dump(GEMM, tmp_path, "plan")
    plan_file = tmp_path / "gemm_bias_relu.plan.json"
    capsys.readouterr()
    assert main(["run", GEMM, "--plan", str(plan_file), "--check"]) == 0
    d = json.loads(plan_file.read_text())
    d["k_C2"]["algo_choice"] = {"region": "loops"}            # another valid plan: it is the one used
    plan_file.write_text(json.dumps(d))
    capsys.readouterr()
    assert main(["compile", GEMM, "--plan", str(plan_file), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plans"]["k_C2"]["algo_choice"] == {"region": "loops"}
    assert main(["run", GEMM, "--plan", str(plan_file), *SMALL, "--check"]) == 0


@pytest.mark.parametrize("edit", [
    lambda d: d["k_C2"].update(vectorize={"axis": "n", "width": 4096}),      # no machine has it
    lambda d: d.update(k_nowhere=d["k_C2"]),                                 # no such region
    lambda d: d["k_C2"].update(micro="12x32"),                              # not a plan (format 1's field)
    lambda d: d["k_C2"].update(tile=[48, 64, 32]),                          # a GPU plan's CTA tile on the CPU
    lambda d: d["k_C2"].update(register_block={"mr": 6}),                   # half a block
    lambda d: d["k_C2"].update(layout_hints={"note": "hand-tuned"}),        # notes are no layout hints
    lambda d: ["not", "a", "map"],
])
def test_a_bad_plan_file_is_e1801(edit, tmp_path, capsys):
    _dump(GEMM, tmp_path, "plan")
    p = tmp_path / "gemm_bias_relu.plan.json"
    d = json.loads(p.read_text())
    d = edit(d) or d
    p.write_text(json.dumps(d))
    capsys.readouterr()
    assert main(["run", GEMM, "--plan", str(p)]) == 2
    err = capsys.readouterr().err
    assert "E1801" in err and "Traceback" not in err


def test_a_format_1_plan_file_says_what_to_do(tmp_path, capsys):
    """A plan file written before the Plan named its blocks (``tile``/``micro`` holding the CPU's cache and
    register blocks) is E1801 naming the file's region and how to get a plan of this format."""
    _dump(GEMM, tmp_path, "plan")
    p = tmp_path / "gemm_bias_relu.plan.json"
    d = json.loads(p.read_text())
    new = d["k_C2"]
    old = {k: v for k, v in new.items() if k not in ("cache_block", "register_block")}
    old.update(tile=list(new["cache_block"].values()), micro=list(new["register_block"].values()), stages=1,
               warp_tile=None, threads=0, barrier_model=None)
    p.write_text(json.dumps({"k_C2": old}))
    capsys.readouterr()
    assert main(["run", GEMM, "--plan", str(p)]) == 2
    err = capsys.readouterr().err
    assert "E1801" in err and "format 1" in err and "k_C2" in err and "--dump plan" in err
    assert "Traceback" not in err


def test_kumiko_dump_writes_what_dump_all_writes(tmp_path, monkeypatch, capsys):
    by_cli = _dump(GEMM, tmp_path / "cli")
    monkeypatch.setenv("KUMIKO_DUMP", str(tmp_path / "env"))
    assert main(["run", GEMM, *SMALL]) == 0
    assert _files(tmp_path / "env") == by_cli


def test_unknown_target_option_is_a_diagnostic():
    with pytest.raises(KumikoError) as e:
        backend("cuda-emu").options({"emuu": "asan"})
    assert e.value.code == "E1010" and "emuu" in e.value.why and "emu" in e.value.suggestion
    with pytest.raises(KumikoError) as e:
        kumiko.compile(kumiko.load(GEMM), "cuda", sync_eachh=True)
    assert e.value.code == "E1010" and "sync_each" in e.value.suggestion
    assert backend("cuda-emu").options({"emu": "asan"}).emu == "asan"


def test_the_compilation_keeps_every_stage():
    g = kumiko.load(GEMM)
    c = compile_program(g, "cpu", until="region")
    assert c.frontend is g and c.tiny is g.tiny and c.region is not None and c.plan is None
    assert c.indexbook is None                       # an analysis: made only when wanted
    c = kumiko.compile(g, "cuda-emu").compilation
    assert [s for s in STAGES if getattr(c, s) is None] == ["indexbook", "poly_view"]
    assert c.binary.source == c.source and c.kernel.launches == c.binary.launches
    e = kumiko.compile(g.tiny, "eval").compilation
    assert e.frontend is None and e.region is None and callable(e.runner())
    assert set(DUMPS.values()) <= set(STAGES)


#: packages that are stages: they never import the driver, the compiler, the CLI or the frontend
STAGE_PACKAGES = ("indexbook", "poly", "region", "plan", "kernel", "render", "runtime", "backend")
FORBIDDEN = ("kumiko.pipeline", "kumiko.compiler", "kumiko.cli", "kumiko.frontend")


@pytest.mark.parametrize("pkg", STAGE_PACKAGES)
def test_stage_packages_never_import_the_driver(pkg):
    for path in sorted((ROOT / "kumiko" / pkg).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad = [n for n in names if n.startswith(FORBIDDEN)]
            assert not bad, f"{path.relative_to(ROOT)} imports {bad}"
