"""Wrapping modules in DistributedDataParallel: the device plugin's defaults, then the author's options.

DDP's own gradient all-reduce, overlapped with backward, is the only communication of a training step.
`DDPStrategy` is a Trainer's strategy when launched with more than one process (``"auto"`` or ``"ddp"``).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from devplug.core.contract.records import CollectiveSetup
from devplug.core.distributed.strategy import Strategy
from devplug.core.errors import ConfigError

log = logging.getLogger("devplug")


@functools.cache
def _ddp_parameters() -> frozenset[str]:
    return frozenset(inspect.signature(DistributedDataParallel.__init__).parameters)


def _normalise(options: Mapping[str, Any]) -> dict[str, Any]:
    """Spell buffer syncing the way the installed torch does.

    devplug (and the DDP tuning guides) call it ``broadcast_buffers``; torch 2.13 deprecated that name for
    ``forward_sync_buffers`` (buffers are still broadcast once at wrap time, so replicas start equal).
    """
    options = dict(options)
    new, old = "forward_sync_buffers", "broadcast_buffers"
    if new in _ddp_parameters() and old in options:
        options[new] = options.pop(old)
    elif new not in _ddp_parameters() and new in options:
        options[old] = options.pop(new)
    return options


def ddp_options(collective: CollectiveSetup, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """DistributedDataParallel keyword arguments: the plugin's defaults, then the author's options.

    ``overrides`` are the options the author set (``TrainerConfig.ddp_overrides()``); they win over the
    plugin's ``collective.ddp_kwargs``. ``broadcast_buffers`` is passed as
    ``forward_sync_buffers`` to a torch that has deprecated the old name.
    """
    kwargs = _normalise(collective.ddp_kwargs)
    kwargs.update(_normalise(overrides))
    return kwargs


def wrap_ddp(module: torch.nn.Module, collective: CollectiveSetup | None,
             overrides: Mapping[str, Any]) -> torch.nn.Module:
    """Wrap ``module`` in DDP with the plugin's ``collective`` defaults overridden by the author's options.

    A module with no trainable parameter (a frozen feature extractor, an EMA copy) has no gradient to
    synchronise and is returned unwrapped.
    """
    if collective is None:
        raise ConfigError("wrap_ddp needs a joined process group (Trainer with a world size above 1)")
    if not any(p.requires_grad for p in module.parameters()):
        log.info("%s has no trainable parameters: not wrapped in DistributedDataParallel", type(module).__name__)
        return module
    kwargs = ddp_options(collective, overrides)
    log.debug("DistributedDataParallel(%s, %s)", type(module).__name__, kwargs)
    return DistributedDataParallel(module, **kwargs)


class DDPStrategy(Strategy):
    """Each rank a full replica wrapped in DistributedDataParallel (after compiling); plain checkpoints,
    written by rank 0."""

    name = "ddp"

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        """``module`` in DDP with the plugin's defaults and the author's options."""
        return wrap_ddp(module, self.context.collective, self.context.ddp_overrides)
