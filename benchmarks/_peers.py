"""The same training step driven by a raw PyTorch loop, Lightning Fabric, HF Accelerate and devplug.

Each framework is an *adapter* with the few operations a training loop needs (set up a module, build an
optimizer and a loader, autocast, backward, step), each written the way that framework's documentation
writes it, under the names ``devplug.Trainer`` gives them. The workloads (``peers.py``) are written once
against that interface, the DCGAN one being the example's own ``DCGANStep``, so every framework runs the
same Python around the same model and differs only in what its own API does.

Two settings per adapter:

- ``same``: identical numerics (fp32, the same optimizer implementation, a loader with no worker
  processes): what differs is framework overhead alone;
- ``best``: each framework's best settings for the device, as its documentation recommends: bf16 autocast
  where the device computes bf16 natively, the fused optimizer; devplug: its defaults (``precision="auto"``,
  the plugin's optimizer, its automatic loader).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

import devplug

SETTINGS = ("same", "best")


def fused_supported(device: torch.device) -> bool:
    """True when torch builds ``Adam(fused=True)`` for parameters on ``device``."""
    try:
        torch.optim.Adam([torch.zeros(1, device=device, requires_grad=True)], lr=0.1, fused=True)
    except (RuntimeError, ValueError):
        return False
    return True


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU): every clock read is preceded by this."""
    if device.type != "cpu":
        module = getattr(torch, device.type, None)
        if module is not None and hasattr(module, "synchronize"):
            module.synchronize()


class Adapter:
    """What a training loop asks of a framework; one subclass per framework."""

    name = "?"

    #: One process: what the example's DCGANStep reads to slice its noise.
    rank, world_size = 0, 1

    def __init__(self, device: torch.device, setting: str, best_dtype: torch.dtype | None) -> None:
        self.device, self.setting, self.best_dtype = device, setting, best_dtype
        self.fused = fused_supported(device)

    @property
    def torch_device(self) -> torch.device:
        """Where tensors go (the name ``devplug.Trainer`` gives it, so the example's step runs on any adapter)."""
        return self.device

    def mixed_precision(self, bf16: str, fp16: str, off: str) -> str:
        """This framework's name for the precision of this setting: ``bf16``/``fp16`` under ``best``, else ``off``."""
        if self.setting != "best" or self.best_dtype is None:
            return off
        return bf16 if self.best_dtype == torch.bfloat16 else fp16

    def setup(self, module: torch.nn.Module, name: str | None = None) -> torch.nn.Module:
        """The module to call in the loop."""
        raise NotImplementedError

    def optimizer(self, algorithm: str, params: Iterable[torch.nn.Parameter], **options: Any) -> torch.optim.Optimizer:
        """``algorithm`` (Adam: the only one the workloads use) over ``params``: the same implementation for all
        under ``same``, each one's best under ``best``."""
        raise NotImplementedError

    def loader(self, dataset: Dataset, batch_size: int) -> Iterable[Any]:
        """Batches of ``dataset`` on the device, shuffled, one epoch per iteration."""
        raise NotImplementedError

    def epoch(self, loader: Iterable[Any]) -> Iterator[Any]:
        """One epoch of ``loader``'s batches (the framework's own epoch bookkeeping around it, if any)."""
        return iter(loader)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Context for forward and loss."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        """Backward through the framework."""
        loss.backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Optimizer step, then the gradients dropped (``zero_grad(set_to_none=True)``)."""
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def close(self) -> None:
        """Release what the framework holds."""

    def describe(self) -> str:
        """What this adapter runs, for the report."""
        return ""

    def _adam(self, params: Iterable[torch.nn.Parameter], **options: Any) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, fused=self.fused, **options) if self.fused else \
            torch.optim.Adam(params, foreach=False, **options)

    def _torch_loader(self, dataset: Dataset, batch_size: int) -> DataLoader:
        return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=0, drop_last=True,
                          generator=torch.Generator().manual_seed(0))


class RawTorch(Adapter):
    """A plain PyTorch loop: ``.to(device)``, ``torch.autocast`` under ``best``, ``loss.backward()``."""

    name = "raw"

    def setup(self, module: torch.nn.Module, name: str | None = None) -> torch.nn.Module:
        return module.to(self.device)

    def optimizer(self, algorithm: str, params: Iterable[torch.nn.Parameter], **options: Any) -> torch.optim.Optimizer:
        return self._adam(params, **options)

    def loader(self, dataset: Dataset, batch_size: int) -> Iterable[Any]:
        return _MovedLoader(self._torch_loader(dataset, batch_size), self.device)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.setting == "best" and self.best_dtype is not None:
            return torch.autocast(self.device.type, dtype=self.best_dtype)
        return contextlib.nullcontext()

    def describe(self) -> str:
        precision = "fp32" if self.setting == "same" or self.best_dtype is None else f"{self.best_dtype} autocast"
        return f"{precision}, Adam(fused={self.fused})"


class _MovedLoader:
    """A DataLoader whose (x, y) batches are moved with ``.to(device, non_blocking=True)``, as a raw loop does."""

    def __init__(self, loader: DataLoader, device: torch.device) -> None:
        self.loader, self.device = loader, device

    def __iter__(self) -> Iterator[Any]:
        device = self.device
        for batch in self.loader:
            yield tuple(t.to(device, non_blocking=True) for t in batch)

    def __len__(self) -> int:
        return len(self.loader)


class FabricAdapter(Adapter):
    """Lightning Fabric: ``setup_module``, ``setup_optimizers``, ``setup_dataloaders``, ``fabric.backward``."""

    name = "fabric"

    def __init__(self, device: torch.device, setting: str, best_dtype: torch.dtype | None) -> None:
        super().__init__(device, setting, best_dtype)
        try:
            from lightning.fabric import Fabric  # type: ignore[import-not-found]
        except ImportError:  # the standalone lightning-fabric distribution
            from lightning_fabric import Fabric  # type: ignore[import-not-found]

        precision = self.mixed_precision("bf16-mixed", "16-mixed", "32-true")
        accelerator = {"cpu": "cpu", "cuda": "cuda", "mps": "mps"}.get(device.type, "auto")
        self.precision = precision
        self.fabric = Fabric(accelerator=accelerator, devices=1, precision=precision)

    def setup(self, module: torch.nn.Module, name: str | None = None) -> torch.nn.Module:
        return self.fabric.setup_module(module)

    def optimizer(self, algorithm: str, params: Iterable[torch.nn.Parameter], **options: Any) -> torch.optim.Optimizer:
        return self.fabric.setup_optimizers(self._adam(params, **options))

    def loader(self, dataset: Dataset, batch_size: int) -> Iterable[Any]:
        return self.fabric.setup_dataloaders(self._torch_loader(dataset, batch_size))

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return self.fabric.autocast()

    def backward(self, loss: torch.Tensor) -> None:
        self.fabric.backward(loss)

    def describe(self) -> str:
        return f"Fabric(precision={self.precision!r}), Adam(fused={self.fused})"


class AccelerateAdapter(Adapter):
    """HF Accelerate: ``accelerator.prepare`` (module, optimizer, loader), ``accelerator.backward``.

    Under ``best`` the prepared module runs its forward in autocast (``mixed_precision="bf16"``), so the
    loop adds none of its own, as Accelerate's documentation writes it.
    """

    name = "accelerate"

    def __init__(self, device: torch.device, setting: str, best_dtype: torch.dtype | None) -> None:
        super().__init__(device, setting, best_dtype)
        from accelerate import Accelerator  # type: ignore[import-not-found]

        self.mixed = self.mixed_precision("bf16", "fp16", "no")
        self.accelerator = Accelerator(mixed_precision=self.mixed, cpu=device.type == "cpu")

    def setup(self, module: torch.nn.Module, name: str | None = None) -> torch.nn.Module:
        return self.accelerator.prepare(module)

    def optimizer(self, algorithm: str, params: Iterable[torch.nn.Parameter], **options: Any) -> torch.optim.Optimizer:
        return self.accelerator.prepare(self._adam(params, **options))

    def loader(self, dataset: Dataset, batch_size: int) -> Iterable[Any]:
        return self.accelerator.prepare(self._torch_loader(dataset, batch_size))

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # the prepared module's forward autocasts

    def backward(self, loss: torch.Tensor) -> None:
        self.accelerator.backward(loss)

    def describe(self) -> str:
        return f"Accelerator(mixed_precision={self.mixed!r}), Adam(fused={self.fused})"


class DevplugAdapter(Adapter):
    """devplug: ``Trainer.setup``, ``Trainer.optimizer``, ``Trainer.dataloader``, ``trainer.epochs()``.

    Under ``same`` it is told fp32 (``precision="32-true"``), torch's Adam with the others' flags and a
    loader without workers; under ``best`` everything is left to the device plugin.
    """

    name = "devplug"

    def __init__(self, device: torch.device, setting: str, best_dtype: torch.dtype | None) -> None:
        super().__init__(device, setting, best_dtype)
        self.trainer = devplug.Trainer(device=str(device), precision="32-true" if setting == "same" else "auto",
                                       progress=False, log_every=10**9, stop_signals=())
        self._epochs = self.trainer.epochs(2**62)

    def setup(self, module: torch.nn.Module, name: str | None = None) -> torch.nn.Module:
        return self.trainer.setup(module, name=name)

    def optimizer(self, algorithm: str, params: Iterable[torch.nn.Parameter], **options: Any) -> torch.optim.Optimizer:
        if self.setting == "same":
            options = {**options, "fused": True} if self.fused else {**options, "foreach": False}
        return self.trainer.optimizer(algorithm, params, **options)

    def loader(self, dataset: Dataset, batch_size: int) -> Iterable[Any]:
        workers = {"num_workers": 0} if self.setting == "same" else {}
        return self.trainer.dataloader(dataset, batch_size, shuffle=True, drop_last=True, **workers)

    def epoch(self, loader: Iterable[Any]) -> Iterator[Any]:
        next(self._epochs)  # the Trainer's epoch loop around the batches, as an author writes it
        return iter(loader)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return self.trainer.autocast()

    def backward(self, loss: torch.Tensor) -> None:
        self.trainer.backward(loss)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        self.trainer.step(optimizer)

    def close(self) -> None:
        self._epochs.close()
        self.trainer.close()

    def describe(self) -> str:
        summary = self.trainer.summary()
        opt = ", ".join(sorted(set(summary["optimizers"].values())))
        loaders = "; ".join(summary["loaders"])
        return f"precision {self.trainer.precision.name}, {opt}, {loaders}"
