"""One rank of the 2-rank DDP scenario that tests/distributed/test_distributed.py checks.

Run by ``run_ranks`` with torchrun-style variables. Trains the shared MLP with the Trainer on gloo for
two epochs (DistributedSampler shards, SGD with momentum), logging, saving a checkpoint per epoch,
writing TensorBoard and an image grid into ``--run``; meanwhile it records:

- every file-system write under ``--run`` (a ``sys.addaudithook``), to show rank 1 writes nothing;
- host reads (``.item()``, ``.cpu()``, ``.tolist()``, ``float()``, ``.numpy()``), barriers, Python-level
  collectives and ``Trainer.synchronize`` calls inside each training step;
- the sample indices it trained on, the values reported at log points, its final weights;
- the DistributedDataParallel options two Trainers produced (user options; plugin defaults beneath);
- gradients under ``trainer.no_sync`` and after the next synced backward.

Results go to ``--results/rank<r>.pt`` (outside the audited folder).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import common
import torch
import torch.distributed as dist

import devplug
from devplug.core.registry.manager import create_plugin_manager

COLLECTIVES = ("barrier", "monitored_barrier", "all_reduce", "broadcast", "all_gather", "all_gather_object",
               "broadcast_object_list", "reduce", "gather", "scatter")
HOST_READS = ("item", "cpu", "tolist", "__float__", "numpy")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


class Counter:
    """Counts calls to the host reads and Python-level collectives listed above while ``active``."""

    def __init__(self) -> None:
        self.active = False
        self.calls: list[str] = []
        for name in HOST_READS:
            self._wrap(torch.Tensor, name, f"Tensor.{name}")
        for name in COLLECTIVES:
            if hasattr(dist, name):
                self._wrap(dist, name, f"dist.{name}")

    def _wrap(self, owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)

        def counting(*args: Any, **kwargs: Any) -> Any:
            if self.active:
                self.calls.append(label)
            return original(*args, **kwargs)

        setattr(owner, name, counting)


def audit_writes(root: Path, record: list[str]) -> None:
    """Record every open-for-writing, mkdir, rename and remove under ``root``."""
    prefix = str(root.resolve())

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event not in ("open", "os.mkdir", "os.rename", "os.replace", "os.remove", "shutil.copyfile"):
            return
        path = args[0]
        if isinstance(path, int) or path is None:
            return
        path = os.fsdecode(os.fspath(path))
        if not os.path.abspath(path).startswith(prefix):
            return
        if event == "open":
            mode, flags = args[1], args[2]
            writing = (mode is not None and any(c in str(mode) for c in "wax+")) or (
                mode is None and isinstance(flags, int) and flags & WRITE_FLAGS
            )
            if not writing:
                return
        record.append(f"{event} {path}")

    sys.addaudithook(hook)


class DDPDefaults:
    """A neutral plugin standing in for a device plugin's DDP defaults (as Gaudi's would give)."""

    @devplug.hookimpl(tryfirst=True)
    def devplug_collective_setup(self, device: Any, launch: Any) -> devplug.CollectiveSetup:
        return devplug.CollectiveSetup(
            backend="gloo", ddp_kwargs={"bucket_cap_mb": 3, "broadcast_buffers": False, "gradient_as_bucket_view": True}
        )


class TwoBranches(torch.nn.Module):
    """``unused`` gets no gradient: only find_unused_parameters=True lets DDP finish the reduction."""

    def __init__(self) -> None:
        super().__init__()
        self.used = torch.nn.Linear(6, 1)
        self.unused = torch.nn.Linear(6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def ddp_attributes(module: Any) -> dict[str, Any]:
    return {
        "type": type(module).__name__,
        "bucket_bytes_cap": module.bucket_bytes_cap,
        "broadcast_buffers": module.broadcast_buffers,
        "gradient_as_bucket_view": module.gradient_as_bucket_view,
        "find_unused_parameters": module.find_unused_parameters,
        "static_graph": module.static_graph,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--log-every", type=int, default=4)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    writes: list[str] = []
    audit_writes(args.run, writes)
    counter = Counter()

    # ---- part 1: the training run -------------------------------------------------------------------
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, log_dir=str(args.run / "tb"),
                              log_every=args.log_every, progress=True, bucket_cap_mb=1, broadcast_buffers=False,
                              gradient_as_bucket_view=True)
    model = trainer.setup(common.make_model(0), name="mlp")
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1, momentum=0.9)
    loader = trainer.dataloader(common.IndexedData(args.samples), batch_size=args.batch_size, shuffle=True,
                                num_workers=0)
    seen: dict[int, list[int]] = {}
    steps: list[dict[str, Any]] = []
    reports: list[dict[str, float]] = []
    trainer.synchronize = _counted(trainer.synchronize, counter)  # type: ignore[method-assign]
    progress_shown = []
    for epoch in trainer.epochs(args.epochs):
        for index, x, y in loader:
            seen.setdefault(epoch, []).extend(int(i) for i in index)  # host-side indices, before the step
            counter.calls.clear()
            counter.active = True
            with trainer.autocast():
                loss = torch.nn.functional.mse_loss(model(x), y)
            trainer.backward(loss)
            trainer.step(opt)
            reported = trainer.log(loss=loss, rank_value=torch.tensor(float(rank)))
            counter.active = False
            steps.append({"step": trainer.global_step, "calls": list(counter.calls), "log_point": reported is not None})
            if reported is not None:
                reports.append(reported)
            progress_shown.append(trainer._reporter.progress_bar is not None)
        trainer.save(args.run / "ckpt" / f"epoch{epoch}.pt")
    trainer.log_images("samples", torch.rand(4, 3, 8, 8) * 2 - 1, path=str(args.run / "samples" / "grid.png"))
    trainer.close()
    final = {k: v.detach().clone() for k, v in trainer._modules["mlp"].state_dict().items()}

    # ---- part 2: plugin DDP defaults under the author's options ----------------------------------------
    pm = create_plugin_manager(extra_plugins=[("ddp-defaults", DDPDefaults())])
    probe_trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, plugin_manager=pm,
                                    bucket_cap_mb=1, find_unused_parameters=True)
    probe = probe_trainer.setup(TwoBranches(), name="probe")
    probe_opt = probe_trainer.optimizer("sgd", probe.parameters(), lr=0.1)
    x = torch.full((2, 6), float(rank + 1))
    probe_trainer.backward(probe(x).sum())  # completes only because unused parameters are found
    probe_trainer.step(probe_opt)
    static_trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, static_graph=True)
    static = static_trainer.setup(common.make_model(0), name="static")

    # ---- part 3: no_sync leaves gradients local; the next backward averages them -----------------------
    accum = trainer.setup(common.make_model(0), name="accum")
    with trainer.no_sync(accum):
        accum(torch.full((3, 6), float(rank + 1))).sum().backward()
    local_grad = accum.module[0].weight.grad.clone()
    accum(torch.full((3, 6), float(rank + 1))).sum().backward()
    synced_grad = accum.module[0].weight.grad.clone()

    results = {
        "rank": rank,
        "world_size": trainer.world_size,
        "launcher": trainer.launch.launcher,
        "is_main": trainer.is_main_process,
        "seen": seen,
        "steps": steps,
        "reports": reports,
        "last_metrics": trainer.last_metrics,
        "final": final,
        "global_step": trainer.global_step,
        "writes": writes,
        "progress_shown": progress_shown,
        "ddp_main": ddp_attributes(model),
        "ddp_plugin_defaults": ddp_attributes(probe),
        "ddp_static": ddp_attributes(static),
        "local_grad": local_grad,
        "synced_grad": synced_grad,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    torch.save(results, args.results / f"rank{rank}.pt")
    dist.destroy_process_group()


def _counted(fn: Any, counter: Counter) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if counter.active:
            counter.calls.append("Trainer.synchronize")
        return fn(*args, **kwargs)

    return wrapper


if __name__ == "__main__":
    main()
