"""`import devplug` stays cheap: no vendor stack, no TensorBoard."""

import subprocess
import sys

HEAVY = ("habana_frameworks", "apex", "nvidia.dali", "tensorboard", "torch.utils.tensorboard", "torchvision", "tqdm")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"],
        check=True, capture_output=True, text=True,
    ).stdout
    return set(out.split())


def test_import_devplug_loads_no_vendor_stack_or_tensorboard():
    loaded = _modules_after("import devplug") - _modules_after("import torch")
    assert not [m for m in loaded if m.startswith(HEAVY)], sorted(m for m in loaded if m.startswith(HEAVY))


def test_resolving_cpu_loads_no_vendor_stack():
    loaded = _modules_after("from devplug.core.registry.devices import DeviceRegistry\n"
                            "DeviceRegistry().resolve('auto')")
    assert not [m for m in loaded if m.startswith(("habana_frameworks", "apex", "nvidia.dali", "tensorboard"))]

