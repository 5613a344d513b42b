"""The DCGAN example (examples/dcgan/): model sizes, training runs on every data source, the cache, resume, outputs.

The script runs in-process through its ``main(argv)`` with tiny networks (16×16 images, widths 4) on
the CPU in fp32, so each test takes a few seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from dcgan_runs import TINY, run, write_images
from paths import REPO
from PIL import Image

from dcgan import cli  # examples/dcgan/, on pytest's pythonpath
from dcgan.cache import decode_image, prepare_cache
from dcgan.embedded_data import FakeImages, ShapesDataset
from dcgan.models import (
    PRESETS,
    Discriminator,
    Generator,
    ModelSpec,
    build_models,
    count_parameters,
)


def summary_of(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


# ---- models ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "params_g", "params_d"),
    [
        ("naive-64", 3_576_704, 2_765_568),
        ("safe-64", 52_448_768, 2_765_568),
        ("safe-128", 195_063_296, 44_611_072),
    ],
)
def test_parameter_counts_of_the_presets(name, params_g, params_d):
    spec = PRESETS[name]
    with torch.device("meta"):  # count only: no memory, no training
        generator, discriminator = Generator(spec), Discriminator(spec)
    assert (count_parameters(generator), count_parameters(discriminator)) == (params_g, params_d)


def test_safe_128_has_one_more_block_in_each_network():
    with torch.device("meta"):
        g64, d64 = Generator(PRESETS["safe-64"]), Discriminator(PRESETS["safe-64"])
        g128, d128 = Generator(PRESETS["safe-128"]), Discriminator(PRESETS["safe-128"])

    def convs(module):
        return sum(isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d)) for m in module.modules())

    assert convs(g128) == convs(g64) + 1 and convs(d128) == convs(d64) + 1


@pytest.mark.parametrize("size", [16, 32, 64])
def test_shapes_and_logits(size):
    spec = ModelSpec(nz=8, ngf=4, ndf=4, image_size=size)
    generator, discriminator = build_models(spec)
    images = generator(torch.randn(3, 8, 1, 1))
    assert images.shape == (3, 3, size, size) and images.abs().max() <= 1
    logits = discriminator(images)
    assert logits.shape == (3,)


def test_dcgan_init():
    generator, discriminator = build_models(ModelSpec(nz=16, ngf=32, ndf=32, image_size=32))
    for conv, norm in ((generator.main[3], generator.main[4]), (discriminator.main[2], discriminator.main[3])):
        assert abs(conv.weight.mean().item()) < 0.01 and abs(conv.weight.std().item() - 0.02) < 0.005
        assert abs(norm.weight.mean().item() - 1) < 0.01 and abs(norm.weight.std().item() - 0.02) < 0.01
        assert norm.bias.abs().max() == 0


@pytest.mark.parametrize("size", [8, 48, 100, 2048])
def test_unsupported_image_size_is_a_config_error(size):
    with pytest.raises(Exception, match="not supported"):
        ModelSpec(nz=8, ngf=4, ndf=4, image_size=size).check()


# ---- data -----------------------------------------------------------------------------------------


def test_embedded_and_fake_data_are_deterministic_uint8():
    shapes = ShapesDataset(16, length=8)
    first, label = shapes[5]
    assert first.dtype == torch.uint8 and first.shape == (3, 16, 16) and label in (0, 1)
    assert torch.equal(first, ShapesDataset(16, length=8)[5][0])
    assert len({tuple(shapes[i][0].flatten().tolist()) for i in range(8)}) == 8
    fake = FakeImages(16, length=10)
    assert fake[3][0].shape == (3, 16, 16) and len(fake) == 10


def test_embedded_images_are_the_same_drawn_alone_or_in_a_batch():
    shapes = ShapesDataset(32, length=500, seed=4)
    indices = [499, 0, 17, 17, 250, *range(100, 160)]
    batch = shapes.__getitems__(indices)
    assert [label for _, label in batch] == [shapes[i][1] for i in indices]
    assert all(torch.equal(image, shapes[i][0]) for (image, _), i in zip(batch, indices, strict=True))
    assert {label for _, label in batch} == {0, 1}
    with pytest.raises(IndexError, match="out of range for 500 images"):
        shapes.__getitems__([3, 500])


def test_decode_resizes_short_side_and_center_crops(tmp_path):
    image = Image.new("RGB", (60, 30), (255, 0, 0))
    image.paste((0, 0, 255), (0, 0, 15, 30))  # a blue left quarter, cropped away by the center crop
    image.save(tmp_path / "wide.png")
    pixels = decode_image(tmp_path / "wide.png", 16)
    assert pixels.shape == (3, 16, 16) and pixels.dtype.name == "uint8"
    assert pixels[0].min() > 200 and pixels[2].max() < 60


def test_cache_is_built_once_reused_and_rebuilt_when_the_folder_changes(tmp_path, monkeypatch):
    folder, cache = tmp_path / "images", tmp_path / "cache"
    paths = write_images(folder, 10)
    opened = []
    real_open = Image.open

    def counting_open(fp, *args, **kwargs):
        opened.append(str(fp))
        return real_open(fp, *args, **kwargs)

    monkeypatch.setattr(Image, "open", counting_open)
    # Two epochs of 2 batches: every image file is opened exactly once (building the cache), so the
    # second epoch (and the first) open none.
    assert run(["--data", str(folder), "--cache-dir", str(cache), "--epochs", "2", "--out", str(tmp_path / "a")]) == 0
    assert sorted(opened) == sorted(str(p) for p in paths)
    first = summary_of(tmp_path / "a")
    assert first["cache_built"] and first["image_files_opened_for_cache"] == 10 and first["epoch"] == 2
    assert len(list(cache.glob("*.npy"))) == 1

    opened.clear()
    assert run(["--data", str(folder), "--cache-dir", str(cache), "--epochs", "2", "--out", str(tmp_path / "b")]) == 0
    assert opened == []  # unchanged folder: the cache is reused, no image file is opened at all
    assert not summary_of(tmp_path / "b")["cache_built"]

    os.utime(paths[0], ns=(1_000_000_000, 1_000_000_000))  # touched: the key changes, the cache is rebuilt
    write_images(folder / "extra", 2, classes=False)
    assert run(["--data", str(folder), "--cache-dir", str(cache), "--steps", "1", "--out", str(tmp_path / "c")]) == 0
    assert len(opened) == 12 and summary_of(tmp_path / "c")["cache_built"]
    assert len(list(cache.glob("*.npy"))) == 1  # the stale cache was removed


def test_cache_matches_direct_decoding(tmp_path):
    folder = tmp_path / "images"
    paths = write_images(folder, 4, classes=False)
    dataset, report = prepare_cache(folder, 16, tmp_path / "cache")
    assert report.built and len(dataset) == 4
    for index, path in enumerate(sorted(paths)):
        assert torch.equal(dataset[index][0], torch.from_numpy(decode_image(path, 16)))


def test_unreadable_images_are_skipped_and_counted(tmp_path, capsys):
    folder = tmp_path / "images"
    write_images(folder, 8, classes=False)
    (folder / "broken.jpg").write_bytes(b"not a jpeg at all")
    (folder / "truncated.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 10)
    assert run(["--data", str(folder), "--cache-dir", str(tmp_path / "cache"), "--steps", "2",
                "--out", str(tmp_path / "out")]) == 0
    summary = summary_of(tmp_path / "out")
    assert summary["image_files_skipped"] == 2 and summary["image_files_opened_for_cache"] == 10
    out = capsys.readouterr().out
    assert "skipped 2 unreadable" in out and "8 images" in out


# ---- runs -----------------------------------------------------------------------------------------


def test_run_on_a_folder_of_jpeg_and_png_writes_every_output(tmp_path, capsys):
    folder, out = tmp_path / "images", tmp_path / "run"
    write_images(folder, 10)
    argv = ["--data", str(folder), "--cache-dir", str(tmp_path / "cache"), "--steps", "4", "--log-every", "2",
            "--sample-every", "2", "--save-every", "3", "--out", str(out), "--price-per-hour", "3.06"]
    assert run(argv) == 0
    assert sorted(p.name for p in (out / "samples").iterdir()) == ["step_0000002.png", "step_0000004.png"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_0000003.pt", "step_0000004.pt"]
    assert Image.open(out / "samples" / "step_0000004.png").size == (8 * 16 + 18, 8 * 16 + 18)
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    summary = summary_of(out)
    assert summary["steps"] == 4 and summary["device"] == "cpu" and summary["precision"] == "32-true"
    assert summary["params_g"] == count_parameters(Generator(ModelSpec(8, 4, 4, 16)))
    assert summary["optimizer_g"].startswith("torch.optim.Adam")
    assert summary["images_per_sec"] > 0
    assert summary["images_per_hour"] == pytest.approx(summary["images_per_sec"] * 3600)
    assert summary["images_per_dollar"] == pytest.approx(summary["images_per_hour"] / 3.06)
    printed = capsys.readouterr().out
    for needle in ("DCGAN run summary", "device", "precision", "optimizer", "images/s", "images/hour", "images/$",
                   "parameters", "step 4/4"):
        assert needle in printed


def test_summary_says_when_the_first_step_ended(tmp_path):
    before = time.time()
    assert run(["--data", "fake", "--steps", "2", "--out", str(tmp_path / "run")]) == 0
    ended = summary_of(tmp_path / "run")["first_step_unix_time"]
    assert before < ended < time.time()  # wall-clock, so a launcher can subtract its own start time


def test_tensorboard_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    assert run(["--data", "shapes", "--steps", "4", "--log-every", "2", "--sample-every", "4", "--out", str(out)]) == 0
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"train/loss_D", "train/loss_G", "train/D_x", "train/D_G_z", "perf/samples_per_sec"} <= scalars
    assert {tag for tag in scalars if tag.startswith("lr/")} == {"lr/generator", "lr/discriminator"}
    assert not {"lr", "images_per_sec", "train/lr"} & scalars  # one tag per figure: no duplicates
    assert [e.step for e in events.Scalars("train/loss_D")] == [2, 4]
    assert "samples" in events.Tags()["images"]


def test_fake_data_run(tmp_path):
    out = tmp_path / "run"
    assert run(["--data", "fake", "--steps", "3", "--out", str(out)]) == 0
    summary = summary_of(out)
    assert summary["steps"] == 3 and summary["data"].startswith("fake") and summary["cache"] is None


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_mixed_precision_runs(tmp_path, precision):
    out = tmp_path / "run"
    assert run(["--data", "shapes", "--steps", "2", "--precision", precision, "--out", str(out)]) == 0
    summary = summary_of(out)
    assert summary["precision"] == precision and summary["steps"] == 2


def test_default_model_for_embedded_data_is_tiny_32():
    settings = cli.resolve(cli.parse([]))
    assert settings.model == "tiny-32" and settings.data == "shapes" and settings.epochs == cli.DEFAULT_EPOCHS
    assert settings.out.parts[:2] == ("runs", "dcgan")
    assert cli.resolve(cli.parse(["--data", "fake"])).model == "naive-64"
    custom = cli.resolve(cli.parse(["--model", "safe-64", "--ngf", "8"])).spec
    assert (custom.nz, custom.ngf, custom.ndf, custom.image_size) == (256, 8, 64, 64)


def final_state(checkpoint: Path) -> dict:
    return torch.load(checkpoint, map_location="cpu", weights_only=True)


def assert_same_tensors(left, right, where=""):
    if isinstance(left, torch.Tensor):
        assert torch.equal(left, right), f"{where} differs"
    elif isinstance(left, dict):
        assert left.keys() == right.keys(), where
        for key in left:
            assert_same_tensors(left[key], right[key], f"{where}.{key}")
    elif isinstance(left, (list, tuple)):
        assert len(left) == len(right), where
        for index, (a, b) in enumerate(zip(left, right, strict=True)):
            assert_same_tensors(a, b, f"{where}[{index}]")
    else:
        assert left == right, where


def test_resume_ends_with_weights_identical_to_an_uninterrupted_run(tmp_path):
    # 10 images, batch 4, drop_last: 2 steps per epoch, so 7 steps cross 3 epoch boundaries and the
    # resume at step 3 lands in the middle of an epoch (the consumed batch must be skipped).
    folder = tmp_path / "images"
    write_images(folder, 10)
    common = ["--data", str(folder), "--cache-dir", str(tmp_path / "cache"), "--steps", "7", "--sample-every", "2",
              "--keep-checkpoints", "0"]
    straight, first, resumed = tmp_path / "straight", tmp_path / "first", tmp_path / "resumed"
    assert run([*common, "--save-every", "100", "--out", str(straight)]) == 0
    assert run([*common, "--save-every", "3", "--steps", "3", "--out", str(first)]) == 0
    assert run([*common, "--save-every", "100", "--out", str(resumed),
                "--resume", str(first / "checkpoints" / "step_0000003.pt")]) == 0
    a = final_state(straight / "checkpoints" / "step_0000007.pt")
    b = final_state(resumed / "checkpoints" / "step_0000007.pt")
    assert (a["global_step"], a["epoch"]) == (b["global_step"], b["epoch"]) == (7, 3)
    assert_same_tensors(a["modules"], b["modules"], "modules")
    assert_same_tensors(a["optimizers"], b["optimizers"], "optimizers")
    assert_same_tensors(a["rng"]["torch"], b["rng"]["torch"], "rng")


def test_resume_from_a_run_folder_continues_in_it(tmp_path):
    out = tmp_path / "run"
    assert run(["--data", "shapes", "--steps", "2", "--out", str(out)]) == 0
    assert run(["--data", "shapes", "--steps", "4", "--resume", str(out)]) == 0
    assert (out / "checkpoints" / "step_0000004.pt").exists()
    assert summary_of(out)["steps"] == 4 and summary_of(out)["images_this_run"] == 8


def test_auto_resume_starts_fresh_then_continues_from_the_newest_checkpoint(tmp_path):
    out = tmp_path / "run"
    assert run(["--data", "shapes", "--steps", "2", "--out", str(out), "--auto-resume"]) == 0
    assert summary_of(out)["steps"] == 2 and summary_of(out)["images_this_run"] == 8
    assert run(["--data", "shapes", "--steps", "3", "--out", str(out), "--auto-resume"]) == 0
    assert summary_of(out)["steps"] == 3 and summary_of(out)["images_this_run"] == 4


def interrupt_at_item(monkeypatch, item: int, action) -> None:
    """Make the embedded data set call ``action()`` when item number ``item`` is fetched (in batches)."""
    calls = {"n": 0}
    original = ShapesDataset.__getitems__

    def fetching(self, indices):  # the loader asks for a batch of items at once
        before, calls["n"] = calls["n"], calls["n"] + len(indices)
        if before < item <= calls["n"]:
            action()
        return original(self, indices)

    monkeypatch.setattr(ShapesDataset, "__getitems__", fetching)


def test_first_ctrl_c_finishes_the_step_then_saves_samples_and_summarizes(tmp_path, monkeypatch, capsys):
    interrupt_at_item(monkeypatch, 3 * 4 + 1, lambda: os.kill(os.getpid(), signal.SIGINT))  # during batch 4
    out = tmp_path / "run"
    assert run(["--data", "shapes", "--steps", "10", "--out", str(out)]) == 130
    summary = summary_of(out)
    assert summary["status"] == "interrupted" and summary["steps"] == 4
    assert (out / "checkpoints" / "step_0000004.pt").exists() and (out / "samples" / "step_0000004.png").exists()
    captured = capsys.readouterr()
    assert "DCGAN run summary (interrupted)" in captured.out and "stopping after this step" in captured.err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGUSR1, 138)])
def test_sigterm_or_sigusr1_saves_summarizes_and_auto_resume_ends_equal(tmp_path, monkeypatch, signum, code):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    common = ["--data", "shapes", "--steps", "7", "--keep-checkpoints", "0"]
    assert run([*common, "--out", str(straight)]) == 0
    with monkeypatch.context() as m:
        interrupt_at_item(m, 3 * 4 + 1, lambda: os.kill(os.getpid(), signum))  # during batch 4
        assert run([*common, "--out", str(stopped), "--auto-resume"]) == code
    summary = summary_of(stopped)
    assert summary["status"] == "interrupted" and summary["steps"] == 4
    assert (stopped / "checkpoints" / "step_0000004.pt").exists()
    assert run([*common, "--out", str(stopped), "--auto-resume"]) == 0
    a = final_state(straight / "checkpoints" / "step_0000007.pt")
    b = final_state(stopped / "checkpoints" / "step_0000007.pt")
    assert_same_tensors(a["modules"], b["modules"], "modules")
    assert_same_tensors(a["optimizers"], b["optimizers"], "optimizers")


def test_second_ctrl_c_stops_at_once(tmp_path, monkeypatch, capsys):
    def twice():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)

    interrupt_at_item(monkeypatch, 3 * 4 + 1, twice)
    out = tmp_path / "run"
    assert run(["--data", "shapes", "--steps", "10", "--out", str(out)]) == 130
    summary = summary_of(out)
    # Stopped while fetching batch 4, before it counted: step 3 is a clean boundary, so it is saved.
    assert summary["status"] == "interrupted" and summary["steps"] == 3
    assert (out / "checkpoints" / "step_0000003.pt").exists()
    assert "DCGAN run summary (interrupted)" in capsys.readouterr().out


def test_ctrl_c_in_a_terminal_stops_cleanly_with_loader_workers(tmp_path):
    """SIGINT to the whole process group, as a terminal sends it: loader workers get it too."""
    command = [sys.executable, str(REPO / "examples" / "dcgan.py"), *TINY, "--workers", "1", "--steps", "100000",
               "--log-every", "1", "--out", str(tmp_path / "run")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, cwd=tmp_path)
    try:
        for line in process.stdout:
            if line.startswith("step 3"):
                os.killpg(process.pid, signal.SIGINT)
                break
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err
    assert "Traceback" not in err and "DCGAN run summary (interrupted)" in out
    steps = summary_of(tmp_path / "run")["steps"]
    assert (tmp_path / "run" / "checkpoints" / f"step_{steps:07d}.pt").exists()


def test_the_minimal_example_trains_and_saves(tmp_path):
    """examples/dcgan/minimal.py, run as a file: a few steps on the embedded data, then a checkpoint and samples."""
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, str(REPO / "examples" / "dcgan" / "minimal.py"), "--device", "cpu",
                             "--precision", "32-true", "--steps", "2", "--batch-size", "4", "--out", str(out)],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (out / "step_0000002.pt").is_file() and (out / "samples" / "last.png").is_file()
    assert "2 steps on cpu (32-true)" in result.stdout


@pytest.mark.parametrize(("argv", "needle"), [(["--device", "nosuchdevice"], "nosuchdevice"),
                                              (["--device", "cpu", "--steps", "0"], "max_steps")])
def test_the_minimal_example_reports_bad_input_in_one_line(tmp_path, argv, needle):
    result = subprocess.run([sys.executable, str(REPO / "examples" / "dcgan" / "minimal.py"), *argv,
                             "--out", str(tmp_path / "run")], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("minimal.py: error: ") and needle in lines[0], lines[0]


def test_the_training_script_also_runs_as_a_file_in_its_folder(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "examples" / "dcgan" / "train.py"), "--help"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "--price-per-hour" in result.stdout and "naive-64" in result.stdout


def test_cache_only_builds_and_exits(tmp_path, capsys):
    folder = tmp_path / "images"
    write_images(folder, 4)
    assert run(["--data", str(folder), "--cache-dir", str(tmp_path / "cache"), "--cache-only"]) == 0
    assert "decoded 4 image files" in capsys.readouterr().out
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 1


def test_no_cache_hands_the_folder_to_the_plugin_loader_which_skips_unreadable_files(tmp_path, caplog):
    folder, out = tmp_path / "images", tmp_path / "run"
    write_images(folder, 8, classes=False)
    (folder / "broken.jpg").write_bytes(b"not a jpeg at all")
    with caplog.at_level("WARNING", logger="devplug.core.data.torch_loader"):
        assert run(["--data", str(folder), "--no-cache", "--workers", "0", "--batch-size", "9", "--steps", "2",
                    "--out", str(out)]) == 0
    summary = summary_of(out)
    assert summary["cache"] is None and summary["image_files_decoded_every_epoch"]
    assert any("broken.jpg" in r.getMessage() for r in caplog.records)


def test_help_documents_every_flag():
    parser = cli.build_parser()
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert action.help and len(action.help) > 15, f"{action.option_strings} is undocumented"
    text = parser.format_help()
    for flag in ("--steps", "--epochs", "--batch-size", "--lr", "--beta1", "--seed", "--precision", "--log-every",
                 "--compile", "--workers", "--device", "--model", "--data", "--resume", "--out", "--sample-every",
                 "--save-every", "--price-per-hour", "--cache-dir", "--nz", "--ngf", "--ndf", "--image-size"):
        assert flag in text


def test_example_has_no_device_branch_and_no_vendor_import():
    import ast

    files = [REPO / "examples" / "dcgan.py", *sorted((REPO / "examples" / "dcgan").rglob("*.py"))]
    vendor = ("habana_frameworks", "apex", "nvidia", "dali", "habana")
    for path in files:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith(vendor) for a in node.names), path
            elif isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith(vendor), path
            elif isinstance(node, ast.Attribute):
                assert node.attr not in ("cuda", "hpu", "mps", "xpu"), f"{path}: .{node.attr}"
            elif isinstance(node, ast.Compare):
                for constant in ast.walk(node):
                    if isinstance(constant, ast.Constant) and isinstance(constant.value, str):
                        assert constant.value not in ("cuda", "hpu", "cpu", "mps", "xpu"), f"{path}: device branch"
