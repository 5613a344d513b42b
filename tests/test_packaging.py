"""The wheel: what it holds and declares, and (slow) that it installs and runs in a fresh environment."""

from __future__ import annotations

import email
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
import torch
from paths import REPO

import devplug


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """devplug's wheel, built from this checkout (no build isolation: the environment's setuptools builds it)."""
    pytest.importorskip("setuptools", minversion="77")
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "--no-build-isolation",
                             "-q", "-w", str(out)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr.lower(), result.stderr  # e.g. setuptools on the license fields
    (built,) = out.glob("devplug-*.whl")
    return built


def test_the_wheel_holds_the_package_its_plugins_and_nothing_else(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/", 1)[0] for name in names}
    assert tops == {"devplug", f"devplug-{devplug.__version__}.dist-info"}, tops  # no tests/, examples/, benchmarks/
    for module in ("devplug/__init__.py", "devplug/__main__.py", "devplug/cli.py", "devplug/py.typed",
                   "devplug/testing/kit.py", "devplug/plugins/cpu/__init__.py", "devplug/plugins/cuda/__init__.py",
                   "devplug/plugins/hpu/__init__.py", "devplug/plugins/generic/__init__.py"):
        assert module in names, module
    assert f"devplug-{devplug.__version__}.dist-info/licenses/LICENSE" in names


def test_the_wheel_declares_its_licence_floors_and_extras(wheel):
    with zipfile.ZipFile(wheel) as archive:
        metadata = email.message_from_bytes(archive.read(f"devplug-{devplug.__version__}.dist-info/METADATA"))
        licence = archive.read(f"devplug-{devplug.__version__}.dist-info/licenses/LICENSE").decode()
    assert metadata["License-Expression"] == "Apache-2.0"
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence
    assert "Typing :: Typed" in metadata.get_all("Classifier")
    requires = metadata.get_all("Requires-Dist")
    assert "torch>=2.13" in requires
    assert not any(r.startswith("tensorboard") and "extra" not in r for r in requires)  # optional: CSV without it
    assert any(r.startswith("tensorboard") and 'extra == "tensorboard"' in r for r in requires)
    dali = [r for r in requires if r.startswith("nvidia-dali")]
    assert all("cuda130" in r for r in dali if 'extra == "dali"' in r or 'extra == "dev"' in r), dali
    assert any("cuda120" in r and 'extra == "dali-cuda12"' in r for r in requires), dali


@pytest.mark.slow
def test_the_wheel_installs_and_runs_in_a_fresh_environment(wheel, tmp_path):
    """A fresh venv that reuses this environment's torch and other dependencies through a .pth file (pip does
    not resolve against such a path, hence --no-deps; the import of devplug and both commands need them)."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "reuse-torch.pth").write_text(str(Path(torch.__file__).resolve().parents[1]) + "\n")
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("DEVPLUG_")}
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheel)], check=True,
                   env=environ, cwd=tmp_path, timeout=600)
    where = subprocess.run([python, "-c", "import devplug; print(devplug.__file__)"], capture_output=True, text=True,
                           env=environ, cwd=tmp_path, check=True).stdout
    assert where.startswith(site), where  # the installed wheel, not this checkout
    devices = subprocess.run([env_dir / "bin" / "devplug", "devices"], capture_output=True, text=True, env=environ,
                             cwd=tmp_path, timeout=300)
    assert devices.returncode == 0, devices.stderr
    assert "'auto' selects:" in devices.stdout
    check = subprocess.run([env_dir / "bin" / "devplug", "check", "cpu"], capture_output=True, text=True,
                           env=environ, cwd=tmp_path, timeout=600)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.rstrip().endswith("0 failed, 0 not applicable on this machine"), check.stdout
