"""The loader tuned to the device and the source, and the author's explicit settings winning.

Nothing here is timed: the sources are far from the thresholds (tensors in memory: well under a
millisecond per batch; sleeping samples: at least the sleep), or the threshold is moved for the test.
"""

from __future__ import annotations

import random
import time

import attrs
import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, TensorDataset

import devplug
from devplug import LoaderOptions, hookimpl
from devplug.core.data import tuning as loadtune
from devplug.core.registry.manager import create_plugin_manager
from devplug.plugins.cpu import plugin as cpu_plugin
from devplug.plugins.cuda import plugin as cuda_plugin
from devplug.toolkit import measured_matmul_flops, tune_loader

AUTO = frozenset({"num_workers", "pin_memory", "prefetch_factor"})


class Counting(Dataset):
    """Samples that sleep ``seconds`` each (an expensive source when long enough) and count their reads."""

    def __init__(self, length: int = 16, seconds: float = 0.0) -> None:
        self.length, self.seconds, self.reads = length, seconds, 0

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        self.reads += 1
        if self.seconds:
            time.sleep(self.seconds)
        return torch.full((3,), float(index)), index


class Noisy(Dataset):
    """Draws from torch's, Python's and NumPy's global random generators, as random augmentations do."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index), torch.rand(()).item(), random.random(), np.random.rand()])


class Capture:
    """A device-neutral plugin that records the LoaderOptions the device plugin's loader hook receives."""

    def __init__(self) -> None:
        self.options: list[LoaderOptions] = []

    @hookimpl(tryfirst=True)
    def devplug_dataloader(self, device, source, options):
        self.options.append(options)


def cpu_trainer(capture: Capture | None = None, seed: int = 0) -> devplug.Trainer:
    extra = [("capture", capture)] if capture is not None else []
    return devplug.Trainer(device="cpu", precision="32-true", progress=False, seed=seed,
                           plugin_manager=create_plugin_manager(autoload=False, extra_plugins=extra))


def test_a_cheap_in_memory_source_is_read_in_the_main_process_on_cpu():
    loader = cpu_trainer().dataloader(TensorDataset(torch.randn(64, 3)), batch_size=4)
    assert loader.choice.loader.num_workers == 0
    assert loader.implementation == "torch DataLoader(workers=0, pin_memory=False)"
    assert loader.choice.reason.startswith("auto: 0 workers") and " ms in the main process" in loader.choice.reason


def test_an_expensive_source_gets_a_worker_per_core_on_cpu():
    dataset = Counting(length=16, seconds=0.02)  # 20 ms a sample: far above the CPU threshold (1 ms)
    loader = cpu_trainer().dataloader(dataset, batch_size=4)
    workers = min(loadtune.MAX_WORKERS, loadtune.available_cpus())
    assert workers >= 1  # one per core, so a 1-core machine gets one too
    assert loader.choice.loader.num_workers == workers
    assert loader.choice.reason.startswith(f"auto: {workers} workers")
    assert 1 <= dataset.reads <= 4  # at most one batch was read to measure it (and at most ~0.2 s of it)


def test_a_moderate_source_gets_no_workers_where_compute_competes_but_workers_on_an_accelerator(monkeypatch):
    dataset = Counting(length=32, seconds=0.001)  # >= 8 ms a batch of 8: not cheap
    options = LoaderOptions(batch_size=8, num_workers=5, automatic=AUTO)
    monkeypatch.setattr(loadtune, "CPU_WORKER_SAMPLE_SECONDS", 1.0)  # below it whatever the machine's load
    on_cpu, why = tune_loader(dataset, options, compute_competes=True)
    assert on_cpu.num_workers == 0 and "workers would take their time from compute" in why
    on_gpu, why = tune_loader(dataset, options, compute_competes=False)
    assert on_gpu.num_workers == loadtune.default_workers() and "CPU cores - 1" in why


def test_explicit_settings_win_and_nothing_is_measured():
    capture = Capture()
    dataset = Counting(length=16, seconds=0.02)
    trainer = cpu_trainer(capture)
    loader = trainer.dataloader(dataset, batch_size=4, num_workers=0, pin_memory=False, prefetch_factor=3)
    assert capture.options[-1].automatic == frozenset()
    assert dataset.reads == 0 and loader.choice.reason == ""
    assert loader.choice.loader.num_workers == 0  # although the source is expensive

    cheap = Counting(length=16)
    loader = trainer.dataloader(cheap, batch_size=4, num_workers=2, prefetch_factor=3)
    assert capture.options[-1].automatic == frozenset({"pin_memory"})
    assert cheap.reads == 0
    assert loader.choice.loader.num_workers == 2 and loader.choice.loader.prefetch_factor == 3  # although cheap

    trainer.dataloader(cheap, batch_size=4)
    assert capture.options[-1].automatic == AUTO
    assert capture.options[-1].num_workers == loadtune.default_workers()  # usable as it is by any plugin
    assert capture.options[-1].prefetch_factor == loadtune.DEFAULT_PREFETCH


def test_tune_loader_leaves_explicit_options_alone():
    dataset = Counting(length=16, seconds=0.02)
    options = LoaderOptions(batch_size=4, num_workers=3, automatic={"pin_memory", "prefetch_factor"})
    assert tune_loader(dataset, options, compute_competes=True) == (options, "")
    assert dataset.reads == 0


def test_explicit_pin_memory_wins_on_cuda_and_workers_are_tuned():
    dataset = TensorDataset(torch.randn(16, 3))
    device = cuda_plugin.devplug_register_devices()
    device = devplug.Device(spec=device, index=None, plugin_name="cuda")
    auto = cuda_plugin.devplug_dataloader(device=device, source=dataset,
                                          options=LoaderOptions(batch_size=4, num_workers=2, automatic=AUTO))
    assert auto.loader.num_workers == 0 and auto.reason.startswith("auto: 0")
    assert auto.loader.pin_memory is False and "not pinned, no worker processes" in auto.reason  # tuned to none
    told = cuda_plugin.devplug_dataloader(device=device, source=dataset, options=LoaderOptions(
        batch_size=4, num_workers=2, pin_memory=False, automatic={"prefetch_factor"}))
    assert told.loader.pin_memory is False and told.loader.num_workers == 2 and told.reason == ""


def test_measuring_changes_neither_the_batches_nor_the_global_random_state(monkeypatch):
    # Whatever the machine's load, the measured source counts as cheap: the decision (0 workers) is fixed,
    # the measurement still runs, and what is compared is the batches and the random state.
    monkeypatch.setattr("devplug.core.data.tuning.CHEAP_BATCH_SECONDS", 60.0)
    monkeypatch.setattr("devplug.core.data.tuning.CPU_WORKER_SAMPLE_SECONDS", 60.0)
    # The CPU plugin measures its peak FLOP/s once per process at the third step, drawing from torch's global
    # generator (devplug.core.observe.flops); do it now, so that both loaders below run after it.
    measured_matmul_flops("cpu", torch.float32)
    trainer = cpu_trainer(seed=3)  # (seeds the global generators itself)
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    before = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    tuned = trainer.dataloader(Noisy(), batch_size=4, shuffle=True)
    assert tuned.choice.reason.startswith("auto: 0 workers")  # it was measured (and is cheap)
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]
    assert np.array_equal(np.random.get_state()[1], before[2])

    def first_epoch(loader) -> list[torch.Tensor]:
        torch.manual_seed(11)
        random.seed(11)
        np.random.seed(11)
        return list(loader)

    plain = cpu_trainer(seed=3).dataloader(Noisy(), batch_size=4, shuffle=True, num_workers=0)
    assert plain.choice.reason == ""
    tuned_batches, plain_batches = first_epoch(tuned), first_epoch(plain)
    assert len(tuned_batches) == 6
    assert all(torch.equal(a, b) for a, b in zip(tuned_batches, plain_batches, strict=True))


def test_the_cpu_plugin_and_the_fallback_say_whether_compute_competes(monkeypatch):
    seen = []
    monkeypatch.setattr("devplug.core.data.torch_loader.tune_loader",
                        lambda dataset, options, compute_competes: (seen.append(compute_competes) or (options, "")))
    dataset = TensorDataset(torch.randn(8, 3))
    options = LoaderOptions(batch_size=4, automatic=AUTO)
    cpu = devplug.Device(spec=cpu_plugin.devplug_register_devices(), index=None, plugin_name="cpu")
    cpu_plugin.devplug_dataloader(device=cpu, source=dataset, options=options)
    from devplug.core.fallback import plugin as fallback

    fallback.devplug_dataloader(device=cpu, source=dataset, options=options)  # not torch's accelerator
    cuda = devplug.Device(spec=cuda_plugin.devplug_register_devices(), index=None, plugin_name="cuda")
    monkeypatch.setattr("devplug.core.fallback.accelerator.current_accelerator_type", lambda: "cuda")
    fallback.devplug_dataloader(device=cuda, source=dataset, options=options)
    assert seen == [True, True, False]


@pytest.mark.parametrize(
    ("dataset", "why"),
    [
        (type("Unsized", (Dataset,), {"__getitem__": lambda self, i: torch.zeros(2)})(), "the data set has no length"),
        (type("Broken", (Dataset,), {"__len__": lambda self: 4,
                                     "__getitem__": lambda self, i: 1 / 0})(), "raised ZeroDivisionError"),
    ],
    ids=["unsized", "raises"],
)
def test_a_source_that_cannot_be_read_ahead_keeps_the_defaults_and_says_why(dataset, why):
    options = LoaderOptions(batch_size=2, num_workers=loadtune.default_workers(), automatic=AUTO)
    tuned, reason = tune_loader(dataset, options, compute_competes=True)
    assert tuned == options and why in reason and reason.startswith(f"auto: {options.num_workers} workers")


def test_the_reason_is_logged_where_the_trainer_builds_the_loader(caplog):
    with caplog.at_level("INFO", logger="devplug"):
        cpu_trainer().dataloader(TensorDataset(torch.randn(8, 3)), batch_size=4)
    assert any("torch DataLoader(workers=0, pin_memory=False) (auto: 0 workers" in r.getMessage()
               for r in caplog.records)


def test_automatic_names_only_options_devplug_chooses():
    with pytest.raises(ValueError, match="which devplug does not choose"):
        LoaderOptions(batch_size=2, automatic={"shuffle"})
    assert attrs.evolve(LoaderOptions(batch_size=2, automatic=["num_workers"])).automatic == {"num_workers"}


def test_a_source_read_a_batch_at_once_is_measured_within_the_time_budget_too():
    # random_split and Subset give a dataset with __getitems__, which the loader calls for a whole batch
    source = Counting(length=256, seconds=0.02)  # 20 ms a sample: a batch of 64 costs at least 1.3 s
    seconds, why = loadtune.main_process_batch_seconds(torch.utils.data.Subset(source, range(256)),
                                                       LoaderOptions(batch_size=64, automatic=AUTO))
    assert why == "" and seconds is not None and seconds >= 64 * 0.02
    assert 2 <= source.reads <= 16  # a few samples, about MEASURE_SECONDS (0.2 s) of them, not the whole batch


class Stream(IterableDataset):
    """Samples 0..length-1 in order, not split among loader workers (it does not call get_worker_info)."""

    def __init__(self, length: int = 8) -> None:
        self.length = length

    def __iter__(self):
        return iter(torch.arange(self.length, dtype=torch.float32).view(-1, 1))


@pytest.mark.parametrize("compute_competes", [True, False])
def test_an_iterable_dataset_left_automatic_gets_no_workers_each_would_yield_all_of_it(compute_competes):
    options = LoaderOptions(batch_size=2, num_workers=3, automatic=AUTO)
    tuned, reason = tune_loader(Stream(), options, compute_competes=compute_competes)
    assert tuned == attrs.evolve(options, num_workers=0)
    assert reason.startswith("auto: 0 workers") and "IterableDataset" in reason and "get_worker_info" in reason
    explicit = attrs.evolve(options, automatic=frozenset())  # the author's num_workers: one that splits itself
    assert tune_loader(Stream(), explicit, compute_competes=True) == (explicit, "")


@pytest.mark.slow
def test_an_iterable_dataset_yields_each_sample_once_an_epoch_on_a_machine_with_many_cores(monkeypatch):
    monkeypatch.setattr(loadtune, "available_cpus", lambda: 4)  # the default would be 3 workers
    trainer = cpu_trainer()
    loader = trainer.dataloader(Stream(8), batch_size=2)
    seen = [value for _ in trainer.epochs(1) for batch in loader for value in batch.view(-1).tolist()]
    assert sorted(seen) == [float(i) for i in range(8)]


def test_an_iterable_dataset_under_several_ranks_is_said_to_be_read_whole_by_each(caplog):
    from devplug.toolkit import torch_dataloader

    with caplog.at_level("WARNING"):
        torch_dataloader(Stream(), LoaderOptions(batch_size=2, rank=1, world_size=2))
    assert any("each of the 2 ranks reads all that the IterableDataset Stream yields" in r.getMessage()
               for r in caplog.records)
    caplog.clear()
    with caplog.at_level("WARNING"):
        torch_dataloader(Stream(), LoaderOptions(batch_size=2))  # one process: nothing to split
    assert not caplog.records
