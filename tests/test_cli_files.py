"""The CLI and bad paths (issue 20): unreadable ``--inputs``, ``--out`` where no file can go, and graph names
that would make dumps escape their directory. Each is diagnostic E1502 naming the path (exit 2), or works;
never a traceback, never a file outside the directory given."""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from kumiko.cli import main
from kumiko.pipeline import dump_path
from kumiko.runtime.cpu import forget_loaded
from kumiko.util.files import safe_stem

GEMM = str(Path(__file__).parents[1] / "examples" / "gemm_bias_relu.json")
SMALL = ["--shapes", "M=8,N=8,K=8"]


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("KUMIKO_CACHE", str(tmp_path_factory.getbasetemp() / "cli-files-cache"))
    forget_loaded()
    yield
    forget_loaded()


def _fails_with_e1502(argv: list[str], path: Path, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "E1502" in err and str(path) in err and "Traceback" not in err
    return err


def _npz_bytes() -> bytes:
    buf = io.BytesIO()
    rng = np.random.default_rng(0)
    np.savez(buf, A=rng.standard_normal((8, 8), np.float32), B=rng.standard_normal((8, 8), np.float32))
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["truncated", "text", "npy", "directory", "missing", "corrupt"])
def test_bad_inputs_file(tmp_path, capsys, kind):
    path = tmp_path / "in.npz"
    data = _npz_bytes()
    if kind == "truncated":
        path.write_bytes(data[:len(data) // 2])
    elif kind == "text":
        path.write_text("A,B\n1,2\n")
    elif kind == "npy":
        np.save(tmp_path / "in.npy", np.zeros(3))
        path = tmp_path / "in.npy"
    elif kind == "directory":
        path.mkdir()
    elif kind == "corrupt":
        path.write_bytes(data[:60] + bytes(20) + data[80:])
    _fails_with_e1502(["run", GEMM, "--inputs", str(path)], path, capsys)


def test_out_is_a_directory(tmp_path, capsys):
    _fails_with_e1502(["run", GEMM, *SMALL, "--out", str(tmp_path)], tmp_path, capsys)


def test_out_in_a_missing_folder_is_made(tmp_path):
    out = tmp_path / "new" / "folder" / "y.npz"
    assert main(["run", GEMM, *SMALL, "--out", str(out)]) == 0
    assert np.load(out)["C2"].shape == (8, 8)


def test_out_under_a_file(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = blocker / "y.npz"
    err = _fails_with_e1502(["run", GEMM, *SMALL, "--out", str(out)], out, capsys)
    assert f"{blocker} is a file" in err


def test_dump_into_a_file(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    _fails_with_e1502(["dump", GEMM, "--out", str(blocker)], blocker, capsys)


@pytest.mark.parametrize("name, stem", [("../../escaped", "___.._escaped"), ("/abs/path", "_abs_path"),
                                        ("..", "__"), ("a b/c", "a_b_c"), ("ok-name_1.x", "ok-name_1.x"),
                                        ("", "program"), (".hidden", "_hidden")])
def test_safe_stem(name, stem):
    assert safe_stem(name) == stem
    assert dump_path("d", name, "tiny", "json").parent == Path("d")


def test_hostile_graph_name_stays_in_the_dump_directory(tmp_path, capsys):
    graph = json.loads(Path(GEMM).read_text())
    graph["name"] = "../../escaped"
    src = tmp_path / "g.json"
    src.write_text(json.dumps(graph))
    out = tmp_path / "a" / "b" / "d"
    assert main(["dump", str(src), "--stage", "frontend,tiny", "--out", str(out)]) == 0
    assert main(["dump", str(src), "--stage", "frontend", "--format", "dot", "--out", str(out)]) == 0
    assert main(["compile", str(src), *SMALL, "--dump", "tiny,plan,c", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    written = sorted(p for p in tmp_path.rglob("*") if p.is_file() and p != src)
    assert written and all(p.parent == out for p in written), written
    assert {p.name for p in written} == {"___.._escaped.frontend.json", "___.._escaped.tiny.json",
                                         "___.._escaped.frontend.dot", "___.._escaped.plan.json",
                                         "___.._escaped.c"}
    assert "escaped" in printed and str(tmp_path / "escaped") not in printed
