"""``Executable.save`` / ``kumiko.load_executable``: an Executable with its constants runs again in a new
process, on the cpu target without compiling (its kernel library is saved with it)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kumiko
from kumiko import Tensor
from kumiko.diagnostics import KumikoError

ROOT = Path(__file__).resolve().parents[2]


def _graph():
    rng = np.random.default_rng(11)
    w = Tensor(rng.standard_normal((16, 6, 3, 3)).astype(np.float32), name="w", role="param")
    b = Tensor(rng.standard_normal(16).astype(np.float32), name="b", role="param")
    x = Tensor.input("x", (2, 6, 11, 11))
    return x.conv2d(w, b, padding=1).relu().graph("y")


LOADER = """
import json, sys
import numpy as np
import kumiko
from kumiko.runtime import cpu
exe = kumiko.load_executable(sys.argv[1])
x = np.load(sys.argv[2])
y = exe(x=x)["y"]
np.save(sys.argv[3], y)
print(json.dumps({k: cpu.STATS[k] for k in ("compiles", "objects_compiled")}))
"""


def test_a_saved_cpu_executable_runs_in_a_new_process_without_compiling(tmp_path):
    exe = kumiko.compile(_graph(), "cpu")
    x = np.random.default_rng(1).standard_normal((2, 6, 11, 11)).astype(np.float32)
    want = exe(x=x)["y"]
    exe.save(tmp_path / "net.kumiko-exe")
    np.save(tmp_path / "x.npy", x)
    env = {**os.environ, "KUMIKO_CACHE": str(tmp_path / "fresh-cache"), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", LOADER, str(tmp_path / "net.kumiko-exe"), str(tmp_path / "x.npy"),
                          str(tmp_path / "y.npy")], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"compiles": 0, "objects_compiled": 0}
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), want)


def test_save_and_load_on_eval_keeps_the_constants(tmp_path):
    g = _graph()
    exe = kumiko.compile(g, "eval")
    exe.save(tmp_path / "e.bin")
    back = kumiko.load_executable(tmp_path / "e.bin")
    assert back.target == "eval" and set(back.params) == {"w", "b"}
    x = np.random.default_rng(2).standard_normal((2, 6, 11, 11)).astype(np.float32)
    np.testing.assert_array_equal(back(x=x)["y"], exe(x=x)["y"])


def test_a_file_that_is_not_a_saved_executable_is_a_diagnostic(tmp_path):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\x80\x05not a pickle at all")
    with pytest.raises(KumikoError) as e:
        kumiko.load_executable(bad)
    assert e.value.code == "E1009"
    with pytest.raises(KumikoError) as e:
        kumiko.load_executable(tmp_path / "missing.bin")
    assert e.value.code == "E1502"
