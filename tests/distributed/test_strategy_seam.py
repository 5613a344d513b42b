"""The strategy seam: a strategy is one class plus one registration, and the Trainer asks it for wrapping,
the optimizer, clipping, accumulation's no-sync and the checkpoint format, naming no strategy itself."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs
import pytest
import torch

import devplug
from devplug.core.distributed.ddp import DDPStrategy
from devplug.core.distributed.strategy import build_strategy, strategy_names, unregister_strategy
from devplug.toolkit import Strategy, StrategyContext, register_strategy


class Replicate(Strategy):
    """A toy strategy: wraps nothing, but counts every call the Trainer makes to it."""

    name = "replicate"

    def __init__(self, context: StrategyContext) -> None:
        super().__init__(context)
        self.calls: dict[str, int] = {}
        Replicate.built.append(self)

    built: list[Replicate] = []

    def _count(self, what: str) -> None:
        self.calls[what] = self.calls.get(what, 0) + 1

    def prepare(self, module: torch.nn.Module, shard: Any = None) -> torch.nn.Module:
        self._count("prepare")
        return module

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        self._count("wrap")
        return module

    def optimizer_request(self, algorithm: str, params: list[Any], options: Mapping[str, Any],
                          ask_plugin: Callable[[], Any]) -> Callable[[], Any]:
        self._count(f"optimizer {algorithm}")
        return ask_plugin

    def clip_grad_norm(self, clip: Callable[[], Any]) -> Any:
        self._count("clip")
        return super().clip_grad_norm(clip)

    @contextlib.contextmanager
    def _off(self) -> Iterator[None]:
        self._count("no_sync")
        yield

    def no_sync(self, module: Any) -> contextlib.AbstractContextManager[Any]:
        return self._off()


@pytest.fixture
def replicate() -> Iterator[type[Replicate]]:
    register_strategy(Replicate)  # the one registration line
    Replicate.built = []
    yield Replicate
    unregister_strategy(Replicate.name)


def test_a_registered_strategy_trains_and_is_asked_for_everything(replicate):
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, stop_signals=(),
                              strategy="replicate", accumulate_grad_batches=2, count_flops=False)
    strategy = replicate.built[-1]
    assert trainer.strategy == "replicate" and trainer.sharding is None
    model = trainer.setup(torch.nn.Linear(3, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    before = model.weight.detach().clone()
    data = torch.utils.data.TensorDataset(torch.randn(16, 3), torch.randn(16, 1))
    loader = trainer.dataloader(data, 2, num_workers=0)
    norms = []
    for _ in trainer.epochs(1, max_steps=3):
        for x, y in loader:
            with trainer.accumulate(model):
                trainer.backward(torch.nn.functional.mse_loss(model(x), y))
                norms.append(trainer.clip_grad_norm(opt, 1.0))
                trainer.step(opt)
    assert trainer.global_step == 3
    # 6 micro-batches: 3 complete a step (clipped), 3 do not (gradient sync off)
    assert strategy.calls == {"prepare": 1, "wrap": 1, "optimizer sgd": 1, "clip": 3, "no_sync": 3}
    assert sum(n is not None for n in norms) == 3
    assert not torch.equal(model.weight.detach(), before)
    trainer.close()


def test_the_built_in_strategies_are_objects_chosen_once():
    trainer = devplug.Trainer(device="cpu", progress=False, stop_signals=())
    launch = trainer._launch
    assert type(trainer._strategy) is Strategy and trainer._strategy.checkpoint_format == "plain"
    assert strategy_names() == ("auto", "ddp", "fsdp")
    # one process: "ddp" and "auto" wrap nothing; launched, they are DDP
    context = StrategyContext(hooks=lambda *a, **k: None, device=trainer.device, launch=launch)
    assert type(build_strategy("ddp", context)) is Strategy
    launched = StrategyContext(hooks=lambda *a, **k: None, device=trainer.device,
                               launch=attrs.evolve(launch, world_size=2))
    assert isinstance(build_strategy("auto", launched), DDPStrategy)


def test_an_unknown_or_taken_strategy_name_is_one_line(replicate):
    with pytest.raises(devplug.ConfigError, match="strategy"):
        devplug.Trainer(device="cpu", progress=False, strategy="tensor-parallel")
    with pytest.raises(devplug.ConfigError, match="already registered"):
        register_strategy(type("Clash", (Replicate,), {"name": "fsdp"}))


def test_the_author_chooses_the_format_and_a_sharding_strategy_refuses_one_rank_0_writes_alone(tmp_path):
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, stop_signals=(),
                              checkpoint_format="sharded")
    model = trainer.setup(torch.nn.Linear(3, 1))
    trainer.optimizer("sgd", model.parameters(), lr=0.1)
    saved = tmp_path / "step_0000000.pt"
    assert trainer.save(saved) == str(saved) and (saved / ".metadata").is_file()  # a folder, not a file
    trainer.load(saved)
    trainer.close()
    with pytest.raises(devplug.ConfigError, match="checkpoint_format='plain' is written by rank 0 alone"):
        devplug.Trainer(device="cpu", precision="32-true", progress=False, stop_signals=(), strategy="fsdp",
                        checkpoint_format="plain")
