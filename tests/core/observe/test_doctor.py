"""`devplug doctor`: versions, the environment that changes devices, incompatible pairs and plugins' warnings."""

from __future__ import annotations

import importlib.metadata as metadata
import os
import subprocess
import sys
import time

import pytest
import torch
from distributions import pip_install, write_project
from paths import REPO

import devplug
from devplug.cli import doctor_report
from devplug.core.registry.manager import create_plugin_manager
from devplug.plugins.hpu import doctor as hpu_doctor

TOY_DOCTOR = """
import devplug

DEVPLUG_CONTRACT = "1.2"


@devplug.hookimpl
def devplug_doctor():
    return devplug.DoctorReport(packages=("toy-doctor",), versions={"toy runtime": "7.1"}, env=("TOY_*",),
                                warnings=("toy warning: the widget is loose",))
"""

BROKEN_DOCTOR = """
import devplug

DEVPLUG_CONTRACT = "1.2"


@devplug.hookimpl
def devplug_doctor():
    raise RuntimeError("cannot read the widget")
"""


def _doctor(env: dict[str, str]) -> tuple[str, float]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPLUG_", "PT_HPU_", "NCCL_"))}
    environ.update(env, PYTHONPATH=str(REPO))
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "devplug.cli", "doctor"], capture_output=True, text=True,
                            env=environ, timeout=60)
    elapsed = time.perf_counter() - start
    assert result.returncode == 0, result.stderr
    return result.stdout, elapsed


def test_doctor_prints_versions_plugins_devices_and_the_environment():
    out, _ = _doctor({"CUDA_VISIBLE_DEVICES": "3", "NCCL_DEBUG": "INFO", "DEVPLUG_DEVICE": "cpu",
                            "PT_HPU_LAZY_MODE": "0"})
    # about 1 s on an idle machine; not asserted (a loaded machine takes 10 s and more): a doctor that hangs on a
    # probe is caught by the subprocess's time limit
    lines = out.splitlines()
    assert any(line.split() == ["devplug", devplug.__version__] for line in lines)
    assert any(line.split() == ["torch", torch.__version__] for line in lines)
    assert any(line.split()[:2] == ["python", sys.version.split()[0]] for line in lines)
    for plugin in ("cpu", "cuda", "hpu", "generic", "devplug.fallback"):
        assert any(line.split()[:1] == [plugin] for line in lines), plugin
    assert "  cpu: available" in lines
    for setting in ("CUDA_VISIBLE_DEVICES=3", "NCCL_DEBUG=INFO", "DEVPLUG_DEVICE=cpu", "PT_HPU_LAZY_MODE=0"):
        assert f"  {setting}" in lines
    assert "  Gaudi execution mode" not in out or "eager" in out
    assert "drop_last" not in out


def test_lazy_mode_contributes_the_drop_last_warning():
    out, _ = _doctor({"PT_HPU_LAZY_MODE": "1"})
    warnings = out.split("Warnings:")[1]
    assert "[hpu] lazy mode (PT_HPU_LAZY_MODE=1): build training loaders with drop_last=True" in warnings


def test_hpu_mode_is_read_without_the_bridge():
    assert hpu_doctor.declared_mode({}) is None  # no bridge installed here, no variable: nothing to say
    assert hpu_doctor.declared_mode({"PT_HPU_LAZY_MODE": "0"}) == "eager"
    assert hpu_doctor.declared_mode({"PT_HPU_LAZY_MODE": "1"}) == "lazy"
    assert hpu_doctor.warnings({"PT_HPU_LAZY_MODE": "0"}) == []


@pytest.fixture
def toy_plugins(tmp_path, monkeypatch):
    """Two entry-point plugins: one whose distribution requires torch<1 (unmet here), one whose hook raises."""
    src = write_project(tmp_path / "src-toy", "toy-doctor", "0.3.1", {"__init__.py": TOY_DOCTOR},
                        {"toydoctor": "toy_doctor"})
    pyproject = src / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('version = "0.3.1"',
                                                       'version = "0.3.1"\ndependencies = ["torch<1"]'))
    broken = write_project(tmp_path / "src-broken", "broken-doctor", "1.0", {"__init__.py": BROKEN_DOCTOR},
                           {"brokendoctor": "broken_doctor"})
    for source in (src, broken):
        monkeypatch.syspath_prepend(str(pip_install(source, tmp_path / f"site-{source.name}")))
    for mod in [m for m in sys.modules if m.startswith(("toy_doctor", "broken_doctor"))]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setenv("TOY_COLOUR", "blue")


def test_plugins_contribute_versions_variables_incompatible_pairs_and_warnings(toy_plugins):
    out = doctor_report(create_plugin_manager())
    lines = out.splitlines()
    assert any(line.split() == ["toy-doctor", "0.3.1"] for line in lines)
    assert any(line.split() == ["toy", "runtime", "7.1"] for line in lines)
    assert "  TOY_COLOUR=blue" in lines
    incompatible = out.split("Incompatible pairs:")[1].split("Warnings:")[0]
    torch_version = metadata.version("torch")
    assert f"[toydoctor] toy-doctor 0.3.1 requires torch<1, but torch {torch_version} is installed" in incompatible
    warnings = out.split("Warnings:")[1]
    assert "[toydoctor] toy warning: the widget is loose" in warnings
    assert "[brokendoctor] its doctor hook failed: devplug_doctor of plugin 'brokendoctor'" in warnings
    assert "RuntimeError: cannot read the widget" in warnings


def test_a_doctor_report_holds_one_line_strings():
    with pytest.raises(ValueError, match=r"DoctorReport\.warnings must hold non-empty strings"):
        devplug.DoctorReport(warnings=("",))
