"""The migration guides (docs/migration/) run: the devplug side always, each peer's side where it is installed.

Each guide holds the same program twice: a preamble (``<!-- guide: common -->``), the peer's version
(``torch``, ``fabric``, ``accelerate``) and devplug's (``devplug``). Each version is run as a script, as a
reader would save it, on the CPU: it must print ``step 56 accuracy A`` with A in the documented range,
and, run a second time in the same folder, resume from its checkpoint and print the same line.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from paths import REPO

GUIDES = REPO / "docs" / "migration"
PAGES = {"torch": "pytorch.md", "fabric": "fabric.md", "accelerate": "accelerate.md"}
# The module each peer's version imports, and how to install it when it is missing.
PEER_MODULES = {"fabric": ("lightning_fabric", "pip install lightning-fabric"),
                "accelerate": ("accelerate", "pip install accelerate")}
STEPS = 56  # 4 epochs x 896 samples / (32 per batch x 2 micro-batches per step)
RESULT = re.compile(r"^step (\d+) accuracy (\d\.\d+)$", re.M)


def guide_block(page: str, tag: str) -> str:
    """The code of the block marked ``<!-- guide: TAG -->`` in ``page``."""
    text = (GUIDES / page).read_text()
    blocks = re.findall(rf"<!-- guide: {tag} -->\n```python\n(.*?)```\n<!-- end of guide: {tag} -->", text, re.S)
    assert len(blocks) == 1, f"{page} must hold exactly one block marked 'guide: {tag}'"
    return blocks[0]


def run_twice(script: str, tmp_path: Path) -> tuple[str, str]:
    """Run ``script`` in ``tmp_path`` twice (the second run resumes); the two outputs."""
    path = tmp_path / "train.py"
    path.write_text(script)
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "",
           "PYTHONWARNINGS": "ignore"}
    outputs = []
    for _ in range(2):
        result = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        outputs.append(result.stdout)
    return outputs[0], outputs[1]


def check_result(first: str, second: str) -> None:
    found = RESULT.findall(first)
    assert len(found) == 1, f"expected one 'step N accuracy A' line, got: {first!r}"
    steps, accuracy = found[0]
    assert int(steps) == STEPS
    assert 0.85 <= float(accuracy) <= 1.0, f"accuracy {accuracy} below the documented 0.85"
    assert RESULT.findall(second) == found, "the resumed run must find nothing left to train and print the same"


def test_the_guides_share_the_preamble_and_the_devplug_version():
    common = {page: guide_block(page, "common") for page in PAGES.values()}
    devplug_side = {page: guide_block(page, "devplug") for page in PAGES.values()}
    assert len(set(common.values())) == 1, "the preamble differs between the guides"
    assert len(set(devplug_side.values())) == 1, "the devplug version differs between the guides"


def test_the_guides_are_current_and_their_evaluation_counts_each_sample_once():
    block = guide_block("pytorch.md", "devplug")
    assert 'trainer.all_reduce(correct, op="sum")' in block and "flush_logs" not in block  # no mean of accuracies
    for page in PAGES.values():
        text = (GUIDES / page).read_text()
        assert "DistributedDataParallel` only" not in text and 'strategy="fsdp"' in text, page
        assert "Weights & Biases" in text, page


def test_the_devplug_version_trains_checkpoints_and_resumes(tmp_path):
    script = guide_block("pytorch.md", "common") + "\n\n" + guide_block("pytorch.md", "devplug")
    check_result(*run_twice(script, tmp_path))
    namespace: dict = {}
    exec(guide_block("pytorch.md", "common"), namespace)  # the exported weights load into the plain model
    namespace["make_model"]().load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    kept = sorted(p.name for p in (tmp_path / "runs" / "guide").glob("step_*.pt"))
    assert kept == ["step_0000040.pt", f"step_{STEPS:07d}.pt"]  # every 20 steps and at the end, keep_last=2


@pytest.mark.parametrize("peer", sorted(PAGES))
def test_the_peer_version_runs(tmp_path, peer):
    if peer in PEER_MODULES:
        module, install = PEER_MODULES[peer]
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed ({install}, or pip install 'devplug[bench]'): "
                        f"the {peer} side of docs/migration/{PAGES[peer]} is not run")
    page = PAGES[peer]
    check_result(*run_twice(guide_block(page, "common") + "\n\n" + guide_block(page, peer), tmp_path))


def test_the_table_maps_the_calls_readers_look_for():
    """Each guide maps the peer's calls to devplug's, including the ones readers look for first."""
    expected = {
        "pytorch.md": ["trainer.setup", "trainer.backward", "trainer.accumulate", "trainer.clip_grad_norm",
                       "devplug.CheckpointPolicy", "trainer.all_reduce", "trainer.gather"],
        "fabric.md": ["fabric.setup(model, opt)", "fabric.backward", "fabric.clip_gradients", "fabric.save",
                      "trainer.optimizer", "trainer.register_for_checkpointing", "trainer.request_stop"],
        "accelerate.md": ["accelerator.prepare", "accelerator.accumulate", "clip_grad_norm_",
                          "accelerator.save_state", "gather_for_metrics", "trainer.gather", "trainer.resume"],
    }
    small_calls = ["trainer.barrier()", "trainer.main_process_first()", "trainer.broadcast(obj, src=0)",
                   "trainer.unwrap(model)"]
    peers = {"pytorch.md": ["dist.barrier()", "dist.broadcast_object_list", "model.module"],
             "fabric.md": ["fabric.barrier()", "fabric.rank_zero_first()", "fabric.broadcast(obj, src=0)",
                           "bf16-true", "fabric.init_module()"],
             "accelerate.md": ["accelerator.wait_for_everyone()", "accelerator.main_process_first()",
                               "broadcast_object_list", "accelerator.unwrap_model(model)", "accelerator.save_model"]}
    for page in expected:
        expected[page] += small_calls + peers[page]
    for page, names in expected.items():
        table = (GUIDES / page).read_text().split("## Call by call")[1].split("\n## ")[0]
        for name in names:
            assert name in table, f"{page}'s table lost {name}"


@pytest.mark.slow
def test_the_devplug_version_runs_under_torchrun_unchanged(tmp_path):
    """Two CPU processes: each rank trains on its half (28 steps), rank 0 alone prints the combined accuracy."""
    (tmp_path / "train.py").write_text(guide_block("pytorch.md", "common") + "\n\n"
                                       + guide_block("pytorch.md", "devplug"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "", "PYTHONWARNINGS": "ignore"}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    found = RESULT.findall(result.stdout)
    assert len(found) == 1, result.stdout
    assert int(found[0][0]) == STEPS // 2 and float(found[0][1]) >= 0.8


def test_a_missing_peer_is_skipped_with_the_reason(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else real(name, *a))
    with pytest.raises(pytest.skip.Exception, match=r"accelerate is not installed \(pip install accelerate"):
        test_the_peer_version_runs(tmp_path, "accelerate")
