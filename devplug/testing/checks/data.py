"""Check of ``devplug_dataloader``: the loader it returns yields every sample, on the device."""

from __future__ import annotations

import torch

from devplug.core.contract import hookspecs
from devplug.core.contract.records import LoaderChoice, LoaderOptions
from devplug.testing.kit import DeviceUnderTest, conformance_check, on_device, toy_regression


@conformance_check("devplug_dataloader")
def check_dataloader(dut: DeviceUnderTest) -> str:
    """``devplug_dataloader`` returns a `LoaderChoice` whose loader yields every sample in batches."""
    hooks, device = dut.hooks, dut.device
    x, y = toy_regression(10)
    dataset = torch.utils.data.TensorDataset(x, y)
    options = LoaderOptions(batch_size=4, shuffle=True, num_workers=0, persistent_workers=False, seed=3)
    choice = hooks(hookspecs.devplug_dataloader, source=dataset, options=options)
    if not isinstance(choice, LoaderChoice):
        raise dut.fail(f"devplug_dataloader returned {choice!r}, not a devplug.LoaderChoice")
    if not choice.implementation:
        raise dut.fail("devplug_dataloader did not name its implementation (LoaderChoice.implementation)")
    seen = 0
    for batch in choice.loader:
        if not choice.on_device:
            batch = hooks(hookspecs.devplug_to_device, obj=batch)
        inputs, _targets = batch
        if not on_device(inputs, device):
            where = "on_device=True but batches arrive on " if choice.on_device else "batches moved to "
            raise dut.fail(f"{choice.implementation}: {where}{inputs.device}, not {device.torch_device}")
        if inputs.shape[1:] != x.shape[1:]:
            raise dut.fail(f"{choice.implementation} changed the sample shape to {tuple(inputs.shape[1:])}")
        seen += inputs.shape[0]
    if seen != len(dataset):
        raise dut.fail(
            f"{choice.implementation} yielded {seen} samples of a dataset of {len(dataset)} (drop_last=False)"
        )
    return choice.implementation
