"""The ``devplug`` command as a shell user meets it: --version at once, --help in plain words, a pipe closed
early, and ``devplug consolidate``."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest
import torch
from dist_scripts.fsdp_model import Block, lm_loss, make_lm, rank_batch
from paths import REPO

import devplug
from devplug import cli


def _environ() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVPLUG_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["DEVPLUG_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return env


def test_version_answers_without_importing_torch():
    code = ("import sys\nfrom devplug._console import main\nstatus = main(['--version'])\n"
            "print('torch imported' if 'torch' in sys.modules else 'no torch', status)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_environ(),
                            timeout=120, cwd=REPO)
    assert result.stdout.splitlines() == [f"devplug {devplug.__version__}", "no torch 0"], result.stdout + result.stderr
    script = subprocess.run([sys.executable, "-m", "devplug", "--version"], capture_output=True, text=True,
                            env=_environ(), timeout=120, cwd=REPO)
    assert script.returncode == 0 and script.stdout == f"devplug {devplug.__version__}\n", script.stderr


def test_the_console_script_is_the_light_entry_point():
    text = (REPO / "pyproject.toml").read_text()
    assert 'devplug = "devplug._console:main"' in text


def test_a_reader_that_stops_early_ends_the_command_quietly():
    """``devplug doctor | head``: the reader is gone before the report is written; no traceback, SIGPIPE's status."""
    process = subprocess.Popen([sys.executable, "-m", "devplug", "doctor"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=_environ(), cwd=REPO)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # no reader: the first write fails with EPIPE, every time
    err = process.stderr.read().decode()
    assert process.wait(timeout=300) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def _all_help() -> dict[str, str]:
    parser = cli.build_parser()
    texts = {"devplug": parser.format_help()}
    for action in parser._actions:
        if isinstance(action, type(parser._subparsers._group_actions[0])):  # type: ignore[union-attr]
            texts.update({f"devplug {name}": sub.format_help() for name, sub in action.choices.items()})
    return texts


def test_help_is_plain_text_without_markup():
    texts = _all_help()
    assert set(texts) == {"devplug", "devplug devices", "devplug check", "devplug doctor", "devplug consolidate"}
    for command, text in texts.items():
        for markup in ("``", ":class:", ":func:", ":meth:", "`devplug.", ".. "):
            assert markup not in text, f"{command} --help shows {markup!r}:\n{text}"
    assert "consolidate" in texts["devplug"] and "Exit codes: 0 success" in " ".join(texts["devplug"].split())


# ---- consolidate -------------------------------------------------------------------------------------------


@pytest.fixture
def sharded_checkpoint(tmp_path):
    """A sharded checkpoint of a small language model (one process, a group of one) and its full weights."""
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, seed=0, strategy="fsdp")
    model = trainer.setup(make_lm(), name="lm", shard=[Block])
    optimizer = trainer.optimizer("adamw", model.parameters(), lr=1e-2)
    trainer.backward(lm_loss(model, rank_batch(0, 0, 1)))
    trainer.step(optimizer)
    trainer.save(tmp_path / "ckpt")
    weights = {name: (value.full_tensor() if hasattr(value, "full_tensor") else value).detach().clone()
               for name, value in model.state_dict().items()}
    trainer.close()
    return tmp_path / "ckpt", weights


def test_consolidate_writes_the_full_weights_as_one_plain_file(sharded_checkpoint, tmp_path, capsys):
    folder, weights = sharded_checkpoint
    assert folder.is_dir()
    assert cli.main(["consolidate", str(folder), str(tmp_path / "out" / "lm.pt")]) == 0
    assert "lm.pt" in capsys.readouterr().out
    written = torch.load(tmp_path / "out" / "lm.pt", weights_only=True)
    assert written.keys() == weights.keys()
    assert all(torch.equal(written[name], weights[name]) for name in weights)
    plain = make_lm()
    plain.load_state_dict(written)  # a plain module takes it as it is


@pytest.mark.parametrize("source", ["missing", "file.pt", "folder"])
def test_consolidate_of_something_that_is_not_a_sharded_checkpoint_is_one_line(tmp_path, capsys, source):
    (tmp_path / "file.pt").write_bytes(b"x")
    (tmp_path / "folder").mkdir()
    assert cli.main(["consolidate", str(tmp_path / source), str(tmp_path / "out.pt")]) == cli.EXIT_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("devplug: error: "), err
    assert ("does not exist" if source == "missing" else "not a sharded checkpoint") in err[0]
    assert not (tmp_path / "out.pt").exists()


def test_every_public_name_is_imported_on_first_use():
    code = ("import sys, devplug\nbefore = 'torch' in sys.modules\n"
            "names = [n for n in devplug.__all__ if getattr(devplug, n) is None and n != '__version__']\n"
            "print(before, names, set(devplug.__all__) <= set(dir(devplug)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_environ(),
                            timeout=300, cwd=REPO)
    assert result.stdout.split("\n")[0] == "False [] True", result.stdout + result.stderr
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        devplug.Nope  # noqa: B018


@pytest.mark.parametrize("where", ["under_a_file", "full_disk"])
def test_consolidate_into_a_place_it_cannot_write_is_one_line(sharded_checkpoint, tmp_path, capsys, monkeypatch,
                                                              where):
    folder, _weights = sharded_checkpoint
    (tmp_path / "a_file").write_text("x")
    target = tmp_path / "a_file" / "lm.pt" if where == "under_a_file" else tmp_path / "out" / "lm.pt"
    if where == "full_disk":
        def full(*args, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(torch, "save", full)
    assert cli.main(["consolidate", str(folder), str(target)]) == cli.EXIT_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    start = "cannot save checkpoint " if where == "under_a_file" else "the disk is full: could not write "
    assert len(err) == 1 and err[0].startswith(f"devplug: error: {start}{str(target)!r}"), err
    if where == "under_a_file":  # in plain words, not "[Errno 17] File exists"
        assert f"{str(tmp_path / 'a_file')!r} is a file, not a folder" in err[0], err
    assert not target.exists() and (not target.parent.is_dir() or not list(target.parent.iterdir()))


def test_consolidate_refuses_to_write_into_the_checkpoint_it_reads(sharded_checkpoint, capsys):
    """A file added to a sharded checkpoint folder makes it read as damaged: that target is refused."""
    folder, _weights = sharded_checkpoint
    assert cli.main(["consolidate", str(folder), str(folder / "lm.pt")]) == cli.EXIT_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "inside the checkpoint" in err[0], err
    assert not (folder / "lm.pt").exists()
    from devplug.core.checkpoint.sharded import check_sharded

    check_sharded(folder)  # still intact
