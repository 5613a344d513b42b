"""Resuming the DCGAN example: damaged newest checkpoints, options given on the resume command line, rollback."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import devplug

from dcgan import train as example  # examples/dcgan/train.py
from dcgan.step import DCGANStep

TINY = ["--device", "cpu", "--precision", "32-true", "--no-progress", "--workers", "0",
        "--nz", "8", "--ngf", "4", "--ndf", "4", "--image-size", "16", "--batch-size", "4", "--data", "shapes",
        "--keep-checkpoints", "0", "--save-every", "2"]


def run(*argv: str) -> int:
    return example.main([*TINY, *argv])


def lr_of(checkpoint: Path) -> float:
    """The generator optimizer's learning rate in a checkpoint (wherever its format keeps the param groups)."""

    def find(node):
        if isinstance(node, dict):
            if "param_groups" in node:
                return node["param_groups"][0]["lr"]
            return next((v for v in map(find, node.values()) if v is not None), None)
        return None

    return float(find(torch.load(checkpoint, map_location="cpu", weights_only=True)["optimizers"]["generator"]))


def test_auto_resume_skips_a_damaged_newest_checkpoint_and_honours_lr(tmp_path, capsys):
    out = tmp_path / "run"
    assert run("--steps", "4", "--out", str(out)) == 0
    checkpoints = out / "checkpoints"
    (checkpoints / "step_0000004.pt").write_bytes(b"\x00garbage" * 10)  # a damaged newest checkpoint
    capsys.readouterr()
    assert run("--steps", "6", "--out", str(out), "--auto-resume", "--lr", "1e-4") == 0
    captured = capsys.readouterr()
    assert "skipping damaged checkpoint step_0000004.pt" in captured.err
    assert "resumed from" in captured.out and "step_0000002.pt at step 2" in captured.out
    assert "--lr 0.0001 (checkpoint: 0.0002) overrides the checkpoint" in captured.out
    assert lr_of(checkpoints / "step_0000006.pt") == 1e-4


def test_a_checkpoint_that_does_not_fit_the_model_is_not_skipped(tmp_path, capsys):
    out = tmp_path / "run"
    assert run("--steps", "2", "--out", str(out)) == 0
    capsys.readouterr()
    assert run("--steps", "4", "--out", str(out), "--auto-resume", "--ngf", "8") == 2
    err = capsys.readouterr().err
    assert "does not match" in err and "same --model/--nz/--ngf" in err and "skipping" not in err


def test_resuming_from_an_older_checkpoint_sets_the_newer_ones_aside(tmp_path, capsys):
    out = tmp_path / "run"
    assert run("--steps", "6", "--out", str(out)) == 0
    checkpoints = out / "checkpoints"
    assert run("--steps", "4", "--out", str(out), "--resume", str(checkpoints / "step_0000002.pt"),
               "--keep-checkpoints", "1") == 0
    kept = sorted(p.name for p in checkpoints.glob("step_*.pt"))
    assert kept == ["step_0000004.pt"]  # the resumed line; pruning did not keep the abandoned 6
    [aside] = list(checkpoints.glob("abandoned-*"))
    assert sorted(p.name for p in aside.iterdir()) == ["step_0000004.pt", "step_0000006.pt"]
    assert "moved 2 newer one(s)" in capsys.readouterr().out
    assert run("--steps", "5", "--out", str(out), "--auto-resume") == 0  # continues the resumed line
    assert torch.load(checkpoints / "step_0000005.pt", weights_only=True)["global_step"] == 5


def _poison_after(monkeypatch, step: int) -> None:
    """Make the generator's weights NaN right after training step ``step`` (a divergence)."""
    real = DCGANStep.__call__
    calls = {"n": 0}

    def diverging(self, real_images):
        values = real(self, real_images)
        calls["n"] += 1
        if calls["n"] == step:
            with torch.no_grad():
                next(self.net_g.parameters()).fill_(float("nan"))
        return values

    monkeypatch.setattr(DCGANStep, "__call__", diverging)


@pytest.mark.parametrize(("policy", "code"), [("raise", 2), ("warn", 0), ("ignore", 0)])
def test_nan_never_reaches_a_checkpoint_and_auto_resume_continues_from_the_last_good_one(
        tmp_path, monkeypatch, capsys, policy, code):
    out = tmp_path / "run"
    checkpoints = out / "checkpoints"
    with monkeypatch.context() as m:
        _poison_after(m, 3)
        assert run("--steps", "6", "--out", str(out), "--keep-checkpoints", "1", "--log-every", "2",
                   "--nonfinite", policy) == code
    saved = sorted(p.name for p in checkpoints.glob("step_*.pt"))
    assert saved == ["step_0000002.pt"]  # written before the NaN, kept; nothing written after it
    for path in checkpoints.glob("step_*.pt"):
        state = torch.load(path, weights_only=True)
        assert all(torch.isfinite(t).all() for t in state["modules"]["generator"].values() if t.is_floating_point())
    err = capsys.readouterr().err.lower()
    assert ("non-finite" in err) if policy != "raise" else ("diverged" in err and err.count("\n") == 1)
    assert run("--steps", "4", "--out", str(out), "--auto-resume", "--lr", "1e-4") == 0
    assert "resumed from" in capsys.readouterr().out
    assert lr_of(checkpoints / "step_0000004.pt") == 1e-4


def test_a_full_disk_while_saving_says_so_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch, capsys):
    import errno

    out = tmp_path / "run"
    real_save = devplug.Trainer.save

    def save(self, path, **extra):
        if self.global_step >= 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(self, path, **extra)

    monkeypatch.setattr(devplug.Trainer, "save", save)
    assert run("--steps", "6", "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the disk is full: could not write" in err and "step_0000004.pt" in err
    assert "the previous checkpoint" in err and "step_0000002.pt is intact" in err
    assert (out / "checkpoints" / "step_0000002.pt").is_file()
