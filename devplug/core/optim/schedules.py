"""Large-batch learning rates: scaling by global batch, linear warmup, cosine decay.

Training on more devices grows the global batch; the learning rate tuned for a base batch then needs
scaling (multi-GPU tutorials use the square-root rule, Goyal et al. the linear rule with warmup):

    lr = devplug.scale_lr(2e-4, global_batch_size=256 * trainer.world_size, base_batch_size=256, rule="sqrt")
    opt = trainer.optimizer("adam", model.parameters(), lr=lr)
    schedule = devplug.LRSchedule(total_steps=10_000, warmup_steps=500, decay="cosine")
    for epoch in trainer.epochs(n):
        for batch in loader:
            schedule.apply(opt, trainer.global_step)   # before the step; stateless, so resume-safe
            ...
            trainer.step(opt)

Steps are counted from 1 (the n-th optimizer step), as ``trainer.global_step`` is inside the loop.
Everything here is plain host arithmetic: no tensor, no device, no synchronisation.
"""

from __future__ import annotations

import math

import attrs
import torch

from devplug.core.errors import ConfigError
from devplug.core.validators import non_negative_int, positive_int

LR_SCALING_RULES = ("none", "linear", "sqrt")
"""The rules `scale_lr` knows: no scaling, linear in the global batch, its square root."""
DECAYS = ("none", "cosine", "linear")
"""The decays `LRSchedule` knows after its warmup."""


def scale_lr(lr: float, global_batch_size: int, base_batch_size: int, rule: str = "linear") -> float:
    """``lr`` (tuned at ``base_batch_size``) scaled for ``global_batch_size``.

    ``rule``: ``"none"`` keeps ``lr``; ``"linear"`` multiplies by ``global / base``; ``"sqrt"`` by
    ``sqrt(global / base)``. The global batch is the per-rank batch times the world size (times the
    gradient-accumulation steps).
    """
    if rule not in LR_SCALING_RULES:
        raise ConfigError(f"unknown learning-rate scaling rule {rule!r}; use one of {', '.join(LR_SCALING_RULES)}")
    for name, value in (("global_batch_size", global_batch_size), ("base_batch_size", base_batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    ratio = global_batch_size / base_batch_size
    if rule == "linear":
        return lr * ratio
    if rule == "sqrt":
        return lr * math.sqrt(ratio)
    return lr


def warmup_factor(step: int, warmup_steps: int) -> float:
    """Linear warmup: ``step / warmup_steps`` for steps ``1..warmup_steps``, then 1 (1 with no warmup)."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return 1.0
    return max(step, 1) / warmup_steps


def cosine_factor(step: int, total_steps: int, *, warmup_steps: int = 0, min_factor: float = 0.0) -> float:
    """Half-cosine from 1 right after warmup down to ``min_factor`` at ``total_steps`` (and after)."""
    span = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / span, 1.0)
    return min_factor + (1.0 - min_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _decay(_inst: object, _attribute: attrs.Attribute, value: str) -> None:
    if value not in DECAYS:
        raise ConfigError(f"unknown decay {value!r}; use one of {', '.join(DECAYS)}")


def _min_factor(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]  # anything else is the one-line error below
    except (TypeError, ValueError):
        raise ConfigError(f"min_factor must be a number between 0 and 1, got {value!r}") from None


def _fraction(_inst: object, attribute: attrs.Attribute, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{attribute.name} must be between 0 and 1, got {value!r}")


@attrs.frozen(kw_only=True)
class LRSchedule:
    """A learning-rate multiplier per optimizer step: linear warmup, then a decay.

    - ``total_steps``: the step at which the decay ends (steps count from 1).
    - ``warmup_steps``: linear ramp ``step / warmup_steps`` up to 1 (0: no warmup; at most ``total_steps`` with a
      decay).
    - ``decay``: ``"cosine"``, ``"linear"`` or ``"none"`` (constant after warmup).
    - ``min_factor``: the multiplier at the end of the decay (a fraction of the peak learning rate).

    The multiplier applies to each parameter group's peak learning rate, the ``lr`` it was built with
    (kept in the group as ``initial_lr``, the key torch's schedulers use, so it is checkpointed with the
    optimizer).
    """

    total_steps: int = attrs.field(validator=positive_int)
    warmup_steps: int = attrs.field(default=0, validator=non_negative_int)
    decay: str = attrs.field(default="cosine", validator=_decay)
    min_factor: float = attrs.field(default=0.0, converter=_min_factor, validator=_fraction)

    def __attrs_post_init__(self) -> None:
        if self.decay != "none" and self.warmup_steps > self.total_steps:
            raise ConfigError(f"warmup_steps ({self.warmup_steps}) is past total_steps ({self.total_steps}): the "
                              f"{self.decay} decay would have no steps and the learning rate drop from its peak to "
                              "min_factor at once; lower warmup_steps, raise total_steps or use decay='none'")

    def factor(self, step: int) -> float:
        """The multiplier for optimizer step ``step`` (1-based)."""
        if step <= self.warmup_steps:
            return warmup_factor(step, self.warmup_steps)
        if self.decay == "cosine":
            return cosine_factor(step, self.total_steps, warmup_steps=self.warmup_steps, min_factor=self.min_factor)
        if self.decay == "linear":
            span = max(self.total_steps - self.warmup_steps, 1)
            progress = min((step - self.warmup_steps) / span, 1.0)
            return self.min_factor + (1.0 - self.min_factor) * (1.0 - progress)
        return 1.0

    def apply(self, optimizer: torch.optim.Optimizer, step: int) -> float:
        """Set every parameter group's ``lr`` to its peak times ``factor(step)``; return the factor.

        Stateless: the result depends only on ``step`` (``trainer.global_step``), so a resumed run gets
        the same learning rates as an uninterrupted one without saving scheduler state.
        """
        factor = self.factor(step)
        for group in optimizer.param_groups:
            peak = group.setdefault("initial_lr", group["lr"])
            group["lr"] = peak * factor
        return factor

    def scheduler(self, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        """The same schedule as a ``torch.optim.lr_scheduler.LambdaLR`` (call ``.step()`` after each step).

        Its state (``last_epoch``) is in devplug checkpoints only once registered,
        ``trainer.register_for_checkpointing(scheduler=scheduler)`` (then restored on load too); or prefer `apply`.
        """
        # LambdaLR evaluates epoch 0 for the first optimizer step; our steps count from 1.
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda index: self.factor(index + 1))
