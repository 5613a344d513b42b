"""A new run started with ``--out`` naming the folder of an earlier run that holds checkpoints is refused: it
would write its checkpoints under the same names and prune by step (keeping the earlier run's higher steps and
deleting its own, while its summary named them). ``--auto-resume`` or ``--resume`` continue there as before."""

from __future__ import annotations

import pytest

import devplug
from devplug import ConfigParser


def _parser() -> ConfigParser:
    parser = ConfigParser("demo.py")
    parser.add_run_arguments(runs="runs")
    return parser


def test_a_fresh_run_over_an_earlier_runs_checkpoints_is_refused(tmp_path):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    parser = _parser()
    assert parser.run_folder(parser.parse(["--out", str(tmp_path / "run")])).out == tmp_path / "run"  # empty: fine
    for step in (4, 12):
        (tmp_path / "run" / "checkpoints" / f"step_{step:07d}.pt").write_bytes(b"x")
    with pytest.raises(devplug.ConfigError, match=r"holds the checkpoints of an earlier run \(newest step_0000012.pt\)"
                                                  r".*pass --auto-resume"):
        parser.run_folder(parser.parse(["--out", str(tmp_path / "run")]))
    assert parser.run_folder(parser.parse(["--out", str(tmp_path / "run"), "--auto-resume"])).auto_resume
    resumed = parser.run_folder(parser.parse(["--resume", str(tmp_path / "run")]))
    assert resumed.out == tmp_path / "run" and resumed.resume == tmp_path / "run" / "checkpoints"
