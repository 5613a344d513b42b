"""Flags of the examples that a user combines wrongly or whose printed advice must work as printed."""

from __future__ import annotations

import pytest

from lm import train as lm_example  # examples/lm/train.py


@pytest.mark.parametrize("strategy", [[], ["--strategy", "ddp"], ["--strategy", "fsdp"]])
def test_lm_tp_without_a_tensor_parallel_strategy_is_one_line_not_ignored(tmp_path, capsys, strategy):
    code = lm_example.main(["--device", "cpu", "--tp", "2", *strategy, "--steps", "1", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("lm: error: --tp 2 splits layers only under --strategy tp or fsdp+tp"), err
    assert not (tmp_path / "o").exists()
