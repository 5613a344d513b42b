"""Unreadable, damaged and mismatched checkpoint files: one CheckpointError line each, and nothing changes.

A corpus of bad files (empty, truncated, random bytes, text, HTML, a git-LFS pointer, a plain torch.save,
keys removed, a flipped byte, optimizer state of the wrong shapes, swapped optimizers, negative counters,
older and newer formats) is loaded into a trained setup: each is refused with a one-line reason that
never suggests ``weights_only=False``, and every module and optimizer tensor is as it was.
"""

from __future__ import annotations

import random
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import devplug
from devplug.core.checkpoint import file as ckpt
from devplug.core.errors import CheckpointError


def build(seed: int = 0) -> tuple[devplug.Trainer, dict[str, torch.nn.Module], dict[str, Any]]:
    """A two-network setup (a small GAN's shapes) trained for two steps, so its optimizers have state."""
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, seed=seed)
    torch.manual_seed(seed)
    nets = {"generator": trainer.setup(torch.nn.Sequential(torch.nn.Linear(3, 7), torch.nn.Linear(7, 5)), "generator"),
            "discriminator": trainer.setup(torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Linear(4, 1)),
                                           "discriminator")}
    opts = {key: trainer.optimizer("adam", net.parameters(), lr=1e-2) for key, net in nets.items()}
    for _ in range(2):
        fake = nets["generator"](torch.randn(4, 3))
        trainer.backward(nets["discriminator"](fake).mean())
        trainer.step(opts["discriminator"])
        trainer.step(opts["generator"])
    return trainer, nets, opts


def snapshot(nets: dict[str, torch.nn.Module], opts: dict[str, Any]) -> list[Any]:
    """Every module tensor, optimizer state tensor and hyperparameter, copied."""
    copied: list[Any] = [{k: v.clone() for k, v in net.state_dict().items()} for net in nets.values()]
    for opt in opts.values():
        state = opt.state_dict()
        copied.append({i: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
                       for i, s in state["state"].items()})
        copied.append([{k: v for k, v in g.items()} for g in state["param_groups"]])
    return copied


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    trainer, *_ = build()
    return Path(trainer.save(tmp_path_factory.mktemp("good") / "ck.pt", note="kept"))


def _edited(edit: Callable[[dict[str, Any]], None], *, rehash: bool = True) -> Callable[[bytes, Path], bytes]:
    """A file maker: the good checkpoint with ``edit`` applied (and its digest recomputed, as a tool would)."""
    def make(data: bytes, target: Path) -> bytes:
        target.write_bytes(data)
        state = torch.load(target, weights_only=True)
        edit(state)
        torch.save(ckpt.with_digest(state) if rehash else state, target)
        return target.read_bytes()
    return make


def _flip_in(member: str) -> Callable[[bytes, Path], bytes]:
    """The good checkpoint with one byte flipped in the middle of zip ``member`` (its pickle, or tensor data)."""
    def make(data: bytes, target: Path) -> bytes:
        target.write_bytes(data)
        with zipfile.ZipFile(target) as archive:
            info = next(i for i in archive.infolist() if i.filename.endswith(member))
        offset = info.header_offset  # the local header: 30 bytes, then the name and the extra field
        name_length = int.from_bytes(data[offset + 26:offset + 28], "little")
        extra_length = int.from_bytes(data[offset + 28:offset + 30], "little")
        flipped = bytearray(data)
        flipped[offset + 30 + name_length + extra_length + info.file_size // 2] ^= 0x5A
        return bytes(flipped)
    return make


def _del(*path: str) -> Callable[[dict[str, Any]], None]:
    def edit(state: dict[str, Any]) -> None:
        node = state
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
    return edit


def _set(value: Any, *path: Any) -> Callable[[dict[str, Any]], None]:
    def edit(state: dict[str, Any]) -> None:
        node = state
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return edit


def _swap_optimizers(state: dict[str, Any]) -> None:
    opts = state["optimizers"]
    opts["generator"], opts["discriminator"] = opts["discriminator"], opts["generator"]


def _wrong_shape(state: dict[str, Any]) -> None:
    state["optimizers"]["generator"]["state"]["state"][0]["exp_avg"] = torch.zeros(5, 7)


def _edit_state(entry: str, change: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[dict[str, Any]], None]:
    """An edit of the generator's optimizer state: ``entry`` of its first parameter changed."""
    def edit(state: dict[str, Any]) -> None:
        values = state["optimizers"]["generator"]["state"]["state"][0]
        values[entry] = change(values[entry])
    return edit


def _drop_second_moment(state: dict[str, Any]) -> None:
    del state["optimizers"]["generator"]["state"]["state"][1]["exp_avg_sq"]


def _nan_first(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.clone()
    tensor.view(-1)[0] = float("nan")
    return tensor


def _lfs(data: bytes, target: Path) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{'ab' * 32}\nsize {len(data)}\n".encode()


CORPUS: dict[str, tuple[Callable[[bytes, Path], bytes], str]] = {
    "empty": (lambda data, _: b"", r"is empty \(0 bytes\)"),
    "truncated at 3": (lambda data, _: data[:3], r"is truncated \(3 bytes"),
    "truncated at 100": (lambda data, _: data[:100], r"is truncated \(100 bytes"),
    "truncated at half": (lambda data, _: data[: len(data) // 2], "is truncated"),
    "truncated by one": (lambda data, _: data[:-1], "is truncated"),
    "random bytes": (lambda data, _: random.Random(0).randbytes(4096), "is not a checkpoint: its 4096 bytes are in no "
                                                                      "format torch writes"),
    "text": (lambda data, _: b"step,loss\n1,0.5\n2,0.4\n", r"is a text file, not a checkpoint \(it starts with "
                                                           r"'step,loss 1,0.5"),
    "html": (lambda data, _: b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head></html>\n", "is an HTML page"),
    "lfs pointer": (_lfs, "is a git-LFS pointer.*git lfs pull"),
    "plain torch.save": (lambda data, t: (torch.save({"weights": torch.ones(2)}, t), t.read_bytes())[1],
                         r"is not a devplug checkpoint \(a torch file holding a dict with keys \['weights'\]\)"),
    "top-level key removed": (_edited(_del("rng"), rehash=False), "is incomplete: it lacks rng"),
    "module key removed": (_edited(_del("modules", "generator", "0.bias")),
                           r"does not match this training setup: module 'generator': missing \['0.bias'\]"),
    "optimizer entry removed": (_edited(_del("optimizers", "generator")), "optimizers .* vs built"),
    "flipped byte in tensor data": (_flip_in("data/0"), "is damaged: its content does not match the digest"),
    "flipped byte in the pickle": (_flip_in("data.pkl"), "damaged"),
    "optimizer state of the wrong shape": (_edited(_wrong_shape),
                                           r"optimizer 'generator', parameter 0 of shape \(7, 3\): exp_avg has shape "
                                           r"\(5, 7\)"),
    "swapped optimizers": (_edited(_swap_optimizers), r"optimizer 'generator', parameter 0 of shape \(7, 3\): exp_avg "
                                                     r"has shape \(4, 5\)"),
    "negative global step": (_edited(_set(-1, "global_step")), "global_step is -1, not a non-negative integer"),
    "negative optimizer step": (_edited(_set(torch.tensor(-3.0), "optimizers", "generator", "state", "state", 0,
                                             "step")), "step tensor.-3.. is not a non-negative count"),
    "negative second moment": (_edited(_edit_state("exp_avg_sq", lambda t: -t - 1)),
                               r"optimizer 'generator': the adam state written by torch\.optim\.Adam\S* is impossible: "
                               r"parameter 0: exp_avg_sq has negative values"),
    "NaN first moment": (_edited(_edit_state("exp_avg", _nan_first)), "parameter 0: exp_avg holds NaN or infinity"),
    "fractional step": (_edited(_edit_state("step", lambda t: t + 0.5)),
                        r"parameter 0: step is 2\.5, not a whole non-negative count"),
    "second moment of one parameter removed": (_edited(_drop_second_moment),
                                               r"the parameters of group 0 hold different entries "
                                               r"\(\['exp_avg', 'exp_avg_sq', 'step'\] and \['exp_avg', 'step'\]\)"),
    "format 1": (_edited(_set(1, "format")), r"was written by an older devplug \(checkpoint format 1"),
    "format 3": (_edited(_set(3, "format")), r"was written by a newer devplug \(checkpoint format 3.*pip install -U"),
}


@pytest.mark.parametrize("case", list(CORPUS))
def test_a_bad_file_is_one_checkpoint_error_line_and_changes_nothing(good, tmp_path, case):
    make, expected = CORPUS[case]
    bad = tmp_path / "bad.pt"
    bad.write_bytes(make(good.read_bytes(), tmp_path / "work.pt"))
    trainer, nets, opts = build(seed=1)
    before = snapshot(nets, opts)
    step = trainer.global_step
    with pytest.raises(CheckpointError) as caught:
        trainer.load(bad)
    message = str(caught.value)
    assert message.startswith(f"checkpoint {str(bad)!r} ") or message.startswith("optimizer "), message
    assert "\n" not in message and "weights_only" not in message.lower(), message
    assert re.search(expected, message), message
    assert same(before, snapshot(nets, opts)) and trainer.global_step == step


def test_the_good_file_of_the_corpus_loads(good):
    trainer, nets, _ = build(seed=1)
    assert trainer.load(good) == {"note": "kept"}
    _, ref_nets, _ = build()
    assert same(snapshot(ref_nets, {}), snapshot(nets, {}))


def test_a_failure_while_restoring_puts_everything_back(good, monkeypatch):
    trainer, nets, opts = build(seed=1)
    before, rng_before = snapshot(nets, opts), torch.get_rng_state()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("device lost")

    monkeypatch.setattr(nets["discriminator"], "load_state_dict", broken)  # restored after the generator
    with pytest.raises(CheckpointError, match="could not be restored, and nothing was changed: device lost"):
        trainer.load(good)
    assert same(before, snapshot(nets, opts)) and torch.equal(rng_before, torch.get_rng_state())


def test_a_missing_path_and_a_folder_are_named(tmp_path):
    trainer, *_ = build()
    with pytest.raises(CheckpointError, match="does not exist"):
        trainer.load(tmp_path / "missing.pt")
    with pytest.raises(CheckpointError, match="is a folder"):
        trainer.load(tmp_path)


def _same_set_two_orders() -> tuple[set[str], set[str]]:
    """Two equal sets of strings that iterate in different orders, as one set does in two processes (string
    hashes are seeded per process, so a set of strings unpickled in another process iterates otherwise)."""
    first = "tag0"
    for n in range(1, 200):
        other = f"tag{n}"
        a, b = {first}, {other}
        a.add(other)
        b.add(first)
        if list(a) != list(b):
            return a, b
    raise AssertionError("no two strings collide in a small set's table")  # pragma: no cover


def test_a_set_in_extra_loads_in_another_process(tmp_path):
    """The digest of a set does not depend on its iteration order, which changes with the process's hash seed."""
    saved_order, other_order = _same_set_two_orders()
    assert saved_order == other_order and list(saved_order) != list(other_order)
    trainer, _nets, _opts = build()
    path = Path(trainer.save(tmp_path / "ck.pt", tags=saved_order))
    state = torch.load(path, weights_only=True)
    state["extra"]["tags"] = other_order  # the same checkpoint as another process reads it back
    torch.save(state, path)
    restored = build()[0].load(path)
    assert restored["tags"] == saved_order


def test_a_checkpoint_whose_digest_took_its_sets_in_order_still_loads(tmp_path):
    """A checkpoint written before sets were digested regardless of order is not called damaged."""
    from devplug.core.checkpoint import digest as content

    trainer, _nets, _opts = build()
    path = Path(trainer.save(tmp_path / "ck.pt", tags={3, 1, 2}))
    state = torch.load(path, weights_only=True)
    state["digest"] = content.digest({k: v for k, v in state.items() if k != "digest"}, sets_in_order=True)
    torch.save(state, path)
    assert build()[0].load(path)["tags"] == {1, 2, 3}
