"""A small run under a checkpoint policy with auto-resume, which can SIGKILL itself at a chosen point.

Run by tests/core/loop/test_runs.py: ``--kill-at STEP`` kills the process after that step's backward (``--phase step``)
or in the middle of writing that step's checkpoint (``--phase save``). Without ``--kill-at`` it runs to the
end and writes the final weights to ``DIR/final.pt``. Every run resumes from the newest intact checkpoint.
The test starts each run as a process of a fork server (`run_in_child`); ``python kill_resume.py`` runs it alone.
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

import torch

import devplug


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--phase", choices=("step", "save"), default="step")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    policy = devplug.CheckpointPolicy(directory=args.dir / "checkpoints", every_n_steps=3, keep_last=2,
                                      auto_resume=True)
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, checkpoints=policy,
                              stop_signals=(), count_flops=False, log_every=4)
    torch.manual_seed(0)
    model = trainer.setup(torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
    opt = trainer.optimizer("adam", model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    trainer.register_for_checkpointing(scheduler=sched)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(48, 6, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).sin())
    loader = trainer.dataloader(data, 4, shuffle=True, num_workers=0)
    if args.phase == "save" and args.kill_at is not None:
        real_save = torch.save

        def dying_save(obj, f, *rest, **options):  # half a file, then the process dies mid-write
            if trainer.global_step == args.kill_at and hasattr(f, "write"):
                f.write(b"PK\x03\x04" + b"\0" * 512)
                f.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            return real_save(obj, f, *rest, **options)

        torch.save = dying_save
    for _epoch in trainer.epochs(2):
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            trainer.backward(loss)
            if args.phase == "step" and trainer.global_step == args.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if trainer.step(opt):
                sched.step()
            trainer.log(loss=loss)
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.dir / "final.pt")
    trainer.close()


def run_in_child(argv: list[str], env: dict[str, str]) -> None:
    """`main` in a process forked from a server that imported torch and devplug once, with ``env`` as its
    environment: each run is still its own process, killed with SIGKILL, without a fresh interpreter's start."""
    os.environ.clear()
    os.environ.update(env)
    main(argv)


if __name__ == "__main__":
    main()
