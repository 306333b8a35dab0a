"""The command line: run/dump/check on examples, --help on each command, diagnostics with exit code 2."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kumiko.cli import main

EXAMPLES = Path(__file__).parents[1] / "examples"
GEMM = str(EXAMPLES / "gemm_bias_relu.json")


def test_run_writes_outputs(tmp_path, capsys):
    out = tmp_path / "y.npz"
    assert main(["run", GEMM, "--shapes", "M=33,N=17,K=9", "--seed", "4", "--out", str(out)]) == 0
    with np.load(out) as z:
        assert z["C2"].shape == (33, 17) and z["C2"].dtype == np.float32
    assert "C2" in capsys.readouterr().out


def test_run_with_given_inputs(tmp_path):
    rng = np.random.default_rng(0)
    a, b, bias = (rng.standard_normal(s).astype(np.float32) for s in ((4, 3), (3, 5), (5,)))
    ins, out = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(ins, A=a, B=b, bias=bias)
    assert main(["run", GEMM, "--inputs", str(ins), "--out", str(out)]) == 0
    with np.load(out) as z:
        np.testing.assert_allclose(z["C2"], np.maximum(a @ b + bias, 0), rtol=1e-5, atol=1e-6)


def test_run_json(capsys):
    assert main(["run", GEMM, "--shapes", "M=8,N=8,K=8", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["outputs"]["C2"]["shape"] == [8, 8] and d["target"] == "cpu"


def test_dump_to_dir_is_deterministic(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        args = ["dump", str(EXAMPLES / "conv_relu_maxpool.json"), "--stage", "frontend,tiny", "--out", str(d)]
        assert main(args) == 0
    names = sorted(p.name for p in a.iterdir())
    assert names == ["conv_relu_maxpool.frontend.json", "conv_relu_maxpool.tiny.json"]
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes()


def test_check_ok_and_bad(tmp_path, capsys):
    assert main(["check", GEMM]) == 0
    bad = json.loads(Path(GEMM).read_text())
    bad["graph"][1]["inputs"] = ["C0", "nope"]
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(bad))
    assert main(["check", str(p)]) == 2
    err = capsys.readouterr().err
    assert "E1007" in err and "nope" in err and "suggestion" in err


def test_unknown_target_is_a_diagnostic(capsys):
    assert main(["run", GEMM, "--target", "tpu"]) == 2
    assert "E1501" in capsys.readouterr().err


def test_bad_shapes_flag(capsys):
    assert main(["run", GEMM, "--shapes", "M=x"]) == 2
    assert "E1010" in capsys.readouterr().err


def test_missing_file_json(capsys):
    assert main(["--json", "run", "/no/such/file.json"]) == 2
    d = json.loads(capsys.readouterr().out)
    assert d["diagnostics"][0]["code"] == "E1502"


@pytest.mark.parametrize("cmd", [[], ["run"], ["dump"], ["check"]])
def test_help(cmd):
    r = subprocess.run([sys.executable, "-m", "kumiko.cli", *cmd, "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "usage: kumiko" in r.stdout
    if cmd == ["run"]:
        assert "--shapes" in r.stdout and "--target" in r.stdout


def test_run_check_against_the_evaluator(capsys):
    assert main(["run", GEMM, "--shapes", "M=33,N=17,K=9", "--check"]) == 0
    out = capsys.readouterr().out
    assert "check C2: relative L2 error" in out and "(bound 0.0001 for fp32): ok" in out
    assert main(["run", GEMM, "--shapes", "M=5,N=6,K=7", "--check", "--json", "--dtype", "bf16"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["outputs"]["C2"]["dtype"] == "bfloat16"
    assert d["check"]["C2"]["ok"] and d["check"]["C2"]["bound"] == 0.02 and d["check"]["C2"]["dtype"] == "bf16"


def test_run_check_reports_a_mismatch_as_e1705(monkeypatch, capsys):
    """A target that disagrees with the evaluator (simulated: the reference is moved off) is a diagnostic,
    exit 2, after the table; with --json only the diagnostic is printed, with every output's check."""
    import kumiko.backend.eval as kc  # the eval target's evaluator
    real = kc.evaluate
    monkeypatch.setattr(kc, "evaluate", lambda *a, **k: {n: v * 1.01 for n, v in real(*a, **k).items()})
    assert main(["run", GEMM, "--shapes", "M=8,N=8,K=8", "--check"]) == 2
    cap = capsys.readouterr()
    assert "MISMATCH" in cap.out and "E1705 ResultMismatch" in cap.err and "output C2 on cpu" in cap.err
    assert main(["run", GEMM, "--shapes", "M=8,N=8,K=8", "--check", "--json"]) == 2
    d = json.loads(capsys.readouterr().out)["diagnostics"][0]
    assert d["code"] == "E1705" and d["outputs"]["C2"]["ok"] is False and d["sizes"] == {"M": 8, "N": 8, "K": 8}


@pytest.mark.parametrize("argv, code, word", [
    (["run", GEMM, "--emu", "eager"], "E1010", "--target cuda-emu"),          # --emu on the cpu target
    (["run", GEMM, "--dtype", "i32"], None, "invalid choice"),                # argparse: not a float dtype
])
def test_run_option_errors(argv, code, word, capsys):
    if code is None:
        with pytest.raises(SystemExit):
            main(argv)
        assert word in capsys.readouterr().err
        return
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert code in err and word in err


def test_dtype_refuses_a_tiny_ir_dump(tmp_path, capsys):
    assert main(["dump", GEMM, "--stage", "tiny", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["run", str(tmp_path / "gemm_bias_relu.tiny.json"), "--dtype", "fp16"]) == 2
    err = capsys.readouterr().err
    assert "E1010" in err and "Tiny IR dump" in err


def test_dtype_retypes_dumps(capsys):
    assert main(["dump", GEMM, "--stage", "frontend", "--dtype", "fp16"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {t["dtype"] for t in d["tensors"].values()} == {"fp16"}


def test_run_and_compile_take_an_onnx_model(tmp_path, capsys):
    """``kumiko run/compile model.onnx``: the initializers are the weights (was E1009, not a UTF-8 file)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx import numpy_helper as nh
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"]), h.make_node("Relu", ["y"], ["z"])], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [2, 4])],
                     [h.make_tensor_value_info("z", TP.FLOAT, [2, 3])], [nh.from_array(w, "w")])
    model = tmp_path / "m.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), model)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    ins, out = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(ins, x=x)
    assert main(["run", str(model), "--inputs", str(ins), "--out", str(out), "--check"]) == 0
    with np.load(out) as z:
        np.testing.assert_allclose(z["z"], np.maximum(x @ w, 0), rtol=1e-5, atol=1e-6)
    assert main(["compile", str(model), "--dump", "region", "--out", str(tmp_path / "d")]) == 0
    assert list((tmp_path / "d").glob("*.region.json"))


def test_dump_plans_of_a_target(capsys):
    gemm = str(EXAMPLES / "gemm_bias_relu.json")
    assert main(["dump", gemm, "--stage", "plan"]) == 0
    cpu = json.loads(capsys.readouterr().out)
    assert all(p["arch"].startswith("cpu") for p in cpu.values())
    assert main(["dump", gemm, "--stage", "plan,region", "--target", "cuda-emu", "--dtype", "fp16"]) == 0
    gpu = json.loads(capsys.readouterr().out)
    assert all(p["arch"] == "sm80" and "tile" in p for p in gpu["plan"].values()) and gpu["region"]
    assert main(["dump", gemm, "--stage", "gpu_ir", "--target", "cpu"]) != 0
    assert "makes no gpu_ir stage" in capsys.readouterr().err
