"""bench/bench.py stays runnable: a quick run of the smallest workload on the eval target, kumiko alone and
against numpy (whose output it must match). Imports the script's functions; writes no results file."""
import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench.py"


def _bench_module():
    spec = importlib.util.spec_from_file_location("kumiko_bench_script", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod           # dataclasses look their module up while the script loads
    spec.loader.exec_module(mod)
    return mod


def test_quick_run_without_peers(tmp_path):
    bench = _bench_module()
    out = tmp_path / "r.json"
    rep = bench.main(["--quick", "--no-peers", "--workloads", "W1-1024", "--target", "eval", "--reps", "2",
                      "--warmup", "1", "--json", str(out), "--results", str(tmp_path / "RESULTS.md")])
    assert not (tmp_path / "RESULTS.md").exists()          # --quick does not append unless asked
    (row,) = rep["rows"]
    assert row["runner"] == "kumiko[eval]" and row["median_ms"] > 0 and row["reps"] == 2
    assert row["gflops"] > 0 and out.exists()


def test_quick_run_checks_numpy_and_writes_the_table(tmp_path):
    bench = _bench_module()
    results = tmp_path / "RESULTS.md"
    rep = bench.main(["--quick", "--peers", "numpy", "--workloads", "W2", "--target", "eval", "--reps", "2",
                      "--warmup", "0", "--append", "--results", str(results)])
    assert rep["failed_checks"] == []
    numpy_row = next(r for r in rep["rows"] if r["runner"] == "numpy")
    assert numpy_row["ok"] and numpy_row["rel_l2"] < 1e-5 and numpy_row["ratio"] > 0
    text = results.read_text()
    assert "| W2 | numpy |" in text and "machine:" in text and "kumiko/runner" in text
