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


#: What a plain CPU Trainer never needs until a feature is used: checkpoint files, policy, resume and lock; data
#: loaders; optimizer-state conversion; collectives; the summary; the plugins' loaders and optimizer builders;
#: TensorBoard, distributed checkpointing and the compiler.
LATER_THAN_A_PLAIN_TRAINER = (
    "devplug.core.checkpoint.file", "devplug.core.checkpoint.policy", "devplug.core.checkpoint.resume",
    "devplug.core.checkpoint.runlock", "devplug.core.checkpoint.rng", "devplug.core.checkpoint.validate",
    "devplug.core.checkpoint.sharded", "devplug.core.checkpoint.tempfiles", "devplug.core.data.device_loader",
    "devplug.core.data.torch_loader", "devplug.core.optim.canonical", "devplug.core.optim.conversion",
    "devplug.core.distributed.reduce", "devplug.core.distributed.combine", "devplug.core.distributed.process_group",
    "devplug.plugins.cuda.dali", "devplug.plugins.cuda.optimizers",
    "devplug.plugins.hpu.optimizers", "devplug.plugins.generic.trial", "torch.distributed.checkpoint",
    "torch.utils.tensorboard", "tensorboard", "torchvision", "PIL",
)
A_FEW_STEPS = tuple(m for m in LATER_THAN_A_PLAIN_TRAINER
                            if m not in ("devplug.core.optim.conversion",))

A_FEW_STEPS = """
import torch
from devplug import Trainer
trainer = Trainer()
model = trainer.setup(torch.nn.Linear(4, 2))
optimizer = trainer.optimizer("sgd", model.parameters(), lr=0.1)
for _ in range(3):
    with trainer.autocast():
        loss = model(torch.randn(8, 4, device=trainer.torch_device)).square().mean()
    trainer.backward(loss)
    trainer.step(optimizer)
    trainer.log(loss=loss)
"""


def _loaded_of(names: tuple[str, ...], loaded: set[str]) -> list[str]:
    return sorted(name for name in names if name in loaded)


def test_from_devplug_import_trainer_and_a_plain_cpu_trainer_leave_every_feature_for_later(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    imported = _modules_after("import torch\nfrom devplug import Trainer")
    assert not _loaded_of((*LATER_THAN_A_PLAIN_TRAINER, "torch._dynamo"), imported)
    built = _modules_after("import torch\nfrom devplug import Trainer\nTrainer(device='cpu')")
    assert "devplug.plugins.cpu.plugin" in built  # the device was resolved: the plugins loaded
    assert not _loaded_of((*LATER_THAN_A_PLAIN_TRAINER, "torch._dynamo"), built)


def test_a_few_plain_training_steps_load_no_checkpoint_loader_or_logging_backend(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    loaded = _modules_after(A_FEW_STEPS)
    assert "devplug.core.optim.build" in loaded  # the steps ran through the Trainer's optimizer
    assert not _loaded_of(LATER_THAN_A_PLAIN_TRAINER, loaded)  # torch's optimizers load its compiler themselves
