"""Sharded checkpoints are read as data only and checked against their manifest: a crafted metadata file
never runs, and a damaged, truncated, missing, spliced or foreign piece is one "damaged" line (auto_resume
goes back to the checkpoint before), for sharded folders and plain files alike."""

from __future__ import annotations

import logging
import pickle
import random
import shutil
from pathlib import Path

import pytest
import torch
from dist_scripts.fsdp_model import Block, lm_loss, make_lm, rank_batch

import devplug
from devplug import toolkit
from devplug.core.checkpoint import file as ckpt
from devplug.core.checkpoint import resume, sharded
from devplug.core.checkpoint.manifest import MANIFEST_FILE, check_manifest, write_manifest
from devplug.core.errors import CheckpointError


def _trainer(**options):
    return devplug.Trainer(device="cpu", precision="32-true", progress=False, seed=0, **options)


def _train(trainer, model, opt, steps, start=0):
    for step in range(start, start + steps):
        trainer.backward(lm_loss(model, rank_batch(step, 0, 1)))
        trainer.step(opt)


def _sharded(tmp_path: Path, steps=(1, 2)) -> dict[int, Path]:
    """Sharded checkpoints of one run after each of ``steps`` steps."""
    trainer = _trainer(strategy="fsdp")
    model = trainer.setup(make_lm(), name="lm", shard=[Block])
    opt = trainer.optimizer("adamw", model.parameters(), lr=1e-2)
    saved, done = {}, 0
    for step in steps:
        _train(trainer, model, opt, step - done, done)
        done = step
        saved[step] = Path(trainer.save(tmp_path / f"step_{step:07d}.pt", at=step))
    return saved


def _loader():
    trainer = _trainer()
    model = trainer.setup(make_lm(1), name="lm")
    trainer.optimizer("adamw", model.parameters(), lr=1e-2)
    return trainer, model


class _Creates:
    """A pickle that, when loaded, creates the file ``marker`` (standing in for any command)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _craft_metadata(folder: Path, marker: Path, *, manifest: bool) -> None:
    (folder / ".metadata").write_bytes(pickle.dumps(_Creates(marker)))
    if manifest:  # whoever crafted it also rewrote the manifest: the digests pass, the metadata must not
        write_manifest(folder)


@pytest.mark.parametrize("manifest", [True, False], ids=["manifest-rewritten", "manifest-kept"])
def test_a_crafted_metadata_file_is_refused_in_one_line_and_never_runs(tmp_path, manifest):
    saved = _sharded(tmp_path, steps=(1,))
    marker = tmp_path / "ran"
    _craft_metadata(saved[1], marker, manifest=manifest)
    trainer, _model = _loader()
    expected = "not plain checkpoint metadata.*nothing in it was run" if manifest else "is damaged"
    for attempt in (lambda: trainer.load(saved[1]), lambda: trainer.resume(saved[1]),
                    lambda: toolkit.consolidate_checkpoint(saved[1], tmp_path / "out.pt")):
        with pytest.raises(CheckpointError, match=expected) as info:
            attempt()
        assert "\n" not in str(info.value) and "\x1b" not in str(info.value)
    assert not marker.exists()
    # DCP's own metadata reader is never the one used: the crafted file read through it would run
    from devplug.core.checkpoint import safe_dcp

    with pytest.raises(CheckpointError, match="not plain checkpoint metadata"):
        safe_dcp.SafeReader(str(saved[1])).read_metadata()
    assert not marker.exists()


def test_auto_resume_passes_over_a_crafted_checkpoint_to_the_one_before(tmp_path, caplog):
    folder = tmp_path / "ckpt"
    saved = _sharded(folder)
    marker = tmp_path / "ran"
    _craft_metadata(saved[2], marker, manifest=True)
    policy = devplug.CheckpointPolicy(directory=folder, auto_resume=True)
    trainer = _trainer(checkpoints=policy)
    model = trainer.setup(make_lm(1), name="lm")
    trainer.optimizer("adamw", model.parameters(), lr=1e-2)
    with caplog.at_level(logging.WARNING, logger="devplug"):
        resumed = trainer.resume()
    assert resumed is not None and resumed.path == saved[1] and resumed.extra == {"at": 1}
    assert [path for path, _why in resumed.skipped] == [saved[2]]
    assert not marker.exists()


def test_a_byte_entry_that_is_not_plain_data_is_refused_and_never_runs(tmp_path):
    import torch.distributed.checkpoint as dcp

    marker = tmp_path / "ran"
    dcp.save({"w": torch.ones(2), "note": _Creates(marker)}, checkpoint_id=str(tmp_path / "raw"), no_dist=True)
    assert not marker.exists()
    with pytest.raises(CheckpointError, match="something other than tensors and plain values") as info:
        sharded.load_tensors(tmp_path / "raw", {"w": torch.zeros(2), "note": None})
    assert not marker.exists() and "\x1b" not in str(info.value)


def test_metadata_pointing_outside_its_folder_is_damaged(tmp_path):
    from devplug.core.checkpoint import safe_dcp

    saved = _sharded(tmp_path, steps=(1,))
    metadata = safe_dcp.read_metadata(saved[1])
    for info in metadata.storage_data.values():
        info.relative_path = "../../etc/passwd"
    (saved[1] / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(CheckpointError, match="points outside its folder"):
        safe_dcp.read_metadata(saved[1])


# ---- the damage suite ------------------------------------------------------------------------------------


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _outcome(path: Path):
    """("refused", message) or ("loaded", extra, weights) for a fresh one-process run loading ``path``."""
    trainer, model = _loader()
    try:
        extra = trainer.load(path)
    except CheckpointError as exc:
        return ("refused", str(exc))
    return ("loaded", extra, _weights(model))


def _assert_caught_or_identical(outcome, reference, case):
    if outcome[0] == "refused":
        assert "damaged" in outcome[1] and "\n" not in outcome[1] and "\x1b" not in outcome[1], (case, outcome[1])
        return
    assert outcome[1] == reference[1], case
    assert all(torch.equal(outcome[2][k], reference[2][k]) for k in reference[2]), case


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 1 << (offset % 8)
    path.write_bytes(bytes(data))


def test_every_damaged_sharded_checkpoint_is_caught(tmp_path):
    saved = _sharded(tmp_path / "good")
    reference = _outcome(saved[2])
    assert reference[0] == "loaded" and reference[1] == {"at": 2}
    rng = random.Random(0)
    cases = []
    shard = next(p.name for p in saved[2].iterdir() if p.suffix == ".distcp")
    size = (saved[2] / shard).stat().st_size
    cases += [(f"flip {shard}@{o}", lambda f, o=o: _flip(f / shard, o)) for o in rng.sample(range(size), 12)]
    for name in (shard, ".metadata", "trainer.pt", MANIFEST_FILE):
        cases.append((f"flip {name}", lambda f, n=name: _flip(f / n, 97)))
        cases.append((f"truncate {name}", lambda f, n=name: (f / n).write_bytes((f / n).read_bytes()[:-7])))
        cases.append((f"delete {name}", lambda f, n=name: (f / n).unlink()))
    cases.append(("shard of step 1", lambda f: shutil.copy(saved[1] / shard, f / shard)))
    cases.append(("trainer.pt of step 1", lambda f: shutil.copy(saved[1] / "trainer.pt", f / "trainer.pt")))
    cases.append(("metadata of step 1", lambda f: shutil.copy(saved[1] / ".metadata", f / ".metadata")))
    cases.append(("an added shard", lambda f: shutil.copy(f / shard, f / "__1_0.distcp")))
    caught = 0
    for n, (case, damage) in enumerate(cases):
        folder = tmp_path / f"case{n}" / "step_0000002.pt"
        shutil.copytree(saved[2], folder)
        damage(folder)
        outcome = _outcome(folder)
        _assert_caught_or_identical(outcome, reference, case)
        caught += outcome[0] == "refused"
    assert caught == len(cases)  # every one of these changes bytes the manifest lists


def test_every_damaged_plain_checkpoint_is_caught_or_loads_identical(tmp_path):
    trainer = _trainer()
    model = trainer.setup(make_lm(), name="lm")
    opt = trainer.optimizer("adamw", model.parameters(), lr=1e-2)
    _train(trainer, model, opt, 2)
    path = Path(trainer.save(tmp_path / "plain.pt", at=2))
    reference = _outcome(path)
    size = path.stat().st_size
    rng = random.Random(1)
    for n, offset in enumerate([*rng.sample(range(size), 40), 0, size - 1]):
        copy = tmp_path / f"flip{n}.pt"
        shutil.copy(path, copy)
        _flip(copy, offset)
        _assert_caught_or_identical(_outcome(copy), reference, f"flip @{offset}")
    for keep in (size // 3, size - 5):
        copy = tmp_path / f"cut{keep}.pt"
        copy.write_bytes(path.read_bytes()[:keep])
        outcome = _outcome(copy)
        assert outcome[0] == "refused", keep


def test_a_damaged_newest_sharded_checkpoint_falls_back_to_the_one_before(tmp_path, caplog):
    folder = tmp_path / "ckpt"
    saved = _sharded(folder)
    _flip(saved[2] / next(p.name for p in saved[2].iterdir() if p.suffix == ".distcp"), 5000)
    chosen, skipped, problem = resume.newest_intact(folder, explicit=False)
    assert (chosen, problem) == (saved[1], "") and [p for p, _ in skipped] == [saved[2]]
    assert "damaged" in skipped[0][1]
    policy = devplug.CheckpointPolicy(directory=folder, auto_resume=True)
    trainer = _trainer(checkpoints=policy)
    model = trainer.setup(make_lm(1), name="lm")
    trainer.optimizer("adamw", model.parameters(), lr=1e-2)
    resumed = trainer.resume()
    assert resumed is not None and (resumed.path, resumed.extra) == (saved[1], {"at": 1})
    _flip(saved[1] / "trainer.pt", 300)
    chosen, skipped, problem = resume.newest_intact(folder, explicit=False)
    assert chosen is None and len(skipped) == 1 and "no usable checkpoint" in problem  # step 2 was set aside


def test_the_manifest_lists_every_file_and_is_written_last(tmp_path):
    saved = _sharded(tmp_path, steps=(1,))
    names = {p.name for p in saved[1].iterdir()}
    assert {MANIFEST_FILE, ".metadata", "trainer.pt"} <= names
    check_manifest(saved[1])
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((".partial", ".tmp", ".old"))]


def test_messages_are_one_plain_line():
    assert ckpt.one_line("a\x1b[1mbold\x1b[0m\n  b") == "abold b"


def test_unchanged_files_are_hashed_once_and_a_change_after_a_check_is_still_caught(tmp_path, monkeypatch):
    from devplug.core.checkpoint import manifest

    folder = _sharded(tmp_path, steps=(1,))[1]
    hashed = []
    real_digest = manifest.file_digest
    monkeypatch.setattr(manifest, "file_digest", lambda path: hashed.append(path.name) or real_digest(path))
    check_manifest(folder)
    first = len(hashed)
    assert first >= 2
    check_manifest(folder)  # a resume checks its candidate, then loads it: the same files are not read again
    assert len(hashed) == first
    shard = next(p for p in folder.iterdir() if p.suffix == ".distcp")
    _flip(shard, 4096)
    with pytest.raises(CheckpointError, match="damaged"):
        check_manifest(folder)


def test_a_sharded_checkpoint_of_another_setup_is_a_mismatch_not_damaged(tmp_path, caplog):
    """Resumed in one process by a run that set up other modules, a sharded checkpoint is a wrong one (fix the
    command line), not a damaged one to pass over: the older checkpoint is not resumed and nothing is set aside."""
    from devplug.core.errors import CheckpointMismatchError

    saved = _sharded(tmp_path, steps=(1, 2))
    trainer = _trainer(checkpoints=devplug.CheckpointPolicy(directory=tmp_path))
    other = trainer.setup(torch.nn.Linear(3, 3), name="lm")  # the same name, other tensors
    trainer.optimizer("adamw", other.parameters(), lr=1e-2)
    with caplog.at_level(logging.WARNING, logger="devplug"), pytest.raises(CheckpointMismatchError) as info:
        trainer.resume()
    assert "damaged" not in str(info.value) and "skipping" not in caplog.text
    assert str(saved[2]) in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("step_", "abandoned"))) == [
        "step_0000001.pt", "step_0000002.pt"]
