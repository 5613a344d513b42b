"""The run summary: what ran where, how fast (tokens/s), and how well it learned (held-out perplexity)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from devplug import toolkit


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
        ("compile", summary.get("compiled") or "off"),
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
    if summary.get("mfu") is not None:
        rows.append(("MFU", f"{summary['mfu']:.1%} of {summary['peak_flops'] / 1e12:,.4g} TFLOP/s per process "
                            f"({summary['peak_source']}; {summary['flops_per_token'] / 1e6:,.1f} MFLOP per token)"))
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
    """Write ``summary`` as JSON, atomically (a temporary file renamed into place; a killed writer's is swept)."""
    text = json.dumps(summary, indent=2, default=str) + "\n"
    toolkit.write_atomically(path, lambda handle: handle.write(text.encode()))
