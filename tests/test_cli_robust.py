"""The ``devplug`` command off the happy path: Ctrl-C at any moment (torch still loading, devices being probed,
checks running) ends it with one ``devplug: interrupted`` line and status 130, never a traceback, and ``--json``
still prints JSON; ``check`` reads a device name as the Trainer does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from interrupts import CTRL_C_AT_TORCH_IMPORT
from paths import REPO

from devplug import _console, cli

#: Run the ``devplug`` command with a Ctrl-C arriving while torch is being imported (the slow part of start-up).
CTRL_C_WHILE_TORCH_LOADS = CTRL_C_AT_TORCH_IMPORT + """
from devplug._console import main
sys.exit(main(sys.argv[1:]))
"""


def _environ() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVPLUG_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


@pytest.mark.parametrize("argv", [["devices"], ["doctor", "--json"]])
def test_ctrl_c_while_torch_loads_is_one_line_and_130(argv):
    done = subprocess.run([sys.executable, "-c", CTRL_C_WHILE_TORCH_LOADS, *argv], capture_output=True, text=True,
                          env=_environ(), timeout=120, cwd=REPO)
    assert done.returncode == 130, done.stderr
    assert done.stderr == "devplug: interrupted\n", done.stderr
    if "--json" in argv:
        assert json.loads(done.stdout) == {"error": "interrupted", "exit_code": 130}
    else:
        assert done.stdout == ""


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_ctrl_c_while_devices_are_probed_is_one_line_and_130(monkeypatch, capsys, json_flag):
    def probing(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "devices_report", probing)
    monkeypatch.setattr(cli, "devices_data", probing)
    assert _console.main(["devices", *json_flag]) == cli.EXIT_INTERRUPTED == 130
    out, err = capsys.readouterr()
    assert err == "devplug: interrupted\n"
    assert (json.loads(out)["exit_code"] == 130) if json_flag else out == ""


def test_ctrl_c_during_check_reports_the_checks_that_ran_and_130(monkeypatch, capsys):
    from devplug.testing import CheckResult

    def checks(device, pm, run_compiled=False):
        yield CheckResult("probe", "passed", "available")
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "iter_checks", checks)
    assert cli.main(["check", "cpu", "--json"]) == 130
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["exit_code"] == 130 and [r["name"] for r in data["results"]] == ["probe"]
    assert err.strip().splitlines() == ["devplug: interrupted after 1 checks"]


@pytest.mark.parametrize("spelling", ["CPU", " cpu "])
def test_check_reads_a_device_name_as_the_trainer_does(monkeypatch, capsys, spelling):
    from devplug.testing import CheckResult

    monkeypatch.setattr(cli, "iter_checks", lambda device, pm, run_compiled=False: iter(
        [CheckResult("probe", "passed", f"asked for {device!r}")]))
    assert cli.main(["check", spelling, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["device"] == "cpu" and data["results"][0]["detail"] == "asked for 'cpu'"


def test_a_command_started_with_stdout_closed_ends_without_a_traceback():
    """``devplug devices >&-``: Python starts with ``sys.stdout`` None; the command must not trip over it."""
    done = subprocess.run([sys.executable, "-m", "devplug", "devices"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, env={**_environ(), "DEVPLUG_DISABLE_PLUGIN_AUTOLOAD": "1"},
                          timeout=120, cwd=REPO, preexec_fn=lambda: os.close(1))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
