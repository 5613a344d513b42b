"""Early stopping on a metric: patience, a minimum improvement, lower or higher is better."""

from __future__ import annotations

import math
from typing import Any

import attrs


@attrs.define(kw_only=True)
class EarlyStopping:
    """Says when a monitored value has stopped improving; pair it with ``trainer.request_stop``.

    For example:

        stopper = devplug.EarlyStopping(patience=3, mode="min", min_delta=0.001)
        ...
        val_loss = evaluate()                     # the same value on every rank (all_reduce it first)
        if stopper.update(val_loss):
            trainer.request_stop(stopper.reason)

    ``update(value)`` returns True once ``patience`` updates in a row brought no improvement of more than
    ``min_delta`` over the best value so far (``mode="min"``: lower is better; ``"max"``: higher). A NaN
    value never counts as an improvement.
    """

    patience: int = attrs.field(default=3, validator=attrs.validators.ge(1))
    mode: str = attrs.field(default="min", validator=attrs.validators.in_(("min", "max")))
    min_delta: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))
    best: float | None = None
    bad_updates: int = 0
    updates: int = 0
    reason: str | None = None

    def update(self, value: Any) -> bool:
        """Take the newest value (a number or a one-element tensor: read to the host); True when it is time to stop."""
        value = float(value.item() if hasattr(value, "item") else value)
        self.updates += 1
        better = math.isfinite(value) and (
            self.best is None
            or (value < self.best - self.min_delta if self.mode == "min" else value > self.best + self.min_delta))
        if better:
            self.best, self.bad_updates = value, 0
            return False
        self.bad_updates += 1
        if self.bad_updates >= self.patience:
            if self.best is None:  # every value so far was NaN or infinite
                self.reason = (f"early stopping: no finite value in {self.bad_updates} updates (patience "
                               f"{self.patience}): the monitored value is NaN or infinite; the run diverged or "
                               "the value is computed wrongly")
            else:
                self.reason = (f"early stopping: no improvement of more than {self.min_delta:g} over the best value "
                               f"{self.best:g} in {self.bad_updates} updates (patience {self.patience})")
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (``trainer.register_for_checkpointing(early_stopping=stopper)``)."""
        return {"best": self.best, "bad_updates": self.bad_updates, "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue counting where a checkpoint left off."""
        self.best, self.bad_updates, self.updates = state["best"], int(state["bad_updates"]), int(state["updates"])
