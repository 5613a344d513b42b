"""The template plugin (examples/template_plugin), pip-installed into a temporary target.

Installed once per module (offline: ``--no-index --no-deps --no-build-isolation``); subprocesses see it
through ``PYTHONPATH``, in-process tests by putting the target on ``sys.path`` for one test.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from distributions import pip_install
from paths import REPO

import devplug
from devplug import cli
from devplug.cli import devices_report
from devplug.core.contract import hookspecs
from devplug.core.registry.devices import DeviceRegistry
from devplug.core.registry.manager import DevplugPluginManager, create_plugin_manager
from devplug.testing import DeviceConformance

TEMPLATE = REPO / "examples" / "template_plugin"
DISTRIBUTION = "devplug-template-device 0.1.0"
PACKAGE = "devplug_template_device"
GUIDE = REPO / "docs" / "plugins.md"


def documented_console(command: str) -> list[str]:
    """The lines of the console excerpt of docs/plugins.md that starts with ``$ command``."""
    blocks = re.findall(r"```console\n\$ (.*?)\n(.*?)```", GUIDE.read_text(), re.S)
    [lines] = [body.splitlines() for shown, body in blocks if shown == command]
    return lines


def _normalized(line: str) -> str:
    """A line with its column padding and its timings (which differ from run to run) left out."""
    return re.sub(r"\d+ ms\b", "N ms", " ".join(line.split()))


def assert_excerpt_of(documented: list[str], real: str) -> None:
    """Every documented line is a real line, in order; ``...`` stands for lines left out, and a line ending in
    ``, ...`` for the rest of a real line."""
    real_lines = [_normalized(line) for line in real.splitlines()]
    position = 0
    for line in documented:
        want = _normalized(line)
        if want == "...":
            continue
        prefix = want[:-3] if want.endswith(", ...") else None
        for index in range(position, len(real_lines)):
            got = real_lines[index]
            if got == want or (prefix is not None and got.startswith(prefix)):
                position = index + 1
                break
        else:
            raise AssertionError(f"docs/plugins.md shows {line!r}, which the real output lacks (at or after line "
                                 f"{position + 1}); the real output is:\n{real}")


def run(args: list[str], *, pythonpath: Path | None = None, cwd: Path = REPO,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command with a clean devplug environment and ``pythonpath`` first on the path."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPLUG_", "CPUSIM_"))}
    environ["PYTHONPATH"] = str(REPO)  # this checkout's devplug, whichever one is installed
    if pythonpath is not None:
        environ["PYTHONPATH"] = os.pathsep.join((str(pythonpath), str(REPO)))
    environ.update(env or {})
    return subprocess.run(args, cwd=cwd, env=environ, capture_output=True, text=True, timeout=600)


def devplug_command() -> list[str]:
    """The ``devplug`` console script of this interpreter's environment (or the module when absent)."""
    script = Path(sys.executable).with_name("devplug")
    return [str(script)] if script.exists() else [sys.executable, "-m", "devplug.cli"]


@pytest.fixture(scope="module")
def template_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/template_plugin installed into a temporary target folder."""
    return pip_install(TEMPLATE, tmp_path_factory.mktemp("template") / "site")


@pytest.fixture
def on_path(template_site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The installed template importable in this process for one test."""
    monkeypatch.syspath_prepend(str(template_site))
    yield template_site
    for name in [m for m in sys.modules if m.split(".")[0] == PACKAGE]:
        del sys.modules[name]


# ---- installed: listed, usable, conformant --------------------------------------------------------------
def test_devplug_devices_lists_the_device_and_its_distribution(template_site):
    result = run([*devplug_command(), "devices"], pythonpath=template_site)
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("cpusim "))
    assert row.split()[:6] == ["cpusim", "-10", "available", "1", "cpusim", "devplug-template-device"]
    assert row.endswith(DISTRIBUTION)
    assert "'auto' selects: cpu" in result.stdout  # a simulator never wins auto
    assert "failed to load" not in result.stdout


def test_verbose_listing_shows_hooks_version_and_distribution_per_plugin(on_path):
    report = devices_report(create_plugin_manager(), verbose=True)
    lines = report.splitlines()
    device_row = lines.index(next(line for line in lines if line.startswith("  cpusim ")))
    assert lines[device_row].split()[:-2] == ["cpusim", "device", "plugin", "(cpusim)", "devplug-template-device",
                                              "0.1.0", devplug.CONTRACT_VERSION]
    assert lines[device_row].split()[-1] in ("ms", "s")  # its import time
    hooks = lines[device_row + 1].split(": ", 1)[1].split(", ")
    assert hooks == sorted(fn.__name__ for fn in hookspecs.HOOKS)  # the template implements every hook
    neutral = lines.index(next(line for line in lines if line.startswith("  cpusim_stepcount ")))
    assert lines[neutral].split()[1:-2] == ["device-neutral", "devplug-template-device", "0.1.0",
                                            devplug.CONTRACT_VERSION]
    assert lines[neutral + 1].strip() == "hooks: devplug_mark_step [wrapper]"
    assert "  cpusim: simulated accelerator on the host CPU (devplug template plugin)" in lines


def test_the_plugins_own_test_suite_with_the_conformance_kit_passes(template_site, tmp_path):
    tests = tmp_path / "template-tests"
    shutil.copytree(TEMPLATE / "tests", tests)
    result = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)],
                 pythonpath=template_site, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " passed" in result.stdout and "skipped" not in result.stdout and "failed" not in result.stdout


def test_devplug_check_command_passes_for_the_template(on_path, capsys):
    assert cli.main(["check", "cpusim"]) == 0
    out = capsys.readouterr().out
    assert "precision[16-mixed]: refuses 16-mixed: cpusim has no fp16 units" in out
    assert ", 0 failed, 0 not applicable" in out
    assert_excerpt_of(documented_console("devplug check cpusim"), out)


def test_the_documented_listing_is_the_real_one(on_path, capsys):
    assert cli.main(["devices", "--verbose"]) == 0
    assert_excerpt_of(documented_console("devplug devices --verbose"), capsys.readouterr().out)


class TestTemplateConformance(DeviceConformance):
    """The kit, in this process, against the installed entry points."""

    device_name = "cpusim"
    require_available = True

    @pytest.fixture(autouse=True)
    def _installed(self, on_path: Path) -> None:
        """Make the installed template importable before the kit builds its plugin manager."""


def test_dcgan_example_trains_on_the_template_device(template_site, tmp_path):
    script = REPO / "examples" / "dcgan.py"
    if not script.exists():
        pytest.skip("examples/dcgan.py does not exist yet (written in another issue)")
    result = run(
        [sys.executable, str(script), "--device", "cpusim", "--data", "fake", "--model", "tiny-32", "--steps", "2",
         "--batch-size", "4", "--workers", "0", "--log-every", "1", "--no-progress", "--out", str(tmp_path / "run"),
         "--cache-dir", str(tmp_path / "cache")],
        pythonpath=template_site,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout + result.stderr
    assert "device cpusim (plugin cpusim)" in out
    assert "torch.optim.Adam(foreach=True)" in out  # the template's optimizer hook, for both networks
    assert "cpusim: torch DataLoader" in out  # and its data loader hook
    assert (tmp_path / "run" / "checkpoints" / "step_0000002.pt").exists()


def test_a_trainer_in_process_runs_every_hook_of_the_plugin(on_path):
    import torch
    from devplug_template_device import device as cpusim
    from devplug_template_device import stepcount

    pm = create_plugin_manager()
    trainer = devplug.Trainer(device="cpusim", precision="bf16-mixed", progress=False, plugin_manager=pm,
                              device_options={"threads": torch.get_num_threads()})
    model = trainer.setup(torch.nn.Linear(4, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    loader = trainer.dataloader(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4,
                                num_workers=0)
    for _epoch in trainer.epochs(1):
        for x, y in loader:
            with trainer.autocast():
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            trainer.backward(loss)
            trainer.step(opt)
    summary = trainer.summary()
    assert summary["device_plugin"] == "cpusim"
    assert summary["precision_detail"] == "cpusim: torch.autocast('cpu', bfloat16)"
    assert summary["optimizers"] == {"linear": "torch.optim.SGD(foreach=True)"}  # keyed by its module
    assert summary["loaders"] == ["cpusim: torch DataLoader(workers=0, pin_memory=False)"]
    assert summary["memory"].peak_allocated > 0
    assert cpusim.MARKED["optimizer_step"] >= 2 and stepcount.steps("cpusim") >= 2


def test_a_copy_that_renames_the_device_says_its_own_name_everywhere(on_path, monkeypatch):
    """The README's "Make it yours" changes ``NAME``: no message, description or warning keeps saying cpusim."""
    from devplug_template_device import device as template

    monkeypatch.setattr(template, "NAME", "mydev")
    monkeypatch.setenv(template.ENV_DISABLE, "1")
    spec = template.devplug_register_devices()
    assert spec.name == "mydev"
    device = devplug.Device(spec=spec, index=None, plugin_name="mydev")
    with pytest.raises(devplug.PrecisionError) as refused:
        template.devplug_precision(device, "16-mixed")
    texts = [str(refused.value), template.devplug_precision(device, "bf16-mixed").description,
             *template.devplug_doctor().warnings]
    assert all("mydev" in text and "cpusim" not in text for text in texts), texts


def test_the_step_counter_is_device_neutral_and_can_be_blocked(on_path):
    import torch
    from devplug_template_device import stepcount

    def one_step(pm: DevplugPluginManager) -> None:
        trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, plugin_manager=pm)
        model = trainer.setup(torch.nn.Linear(2, 1))
        opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
        trainer.backward(model(torch.ones(1, 2)).sum())
        trainer.step(opt)

    before = stepcount.steps("cpu")
    one_step(create_plugin_manager())
    assert stepcount.steps("cpu") == before + 1  # wraps the built-in CPU plugin's step marking too
    one_step(create_plugin_manager(blocked=["cpusim_stepcount"]))
    assert stepcount.steps("cpu") == before + 1


def test_unavailable_probe_gives_reason_and_fix(on_path, monkeypatch):
    monkeypatch.setenv("CPUSIM_DISABLE", "1")
    report = devices_report(create_plugin_manager())
    assert "  cpusim: CPUSIM_DISABLE is set. Fix: unset CPUSIM_DISABLE to use the simulated device" in report
    with pytest.raises(devplug.DeviceUnavailableError, match="'cpusim' is not available: CPUSIM_DISABLE is set"):
        devplug.Trainer(device="cpusim", progress=False, plugin_manager=create_plugin_manager())


# ---- not installed: gone ---------------------------------------------------------------------------------
def test_without_the_package_the_device_is_gone():
    result = run([*devplug_command(), "devices", "--verbose"])
    assert result.returncode == 0, result.stderr
    assert "cpusim" not in result.stdout
    registry = DeviceRegistry(create_plugin_manager())
    assert "cpusim" not in registry.names()
    with pytest.raises(devplug.UnknownDeviceError, match="unknown device 'cpusim'"):
        devplug.Trainer(device="cpusim", progress=False)


def test_blocking_or_disabling_autoload_removes_it(on_path, monkeypatch):
    monkeypatch.setenv("DEVPLUG_BLOCK_PLUGINS", "cpusim")
    blocked = devices_report(create_plugin_manager(), verbose=True)
    assert "cpusim " not in blocked and "  cpusim_stepcount " in blocked
    assert "Blocked plugins (DEVPLUG_BLOCK_PLUGINS or blocked=): cpusim" in blocked
    monkeypatch.delenv("DEVPLUG_BLOCK_PLUGINS")
    monkeypatch.setenv("DEVPLUG_DISABLE_PLUGIN_AUTOLOAD", "1")
    disabled = devices_report(create_plugin_manager(), verbose=True)
    assert "cpusim" not in disabled
    assert "Entry-point plugins were not loaded: DEVPLUG_DISABLE_PLUGIN_AUTOLOAD is set." in disabled
