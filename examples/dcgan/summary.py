"""The run summary: images/s, images/hour and images per dollar (how fast and how cheaply a device trains)."""

from __future__ import annotations

import json
import os
import shlex
from typing import Any

from devplug import ThroughputMeter, toolkit


def _count(value: float) -> str:
    return f"{value:,.0f}"


def build_summary(
    trainer_summary: dict[str, Any],
    *,
    model: str,
    spec: dict[str, int],
    params_g: int,
    params_d: int,
    optimizer_g: str,
    optimizer_d: str,
    data: str,
    meter: ThroughputMeter,
    price_per_hour: float | None,
    cache: Any,
    decodes_every_epoch: bool,
    interrupted: bool,
    out_dir: str,
    last_sample: str | None,
    last_checkpoint: str | None,
) -> dict[str, Any]:
    """Everything the summary shows, as plain values (also written to ``summary.json``)."""
    rate = meter.per_second
    per_hour = rate * 3600
    summary: dict[str, Any] = {
        "status": "interrupted" if interrupted else "finished",
        "device": trainer_summary["device"],
        "device_plugin": trainer_summary["device_plugin"],
        "world_size": trainer_summary["world_size"],
        "precision": trainer_summary["precision"],
        "precision_detail": trainer_summary["precision_detail"],
        "optimizer_g": optimizer_g,
        "optimizer_d": optimizer_d,
        "loader": ", ".join(trainer_summary["loaders"]),
        "model": model,
        "model_sizes": spec,
        "params_g": params_g,
        "params_d": params_d,
        "data": data,
        "steps": trainer_summary["steps"],
        "epoch": trainer_summary["epoch"],
        "images_this_run": meter.total,
        "wall_seconds": round(meter.wall_seconds, 3),
        "first_step_unix_time": meter.first_step_unix_time,  # when the first step ended (time.time())
        "images_per_sec": rate,
        "images_per_hour": per_hour,
        "price_per_hour": price_per_hour,
        "images_per_dollar": per_hour / price_per_hour if price_per_hour else None,
        "mfu": trainer_summary.get("mfu"),  # model FLOPs / (time x the device's peak), from the Trainer
        "flops_per_image": trainer_summary.get("flops_per_sample"),
        "peak_flops": trainer_summary.get("peak_flops"),  # what MFU is measured against, and where it came from
        "peak_source": trainer_summary.get("peak_source"),
        "peak": trainer_summary.get("peak"),  # the same in one line: value, format and how it was obtained
        "input_bound": trainer_summary.get("input_bound"),
        "cache": str(cache.path) if cache is not None else None,
        "cache_built": bool(cache is not None and cache.built),
        "image_files_opened_for_cache": cache.opened if cache is not None else 0,
        "image_files_skipped": len(cache.skipped) if cache is not None else 0,
        "image_files_decoded_every_epoch": decodes_every_epoch,
        "out_dir": out_dir,
        "last_sample": last_sample,
        "last_checkpoint": last_checkpoint,
    }
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    """The human-readable block printed at the end of a run (and on Ctrl-C)."""
    world = summary["world_size"]
    device = summary["device"] + (f" × {world} processes" if world > 1 else "")
    rows = [
        ("device", f"{device} (plugin {summary['device_plugin']})"),
        ("precision", f"{summary['precision']}: {summary['precision_detail']}"),
        ("optimizer", f"G {summary['optimizer_g']}; D {summary['optimizer_d']}"),
        ("data", f"{summary['data']} via {summary['loader']}"),
        ("model", f"{summary['model']} "
                  + ", ".join(f"{k} {v}" for k, v in summary["model_sizes"].items() if k != "channels")),
        ("parameters", f"G {_count(summary['params_g'])}, D {_count(summary['params_d'])}"),
        ("steps", f"{summary['steps']} (epoch {summary['epoch']}); {_count(summary['images_this_run'])} images "
                  f"in {summary['wall_seconds']:.1f} s this run"),
        ("images/s", f"{summary['images_per_sec']:,.1f} (steady state, all processes)"),
        ("images/hour", _count(summary["images_per_hour"])),
    ]
    if summary["images_per_dollar"] is not None:
        rows.append(("images/$", f"{_count(summary['images_per_dollar'])} at ${summary['price_per_hour']:.2f}/hour"))
    if summary.get("mfu") is not None:
        flops = summary.get("flops_per_image")
        per_image = f", {flops / 1e9:.3g} GFLOP per image" if flops else ""
        peak = summary.get("peak_flops")
        against = (f"of a {peak / 1e9:.4g} GFLOP/s peak ({summary.get('peak_source') or 'plugin'})" if peak
                   else "of the device's peak")
        rows.append(("MFU", f"{100 * summary['mfu']:.2f} % {against}{per_image}"))
        if summary.get("peak"):
            rows.append(("peak", str(summary["peak"])))
    if summary.get("input_bound"):
        rows.append(("input", str(summary["input_bound"])))
    if summary["cache"] is not None:
        opened = summary["image_files_opened_for_cache"]
        how = f"{opened} to build the cache" if summary["cache_built"] else "none (cache reused)"
        skipped = f"; {summary['image_files_skipped']} unreadable skipped" if summary["image_files_skipped"] else ""
        rows.append(("image files opened", f"{how}, none while training{skipped}"))
    elif summary["image_files_decoded_every_epoch"]:
        rows.append(("image files opened", "every image, every epoch (--no-cache)"))
    if summary["last_sample"]:
        rows.append(("samples", summary["last_sample"]))
    if summary["last_checkpoint"]:
        rows.append(("checkpoint", summary["last_checkpoint"]))
    logdir = shlex.quote(os.path.join(summary["out_dir"], "tensorboard"))  # a command that works pasted into a shell
    rows.append(("tensorboard", f"tensorboard --logdir {logdir}"))
    width = max(len(name) for name, _ in rows)
    title = "DCGAN run summary" + (" (interrupted)" if summary["status"] == "interrupted" else "")
    return "\n".join([title, *(f"  {name.ljust(width)}  {value}" for name, value in rows)])


def write_summary(summary: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``summary`` as JSON, atomically (a temporary file renamed into place: never half a file)."""
    text = json.dumps(summary, indent=2, default=str) + "\n"
    toolkit.write_atomically(path, lambda handle: handle.write(text.encode()))
