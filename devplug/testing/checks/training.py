"""End-to-end checks: a Trainer on the device lowers a toy loss, and its checkpoint loads on the CPU.

They cover no hook of their own, so they run last, after every hook's check.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from devplug.testing.kit import DeviceUnderTest, conformance_check, on_device, tensors_in, toy_regression

if TYPE_CHECKING:
    from devplug.core.loop.trainer import Trainer


def _train(dut: DeviceUnderTest, precision: str, steps_epochs: int = 4) -> tuple[Trainer, torch.nn.Module, list[float]]:
    """A Trainer run of ``steps_epochs`` epochs on a toy regression, with the full-data loss after each."""
    dut.require_available()
    trainer = dut.trainer(precision=precision, seed=0, log_every=1000)
    model = trainer.setup(torch.nn.Linear(4, 1), name="toy")
    optimizer = trainer.optimizer("adam", model.parameters(), lr=0.05)
    x, y = toy_regression(64)
    loader = trainer.dataloader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True, num_workers=0,
                                persistent_workers=False)
    xd, yd = trainer.to_device(x), trainer.to_device(y)

    def full_loss() -> float:
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(model(xd).float(), yd).cpu())

    losses = [full_loss()]
    for _epoch in trainer.epochs(steps_epochs):
        for inputs, targets in loader:
            if not on_device(inputs, trainer.device):
                raise dut.fail(f"the Trainer's loader gave a batch on {inputs.device}, not {trainer.torch_device}")
            with trainer.autocast():
                loss = torch.nn.functional.mse_loss(model(inputs).float(), targets)
            trainer.backward(loss)
            trainer.step(optimizer)
            trainer.log(loss=loss)
        losses.append(full_loss())
    return trainer, model, losses


@conformance_check(options={"precision": "training_precision"})
def check_training(dut: DeviceUnderTest, precision: str = "auto") -> str:
    """A few Trainer steps (setup, optimizer, loader, autocast, backward, step, log) lower a toy loss."""
    trainer, _model, losses = _train(dut, precision)
    if not all(math.isfinite(v) for v in losses) or not losses[-1] < losses[0]:
        raise dut.fail(f"16 Trainer steps ({trainer.precision.name}) did not lower a toy loss: {losses}")
    summary = trainer.summary()
    trainer.close()
    return (f"loss {losses[0]:.3f} -> {losses[-1]:.3f} in {summary['steps']} steps "
            f"({summary['precision']}, {', '.join(summary['optimizers'].values())})")


@conformance_check(options={"precision": "training_precision"})
def check_checkpoint_on_cpu(dut: DeviceUnderTest, precision: str = "auto") -> str:
    """A checkpoint saved by a Trainer on the device holds only CPU tensors and loads into a CPU model."""
    trainer, model, _losses = _train(dut, precision, steps_epochs=1)
    with tempfile.TemporaryDirectory(prefix="devplug-conformance-") as tmp:
        path = Path(tmp) / "checkpoint.pt"
        trainer.save(path)
        trainer.close()
        try:
            state = torch.load(path, weights_only=True)  # no map_location: device tensors would fail here
        except Exception as exc:
            raise dut.fail(f"its checkpoint does not load without the device: {type(exc).__name__}: {exc}") from exc
    off_cpu = sorted({str(t.device) for t in tensors_in(state) if t.device.type != "cpu"})
    if off_cpu:
        raise dut.fail(f"its checkpoint holds tensors on {', '.join(off_cpu)}; save CPU copies")
    cpu_model = torch.nn.Linear(4, 1)
    try:
        cpu_model.load_state_dict(state["modules"]["toy"])
    except (KeyError, RuntimeError) as exc:
        raise dut.fail(f"its checkpoint does not load into a CPU model: {exc}") from exc
    trained = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    for key, value in cpu_model.state_dict().items():
        if not torch.allclose(value.float(), trained[key]):
            raise dut.fail(f"the CPU copy of {key} differs from the trained value on the device")
    return f"checkpoint of {len(state['modules']['toy'])} tensors loads on the CPU"
