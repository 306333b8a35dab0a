"""`kumiko bench FILE`: times a graph file and reports median, min and GFLOP/s (text and --json)."""
import json
from pathlib import Path

from kumiko.cli import main

GEMM = str(Path(__file__).resolve().parents[2] / "examples" / "gemm_bias_relu.json")


def test_bench_json(capsys):
    assert main(["bench", GEMM, "--target", "eval", "--shapes", "M=16,N=8,K=4", "--reps", "3", "--warmup", "1",
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["target"] == "eval" and d["reps"] == 3 and d["warmup"] == 1
    assert d["sizes"] == {"M": 16, "N": 8, "K": 4}
    assert d["flops"] == 2 * 16 * 8 * 4 + 2 * 16 * 8 and d["gflops"] > 0
    assert 0 < d["min_ms"] <= d["median_ms"]


def test_bench_text_and_bad_reps(capsys):
    assert main(["bench", GEMM, "--target", "eval", "--reps", "2"]) == 0
    out = capsys.readouterr().out
    assert "median" in out and "GFLOP/s" in out and "target eval" in out
    assert main(["bench", GEMM, "--target", "eval", "--reps", "0"]) == 2
    assert "E1010" in capsys.readouterr().err
