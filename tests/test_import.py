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



NEVER_AT_IMPORT = ("tensorboard", "mlflow", "PIL", "torchvision", "habana_frameworks", "apex", "nvidia.dali")


def test_import_devplug_imports_no_logger_image_or_vendor_stack_at_all():
    loaded = _modules_after("import devplug")
    assert not [m for m in loaded if m.split(".")[0] in NEVER_AT_IMPORT or m.startswith(NEVER_AT_IMPORT)], sorted(
        m for m in loaded if m.startswith(NEVER_AT_IMPORT))


def test_import_devplug_leaves_the_plugins_for_later():
    loaded = _modules_after("import devplug")
    later = ("devplug.plugins", "packaging")
    assert not [m for m in loaded if m.startswith(later)], sorted(m for m in loaded if m.startswith(later))


def test_import_devplug_loads_none_of_its_records_registry_trainer_or_their_libraries():
    loaded = _modules_after("import torch\nimport devplug") - _modules_after("import torch")
    eager = sorted(m for m in loaded if m.startswith(("devplug.", "attr", "pluggy")) and m != "devplug._version")
    assert not eager, eager  # each loads when its first public name is used (devplug.Trainer, devplug.DeviceSpec)
