"""The run summary: what ran where, how fast (tokens/s), and how well it learned (held-out perplexity)."""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs


@attrs.define
class Stopwatch:
    """Steady-state training throughput: tokens after the first step (warm-up excluded), evaluation excluded.

    The caller synchronizes the device before `first_step_done`, `pause`, `resume` and `stop`, so queued
    device work is inside the measured time.
    """

    started: float = attrs.field(factory=time.perf_counter)
    steady_start: float | None = None
    stopped: float | None = None
    paused: float = 0.0  # seconds spent evaluating after the steady start
    _pause_start: float | None = None
    tokens_total: int = 0
    tokens_steady: int = 0

    def add(self, tokens: int) -> None:
        """Count the tokens of one micro-batch (all ranks)."""
        self.tokens_total += tokens
        if self.steady_start is not None:
            self.tokens_steady += tokens

    def first_step_done(self) -> None:
        """Start the steady-state clock."""
        if self.steady_start is None:
            self.steady_start = time.perf_counter()

    def pause(self) -> None:
        """Stop counting time (an evaluation begins)."""
        self._pause_start = time.perf_counter()

    def resume(self) -> None:
        """Count time again (the evaluation ended)."""
        if self._pause_start is not None and self.steady_start is not None:
            self.paused += time.perf_counter() - max(self._pause_start, self.steady_start)
        self._pause_start = None

    def stop(self) -> None:
        """Stop the clocks."""
        self.stopped = time.perf_counter()

    @property
    def wall_seconds(self) -> float:
        """Seconds from the start to `stop` (or now), evaluation included."""
        return (self.stopped or time.perf_counter()) - self.started

    @property
    def tokens_per_second(self) -> float:
        """Steady-state training tokens per second over all ranks (0 when nothing ran)."""
        end = self.stopped or time.perf_counter()
        if self.steady_start is not None and self.tokens_steady:
            seconds = end - self.steady_start - self.paused
            if seconds > 0:
                return self.tokens_steady / seconds
        return self.tokens_total / self.wall_seconds if self.wall_seconds > 0 else 0.0


def perplexity(loss: float | None) -> float | None:
    """``exp(loss)``: the number of equally likely bytes the model is as unsure as (256 knows nothing)."""
    if loss is None:
        return None
    return math.exp(min(loss, 700.0))


def format_summary(summary: dict[str, Any]) -> str:
    """The human-readable block printed at the end of a run (and after a stop signal)."""
    world = summary["world_size"]
    device = summary["device"] + (f" × {world} processes" if world > 1 else "")
    spec = summary["model_sizes"]
    first, final = summary["first_eval_loss"], summary["final_eval_loss"]
    rows = [
        ("device", f"{device} (plugin {summary['device_plugin']})"),
        ("precision", f"{summary['precision']}: {summary['precision_detail']}"),
        ("strategy", f"{summary['strategy']}; sharding: {summary['sharding']}"),
        ("optimizer", summary["optimizer"]),
        ("model", f"{summary['parameters']:,} parameters: width {spec['width']}, {spec['layers']} layers, "
                  f"{spec['heads']} heads, context {spec['context']}"
                  + (", tied embedding" if spec["tie_weights"] else "")
                  + (", recomputed blocks" if summary["recompute"] else "")),
        ("corpus", summary["corpus"]),
        ("steps", f"{summary['steps']}; {summary['tokens_this_run']:,} tokens in {summary['wall_seconds']:.1f} s "
                  "this run"),
        ("tokens/s", f"{summary['tokens_per_sec']:,.0f} (training, steady state, all processes)"),
    ]
    if final is not None:
        start = f" (from {first:.3f}, perplexity {perplexity(first):.1f})" if first is not None else ""
        rows.append(("held-out loss", f"{final:.3f} nats/byte, perplexity {perplexity(final):.2f}{start}"))
    if summary["sample"] is not None:
        rows.append(("sample", repr(summary["sample"])))  # one line, escapes shown
    if summary["last_checkpoint"]:
        rows.append(("checkpoint", summary["last_checkpoint"]))
    if summary["consolidated"]:
        rows.append(("weights", f"{summary['consolidated']} (one plain file)"))
    width = max(len(name) for name, _ in rows)
    title = "LM run summary" + (" (interrupted)" if summary["status"] == "interrupted" else "")
    return "\n".join([title, *(f"  {name.ljust(width)}  {value}" for name, value in rows)])


def write_summary(summary: dict[str, Any], path: Path) -> None:
    """Write ``summary`` as JSON, atomically (a temporary file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as stream:
            stream.write(json.dumps(summary, indent=2, default=str) + "\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
