"""HabanaDataLoader on Gaudi 2 (media pipeline) and first-generation Gaudi (aeon), against the stand-in.

The stand-in (tests/standins/hpu_standin/habana_dataloader) mirrors the bridge's habana_dataset.py: the
media pipeline ignores the sampler, workers and pinning, shards by rank itself, seeds its shuffle from
the clock and rounds the last batch up; aeon runs only with 8 workers, pinning, ImageNet's mean/std as
lists and JPEG files, and otherwise HabanaDataLoader quietly runs torch's DataLoader. These tests
check that devplug names what really runs and keeps its guarantees (or says which one is lost).
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest
import torch
from standins import hpu_fixtures

from devplug.core.contract import hookspecs
from devplug.core.contract.records import ImageFolderSource, LoaderOptions

pytestmark = [
    pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true:UserWarning"),
    pytest.mark.filterwarnings("ignore:This DataLoader will create 8 worker processes:UserWarning"),
]

IMAGENET = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}


@pytest.fixture
def hpu(monkeypatch: pytest.MonkeyPatch):
    """The stand-in Gaudi stack (a Gaudi 2 with the media loader unless a test says otherwise)."""
    yield from hpu_fixtures.standin(monkeypatch)


def images(tmp_path: Path, count: int = 5, suffix: str = ".jpg") -> Path:
    """An ImageFolder of ``count`` images, each a distinct colour, labels 0/1 alternating."""
    from PIL import Image

    root = tmp_path / "images"
    for i in range(count):
        folder = root / ("ab"[i % 2])
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (10, 10), (20 * i, 0, 0)).save(folder / f"{i}{suffix}", quality=100)
    return root


def on_ranks(monkeypatch: pytest.MonkeyPatch, rank: int, world: int) -> None:
    """torch.distributed as a launched rank sees it (the stand-in shards by these, as the bridge does)."""
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a: world)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda *a: rank)


def build(hpu: hpu_fixtures.StandIn, source: object, **options: object):
    device_options = options.pop("device_options", {})
    return hpu.hooks(**device_options)(hookspecs.devplug_dataloader, source=source,
                                       options=LoaderOptions(**options))


def colours(batches) -> list[int]:
    """Each sample's identity: its red channel (0, 20, 40, ...), read back from the image normalized to [-1, 1]."""
    return [round((float(image[0].mean()) * 0.5 + 0.5) * 255 / 20) * 20 for batch, _ in batches for image in batch]


# ---- what the stand-in does, as the vendor's code does it ------------------------------------------------
def test_standin_media_path_ignores_the_sampler_and_rounds_up_the_last_batch(hpu, tmp_path, monkeypatch):
    import habana_dataloader
    import torchvision

    dataset = torchvision.datasets.ImageFolder(str(images(tmp_path)), transform=torchvision.transforms.Compose(
        [torchvision.transforms.Resize(8), torchvision.transforms.ToTensor(),
         torchvision.transforms.Normalize([0.5] * 3, [0.5] * 3)]))
    only_first = torch.utils.data.SubsetRandomSampler([0])
    monkeypatch.setattr("time.time_ns", lambda: 1234)  # the pipeline's seed comes from the clock
    loader = habana_dataloader.HabanaDataLoader(dataset, batch_size=2, sampler=only_first, num_workers=4)
    assert hpu.details("HabanaDataLoader.path") == [{"path": "media", "error": ""}]
    labels = [int(label) for _, batch in loader for label in batch]
    assert len(labels) == 6  # 5 samples rounded up to 3 batches of 2; the one-sample sampler ignored
    on_ranks(monkeypatch, 1, 2)
    rank1 = habana_dataloader.HabanaDataLoader(dataset, batch_size=2, drop_last=True)
    assert len(rank1) == 1  # rank 1 of 2 gets 2 of the 5 files: sharded by the loader itself


def test_standin_aeon_falls_back_to_torch_unless_eight_workers_and_imagenet_lists(hpu, tmp_path, monkeypatch):
    import habana_dataloader
    import torchvision

    monkeypatch.setenv("HPU_STANDIN_DEVICE_TYPE", "gaudi")
    t = torchvision.transforms

    def folder(mean: object) -> object:
        return torchvision.datasets.ImageFolder(str(images(tmp_path)), transform=t.Compose(
            [t.Resize(8), t.CenterCrop(8), t.ToTensor(), t.Normalize(mean, IMAGENET["std"])]))

    habana_dataloader.HabanaDataLoader(folder(IMAGENET["mean"]), batch_size=2, num_workers=8, pin_memory=True)
    habana_dataloader.HabanaDataLoader(folder(list(IMAGENET["mean"])), batch_size=2, num_workers=2,
                                       pin_memory=True)
    paths = hpu.details("HabanaDataLoader.path")
    assert paths[0]["path"] == "torch" and "mean" in paths[0]["error"]  # a tuple mean is not ImageNet's list
    assert paths[1]["path"] == "torch" and "'num_workers' is supported only as 8" in paths[1]["error"]


# ---- devplug on Gaudi 2: what runs is named; evaluation keeps each sample once ---------------------------
def test_training_loader_uses_the_media_pipeline_and_says_once_what_it_gives_up(hpu, tmp_path, caplog):
    source = ImageFolderSource(str(images(tmp_path)), 8)
    with caplog.at_level(logging.WARNING, logger="devplug.plugins.hpu"):
        choice = build(hpu, source, batch_size=2, shuffle=True, num_workers=4)
        build(hpu, source, batch_size=2, shuffle=True, num_workers=4)
    assert choice.implementation.startswith("HabanaDataLoader(Gaudi 2 media pipeline, shuffle=True")
    assert "workers=" not in choice.implementation and "pin_memory" not in choice.implementation
    warnings = [r.getMessage() for r in caplog.records if "media pipeline" in r.getMessage()]
    assert len(warnings) == 1
    assert "does not replay the interrupted epoch's order" in warnings[0] and "clock seed" in warnings[0]
    assert "habana_dataloader=False" in warnings[0] and "repeats samples" in warnings[0]


def test_two_rank_evaluation_on_gaudi2_reads_each_sample_exactly_once(hpu, tmp_path, monkeypatch):
    source = ImageFolderSource(str(images(tmp_path)), 8)
    seen: list[int] = []
    for rank in (0, 1):
        on_ranks(monkeypatch, rank, 2)
        choice = build(hpu, source, batch_size=2, world_size=2, rank=rank, evaluation=True)
        assert choice.implementation.startswith("torch DataLoader")
        assert "an evaluation loader reads each sample exactly once" in choice.reason
        seen += colours(choice.loader)
    assert Counter(seen) == Counter(range(0, 100, 20))
    assert hpu.count("HabanaDataLoader") == 0


def test_two_rank_training_through_the_media_path_is_warned_and_torch_loader_replays(hpu, tmp_path, monkeypatch):
    # Through the media pipeline the epoch order is the pipeline's own (clock-seeded), so devplug cannot
    # replay it after a resume: it warns (above). With habana_dataloader=False it can, and does.
    source = ImageFolderSource(str(images(tmp_path, count=8)), 8)
    on_ranks(monkeypatch, 0, 2)
    media = build(hpu, source, batch_size=2, shuffle=True, world_size=2, rank=0)
    assert media.sampler is None and "sharded by the loader" in media.implementation
    kept = build(hpu, source, batch_size=2, shuffle=True, world_size=2, rank=0,
                 device_options={"habana_dataloader": False})
    assert kept.implementation.startswith("torch DataLoader") and "habana_dataloader=False" in kept.reason
    sampler = kept.sampler
    sampler.set_epoch(3)
    full = list(sampler)
    sampler.set_epoch(3)
    sampler.start_next_at(2)  # what a resume after one batch of 2 does
    assert list(sampler) == full[2:]


def test_a_fallback_the_plugin_did_not_predict_is_still_named(hpu, tmp_path, monkeypatch):
    import habana_dataloader

    def refuse(transform: object) -> None:
        raise ValueError("Unsupported transform")

    monkeypatch.setattr(habana_dataloader, "_media_transforms", refuse)
    choice = build(hpu, ImageFolderSource(str(images(tmp_path)), 8), batch_size=2)
    assert hpu.details("HabanaDataLoader.path")[0]["path"] == "torch"
    assert choice.implementation.startswith("torch DataLoader")
    assert "could not start its Gaudi pipeline" in choice.reason


def test_non_jpeg_or_odd_sizes_run_torch_loader_with_the_reason(hpu, tmp_path):
    png = build(hpu, ImageFolderSource(str(images(tmp_path / "p", suffix=".png")), 8), batch_size=2)
    assert png.implementation.startswith("torch DataLoader") and "JPEG files only" in png.reason
    odd = build(hpu, ImageFolderSource(str(images(tmp_path / "o")), 7), batch_size=2)
    assert odd.implementation.startswith("torch DataLoader") and "even sizes" in odd.reason
    assert hpu.count("HabanaDataLoader") == 0


# ---- devplug on first-generation Gaudi: aeon only where its conditions hold --------------------------------
def test_gaudi1_default_normalization_runs_torch_loader_and_says_so(hpu, tmp_path, monkeypatch):
    monkeypatch.setenv("HPU_STANDIN_DEVICE_TYPE", "gaudi")
    choice = build(hpu, ImageFolderSource(str(images(tmp_path)), 8), batch_size=2)
    assert choice.implementation.startswith("torch DataLoader")
    assert "ImageNet's mean/std only" in choice.reason
    assert hpu.count("HabanaDataLoader") == 0


def test_gaudi1_imagenet_source_gets_aeon_with_eight_workers(hpu, tmp_path, monkeypatch):
    monkeypatch.setenv("HPU_STANDIN_DEVICE_TYPE", "gaudi")
    source = ImageFolderSource(str(images(tmp_path)), 8, **IMAGENET)
    choice = build(hpu, source, batch_size=2, num_workers=2, automatic={"num_workers"})
    assert choice.implementation.startswith("HabanaDataLoader(aeon pipeline on Gaudi, 8 decode threads")
    (call,) = hpu.details("HabanaDataLoader")
    assert call["num_workers"] == 8 and call["pin_memory"] is True and "shuffle" not in call
    assert hpu.details("HabanaDataLoader.path") == [{"path": "aeon", "error": ""}]
    assert sum(len(labels) for _, labels in choice.loader) == 6  # 5 images, last batch rounded up
    fixed = build(hpu, source, batch_size=2, num_workers=2)
    assert fixed.implementation.startswith("torch DataLoader") and "exactly 8 workers" in fixed.reason
    shuffled = build(hpu, source, batch_size=2, shuffle=True, automatic={"num_workers"})
    assert shuffled.implementation.startswith("torch DataLoader") and "never shuffles" in shuffled.reason
