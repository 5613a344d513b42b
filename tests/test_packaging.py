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
from packaging.version import Version
from paths import REPO

import devplug


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """devplug's wheel, built from this checkout: by this environment's setuptools when it is new enough
    (77: the SPDX licence fields), else in an isolated build environment pip fills from its package sources."""
    out = tmp_path_factory.mktemp("wheel")
    try:
        import setuptools
        isolation = [] if Version(setuptools.__version__) < Version("77") else ["--no-build-isolation"]
    except ImportError:
        isolation = []
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", *isolation,
                             *_local_sources(),
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
    # numpy is imported only when an image is decoded: the vision extra declares it, the package does not need it
    assert not any(r.startswith("numpy") and "extra" not in r for r in requires), requires
    assert any(r.startswith("numpy") and 'extra == "vision"' in r for r in requires), requires
    assert any(r.startswith("tomli") and 'python_version < "3.11"' in r for r in requires), requires
    dali = [r for r in requires if r.startswith("nvidia-dali")]
    assert all("cuda130" in r for r in dali if 'extra == "dali"' in r or 'extra == "dev"' in r), dali
    assert any("cuda120" in r and 'extra == "dali-cuda12"' in r for r in requires), dali


def _local_sources() -> list[str]:
    """pip options that keep a fresh install on this machine's own package sources (a local index, a wheel folder).

    pip's configuration is read the way pip reads it (``pip config list``); its ``file://`` indexes replace
    the default index for the install. A machine with no local index gets ``[]``: pip's own configuration.
    """
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    urls: list[str] = []
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(("index-url", "extra-index-url")):
            urls += [url for url in value.strip("'\"").split() if url.startswith("file:")]
    return ["--index-url", urls[0], *(x for url in urls[1:] for x in ("--extra-index-url", url))] if urls else []


def _cpu_torch_wheel() -> list[str]:
    """A CPU build of torch among pip's ``find-links`` folders, handed to pip beside the wheel (a CUDA build
    from an index pulls gigabytes of CUDA libraries); none: pip picks torch from its sources."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    folders = [value.strip("'\"") for key, _, value in (line.partition("=") for line in listed.splitlines())
               if key.endswith("find-links")]
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    found = sorted(wheel for folder in folders for part in folder.split() if Path(part).is_dir()
                   for wheel in Path(part).glob(f"torch-*+cpu-{tag}-*.whl"))
    return [str(found[-1])] if found else []


TINY_LOOP = """
import torch, devplug
trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, seed=0)
model = trainer.setup(torch.nn.Linear(4, 1))
optimizer = trainer.optimizer("sgd", model.parameters(), lr=0.1)
loader = trainer.dataloader(torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
for _ in trainer.epochs(2):
    for x, y in loader:
        trainer.backward(torch.nn.functional.mse_loss(model(x), y))
        trainer.step(optimizer)
print("steps", trainer.global_step)
"""


@pytest.mark.slow  # about 1.5 minutes: pip installs torch's CPU wheel into an empty venv
def test_the_wheel_installs_with_its_dependencies_and_runs_in_a_fresh_environment(wheel, tmp_path):
    """The wheel and what it declares, resolved by pip into an empty venv (no ``--no-deps``, nothing of this
    environment on the path): ``import devplug``, both commands and a short Trainer loop work there."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    environ = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("DEVPLUG_")}
    install = subprocess.run([python, "-m", "pip", "install", "-q", *_local_sources(), str(wheel), *_cpu_torch_wheel()],
                             capture_output=True, text=True, env=environ, cwd=tmp_path, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr

    def run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*argv], capture_output=True, text=True, env=environ, cwd=tmp_path, timeout=600)

    site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    where = run(python, "-c", "import devplug; print(devplug.__file__)")
    assert where.returncode == 0, where.stderr
    assert where.stdout.startswith(site), where.stdout  # the installed wheel, not this checkout
    version = run(env_dir / "bin" / "devplug", "--version")
    assert version.stdout.strip() == f"devplug {devplug.__version__}", version.stdout + version.stderr
    devices = run(env_dir / "bin" / "devplug", "devices")
    assert devices.returncode == 0, devices.stderr
    assert "'auto' selects:" in devices.stdout
    check = run(env_dir / "bin" / "devplug", "check", "cpu")
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.rstrip().endswith("0 failed, 0 not applicable on this machine"), check.stdout
    loop = run(python, "-c", TINY_LOOP)
    assert loop.returncode == 0 and loop.stdout.strip().endswith("steps 8"), loop.stdout + loop.stderr
