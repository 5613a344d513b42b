"""Check of ``devplug_to_device``: modules, tensors and nested batches arrive on the device, as they were."""

from __future__ import annotations

import collections

import attrs
import torch

from devplug.core.contract import hookspecs
from devplug.testing.kit import DeviceUnderTest, KitHooks, conformance_check, on_device, tensors_in

_BatchTuple = collections.namedtuple("_BatchTuple", "inputs targets")


def _where(obj: object) -> str:
    return str(obj.device) if isinstance(obj, torch.Tensor) else type(obj).__name__


@conformance_check("devplug_to_device")
def check_to_device(dut: DeviceUnderTest) -> str:
    """``devplug_to_device`` moves a module (in place), a tensor and a nested batch, keeping structure."""
    hooks, device = dut.hooks, dut.device
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    moved = hooks(hookspecs.devplug_to_device, obj=module)
    if not isinstance(moved, torch.nn.Module):
        raise dut.fail(f"devplug_to_device(module) returned {type(moved).__name__}, not the module")
    stray = [n for n, t in [*moved.named_parameters(), *moved.named_buffers()] if not on_device(t, device)]
    if stray:
        raise dut.fail(f"devplug_to_device(module) left {', '.join(stray)} off {device.torch_device}")

    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    out = hooks(hookspecs.devplug_to_device, obj=tensor)
    if not isinstance(out, torch.Tensor) or not on_device(out, device):
        raise dut.fail(f"devplug_to_device(tensor) returned {_where(out)}, expected a tensor on {device.torch_device}")
    if out.shape != tensor.shape or out.dtype != tensor.dtype or not torch.equal(out.cpu(), tensor):
        raise dut.fail("devplug_to_device(tensor) changed the tensor's values, shape or dtype")

    marker = object()
    batch = {
        "images": torch.ones(2, 3, 4, 4),
        "pair": (torch.zeros(2, dtype=torch.long), [torch.full((1,), 7.0), "label"]),
        "named": _BatchTuple(torch.ones(2, 1), 3),
        "meta": marker,
    }
    out = hooks(hookspecs.devplug_to_device, obj=batch)
    shape_ok = (
        isinstance(out, dict)
        and set(out) == set(batch)
        and isinstance(out["pair"], tuple)
        and isinstance(out["pair"][1], list)
        and isinstance(out["named"], _BatchTuple)
    )
    if not shape_ok:
        raise dut.fail("devplug_to_device(nested batch) did not keep dicts, tuples, lists and namedtuples as they were")
    if out["meta"] is not marker or out["pair"][1][1] != "label" or out["named"].targets != 3:
        raise dut.fail("devplug_to_device(nested batch) changed non-tensor leaves; return them unchanged")
    stray_leaves = [_where(t) for t in tensors_in(out) if not on_device(t, device)]
    if stray_leaves or sum(1 for _ in tensors_in(out)) != 4:
        raise dut.fail(f"devplug_to_device(nested batch) left tensors on {', '.join(stray_leaves) or '?'}")
    if out["pair"][0].dtype != torch.long or not torch.equal(out["pair"][1][0].cpu(), torch.full((1,), 7.0)):
        raise dut.fail("devplug_to_device(nested batch) changed tensor values or dtypes")
    return f"module, tensor and nested batch moved to {device.torch_device}"


@conformance_check("devplug_to_device", since="1.1")
def check_to_device_channels_last(dut: DeviceUnderTest) -> str:
    """With ``Trainer(channels_last=True)`` conv weights and 4-D batches arrive channels_last (contract 1.1)."""
    device = attrs.evolve(dut.device, channels_last=True)
    hooks = KitHooks(dut.registry, device, dut.label)
    conv = hooks(hookspecs.devplug_to_device, obj=torch.nn.Conv2d(3, 4, 3))
    images, labels = hooks(hookspecs.devplug_to_device, obj=(torch.ones(2, 3, 5, 5), torch.zeros(2)))
    if not conv.weight.is_contiguous(memory_format=torch.channels_last):
        raise dut.fail("with channels_last=True, devplug_to_device(module) left conv weights in the default layout; "
                       "move modules with memory_format=device.memory_format (devplug.toolkit.move_to does)")
    if not images.is_contiguous(memory_format=torch.channels_last) or labels.dim() != 1:
        raise dut.fail("with channels_last=True, devplug_to_device(batch) did not make 4-D tensors channels_last")
    return "channels_last honoured (conv weights and 4-D batches)"
