"""A rank that fails mid-run: the other says so in one line (no traceback), both exit non-zero, and the
checkpoints already written are kept."""

from __future__ import annotations

import pytest
from dist_scripts import common
from dist_scripts.common import HERE

from devplug.core.checkpoint.file import read_checkpoint

PEER_GONE = "rank_fails: error: rank {rank} of 2: another process of this job ended or stopped answering"


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["dies", "nonfinite"])
def test_when_one_rank_fails_the_other_says_so_in_one_line_and_the_checkpoints_are_kept(tmp_path, case):
    # dies: rank 1 ends abruptly at step 3; nonfinite: its NaN loss reaches both replicas and rank 0, the
    # writer of plain checkpoints, refuses the step-4 checkpoint. The other rank's next collective fails.
    codes = {"dies": [1, 3], "nonfinite": [2, 1]}[case]
    results = common.run_ranks(HERE / "rank_fails.py", ["--out", str(tmp_path), "--case", case],
                               expect_code=codes, timeout=120)
    survivor = 0 if case == "dies" else 1
    for result in results:
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = _lines(results[survivor].stderr)
    assert len(lines) == 1 and lines[0].startswith(PEER_GONE.format(rank=survivor)), results[survivor].stderr
    if case == "nonfinite":
        (line,) = _lines(results[0].stderr)
        assert line.startswith("rank_fails: error: not saving checkpoint") and "non-finite" in line
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_0000002.pt"]
    assert read_checkpoint(tmp_path / "step_0000002.pt")["global_step"] == 2
