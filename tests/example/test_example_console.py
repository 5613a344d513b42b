"""Both examples' launchers as a shell user meets them: Ctrl-C while torch is still loading is one line and status
130, and a reader that stops reading (``dcgan.py | head``) does not cost the run its checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from dcgan_runs import TINY
from interrupts import CTRL_C_AT_TORCH_IMPORT
from paths import REPO

#: Run a launcher with a Ctrl-C arriving while torch is being imported (the slow part of start-up).
CTRL_C_WHILE_TORCH_LOADS = CTRL_C_AT_TORCH_IMPORT + """
import runpy
sys.argv = sys.argv[1:]
sys.path[0] = str(__import__("pathlib").Path(sys.argv[0]).parent)  # as `python examples/NAME.py` sets it
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("name", ["dcgan", "lm"])
def test_ctrl_c_while_torch_loads_is_one_line_and_130(tmp_path, name):
    launcher = REPO / "examples" / f"{name}.py"
    done = subprocess.run([sys.executable, "-c", CTRL_C_WHILE_TORCH_LOADS, str(launcher), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 130, done.stderr
    assert done.stderr == f"{name}: interrupted\n" and done.stdout == ""
    assert not (tmp_path / "o").exists()


def test_a_reader_that_stops_reading_does_not_cost_the_run_its_checkpoint(tmp_path):
    out = tmp_path / "run"
    argv = [sys.executable, str(REPO / "examples" / "dcgan.py"), *TINY, "--data", "fake", "--steps", "4",
            "--log-every", "1", "--save-every", "100", "--out", str(out)]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # `| head -0`: every line printed at a log point meets a broken pipe
    err = process.stderr.read().decode()
    assert process.wait(timeout=300) == 0, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert (out / "checkpoints" / "step_0000004.pt").exists()
    assert json.loads((out / "summary.json").read_text())["steps"] == 4
