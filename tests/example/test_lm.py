"""The language-model example (examples/lm/): it learns, reports held-out perplexity, refuses bad input in one
line, resumes bitwise, shards on one process and on two ranks, and consolidates sharded weights."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from dist_scripts.common import REPO, clean_env, run_ranks

from devplug.core.checkpoint.sharded import is_sharded_checkpoint

from lm import cli, corpus
from lm import train as example  # examples/lm/train.py
from lm.models import LanguageModel, ModelSpec

TINY = ["--device", "cpu", "--precision", "32-true", "--workers", "0", "--width", "32", "--layers", "1",
        "--heads", "2", "--context", "16", "--batch-size", "8", "--corpus-mb", "0.5", "--eval-batches", "4",
        "--sample-bytes", "8", "--keep-checkpoints", "0"]
TINY_SPEC = ModelSpec(width=32, layers=1, heads=2, context=16)


def run(*argv: str) -> int:
    return example.main([*TINY, *argv])


def summary_of(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_a_tiny_run_learns_and_reports_held_out_perplexity(tmp_path, capsys):
    out = tmp_path / "run"
    assert run("--steps", "30", "--lr", "1e-2", "--min-lr", "1e-3", "--warmup", "5", "--eval-every", "15",
               "--log-every", "10", "--out", str(out)) == 0
    printed = capsys.readouterr().out
    evals = [float(x) for x in re.findall(r"eval at step \d+: held-out loss ([\d.]+), perplexity", printed)]
    assert len(evals) == 3  # before the first step, at step 15, at the end
    summary = summary_of(out)
    assert summary["first_eval_loss"] == pytest.approx(evals[0], abs=1e-3) and evals[0] > 5.0  # ~ln 256: knows nothing
    assert summary["final_eval_loss"] < summary["first_eval_loss"] - 1.0  # learned the bytes of Python source
    assert summary["final_eval_perplexity"] == pytest.approx(2.718281828 ** summary["final_eval_loss"], rel=1e-6)
    assert summary["steps"] == 30 and summary["tokens_this_run"] == 30 * 8 * 16 and summary["tokens_per_sec"] > 0
    assert summary["strategy"] == "none" and summary["optimizer"].startswith("torch.optim.AdamW")
    # FLOPs per token as counted on one step: 6 per weight of the 12·width² block and the 256·width head, plus
    # the attention scores (torch counts the causal product in full)
    width, context = 32, 16
    assert summary["flops_per_token"] == pytest.approx(6 * (12 * width * width + 256 * width)
                                                       + 12 * context * width, rel=0.05)
    assert summary["mfu"] == pytest.approx(summary["flops_per_token"] * summary["tokens_per_sec"]
                                           / summary["peak_flops"]) and summary["peak_source"]
    assert "MFU " in printed
    assert "step 30/30  loss" in printed and "LM run summary" in printed and "perplexity" in printed
    assert summary["sample"][:4] == "def " and (out / "checkpoints" / "step_0000030.pt").is_file()


@pytest.mark.parametrize(("argv", "expected"), [
    (["--context", "0"], "--context: must be a positive integer, got 0"),
    (["--strategy", "bogus"], "--strategy: invalid choice: 'bogus'"),
    (["--auto-resume"], "--auto-resume needs --out"),
    (["--width", "30", "--heads", "4"], "--width 30 is not a multiple of --heads 4"),
    (["--min-lr", "1", "--lr", "0.1"], "--min-lr 1 is above --lr 0.1"),
    (["--resume", "/nonexistent/ckpt"], "checkpoint '/nonexistent/ckpt' does not exist"),
    (["--precision", "fp8-mixed"], "precision 'fp8-mixed' needs fp8 matrix units, which this CPU lacks"),
])
def test_bad_input_is_one_line_and_status_2(tmp_path, capsys, argv, expected):
    try:
        code = run(*argv)
    except SystemExit as exc:  # argparse's own checks exit through the parser
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("lm: error: ") and expected in err, err
    assert not list(tmp_path.iterdir())


#: Another process takes a folder's lock at once, or fails (BlockingIOError) while someone holds it.
TAKE_FOLDER_LOCK = ("import fcntl, os, sys; "
                    "fcntl.flock(os.open(sys.argv[1], os.O_RDONLY), fcntl.LOCK_EX | fcntl.LOCK_NB)")


def test_a_run_stopped_by_bad_input_lets_go_of_its_folder(tmp_path, capsys):
    """The Trainer was made before the data check failed: its run lock on the folder is let go when main returns
    (another job, started while this process lives on, may write there), not when this process ends."""
    out = tmp_path / "run"
    assert run("--batch-size", "100000", "--out", str(out)) == 2
    assert "fewer than one step's" in capsys.readouterr().err
    probe = subprocess.run([sys.executable, "-c", TAKE_FOLDER_LOCK, str(out / "checkpoints")], capture_output=True,
                           text=True)
    assert probe.returncode == 0, probe.stderr


def test_device_options_are_parsed_as_json_where_they_parse_and_repeat():
    args = cli.parse(["--device-option", "fp8_recipe=rowwise", "--device-option", "fp8_all_gather=false",
                      "--device-option", "fp8_skip=[\"head\"]", "--device-option", "n=3",
                      "--device-option", "text=\"3\"", "--device-option", "url=a=b"])
    assert cli.device_options(args.device_options) == {
        "fp8_recipe": "rowwise", "fp8_all_gather": False, "fp8_skip": ["head"], "n": 3, "text": "3", "url": "a=b"}
    assert cli.device_options(cli.parse([]).device_options) == {}


@pytest.mark.parametrize("bad", ["fp8", "=true"])
def test_a_device_option_without_key_and_value_is_one_line_and_status_2(tmp_path, capsys, bad):
    with pytest.raises(SystemExit) as caught:
        run("--device-option", bad, "--out", str(tmp_path / "run"))
    err = capsys.readouterr().err
    assert caught.value.code == 2
    assert err.count("\n") == 1 and err.startswith("lm: error: argument --device-option: expected KEY=VALUE"), err
    assert not list(tmp_path.iterdir())


def test_a_device_option_reaches_the_device_plugin(tmp_path, capsys):
    # the CPU plugin refuses fp8-mixed unless its device option fp8=emulate asks for torchao's emulation
    pytest.importorskip("torchao")
    out = tmp_path / "run"
    assert run("--precision", "fp8-mixed", "--device-option", "fp8=emulate", "--steps", "2", "--eval-every", "0",
               "--sample-bytes", "0", "--out", str(out)) == 0
    summary = summary_of(out)
    assert summary["precision"] == "fp8-mixed" and "emulated on the CPU" in summary["precision_detail"]


def test_the_corpus_is_deterministic_and_holds_out_whole_files():
    first, again = corpus.load_corpus(200_000), corpus.load_corpus(200_000)
    assert torch.equal(first.train, again.train) and torch.equal(first.eval, again.eval)
    assert len(first.train) + len(first.eval) <= 200_000 and first.eval_files and first.train_files
    files = corpus.library_files(first.root)
    held_out = [f for f in files if corpus.is_eval_file(f)]
    assert 0.05 < len(held_out) / len(files) < 0.15
    some = next(f for f in held_out if 2000 < (first.root / f).stat().st_size < 20_000)
    text = (first.root / some).read_bytes()[:2000]
    assert text not in bytes(corpus.load_corpus(50_000_000).train.tolist())  # never in the training text


@pytest.mark.parametrize(("length", "starts"), [(17, [0]), (33, [0, 16]), (40, [0, 16])])
def test_the_training_windows_tile_the_text_up_to_its_last_byte(length, starts):
    """Windows of context + 1 bytes every context bytes: the last one may end on the text's last byte."""
    text = torch.arange(length, dtype=torch.uint8)
    windows = corpus.Windows.tiling(text, 16)
    assert windows.starts.tolist() == starts
    assert all(len(windows[i]) == 17 for i in range(len(windows)))


def interrupt_at_window(monkeypatch, window: int, signum: int) -> None:
    """Send ``signum`` to this process when the training loader fetches its ``window``-th window."""
    calls = {"n": 0}
    original = corpus.Windows.__getitem__

    def fetching(self, index):
        if self.starts is not None and len(self.starts) > 1000:  # the training windows, not the held-out ones
            calls["n"] += 1
            if calls["n"] == window:
                os.kill(os.getpid(), signum)
        return original(self, index)

    monkeypatch.setattr(corpus.Windows, "__getitem__", fetching)


def final_state(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_same(left, right, where: str) -> None:
    if isinstance(left, torch.Tensor):
        assert torch.equal(left, right), where
    elif isinstance(left, dict):
        assert left.keys() == right.keys(), where
        for key in left:
            assert_same(left[key], right[key], f"{where}.{key}")
    elif isinstance(left, (list, tuple)):
        for index, (a, b) in enumerate(zip(left, right, strict=True)):
            assert_same(a, b, f"{where}[{index}]")
    else:
        assert left == right, where


def test_a_run_stopped_by_sigterm_and_auto_resumed_ends_bitwise_equal(tmp_path, monkeypatch, capsys):
    common = ["--steps", "7", "--accumulate", "2", "--eval-every", "3", "--save-every", "100", "--sample-bytes", "0"]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert run(*common, "--out", str(straight)) == 0
    with monkeypatch.context() as m:
        interrupt_at_window(m, 3 * 2 * 8 + 1, signal.SIGTERM)  # during step 4's first micro-batch
        assert run(*common, "--out", str(stopped), "--auto-resume") == 143
    assert summary_of(stopped)["status"] == "interrupted" and summary_of(stopped)["steps"] == 4
    capsys.readouterr()
    assert run(*common, "--out", str(stopped), "--auto-resume") == 0
    assert "resumed from" in capsys.readouterr().out
    a = final_state(straight / "checkpoints" / "step_0000007.pt")
    b = final_state(stopped / "checkpoints" / "step_0000007.pt")
    assert_same(a["modules"], b["modules"], "modules")
    assert_same(a["optimizers"], b["optimizers"], "optimizers")
    assert summary_of(stopped)["final_eval_loss"] == summary_of(straight)["final_eval_loss"]
    assert summary_of(stopped)["first_eval_loss"] == summary_of(straight)["first_eval_loss"]  # kept in the checkpoint


def test_sharded_on_one_process_consolidates_and_resumes_without_sharding(tmp_path, capsys):
    out, weights = tmp_path / "run", tmp_path / "lm.pt"
    script = [sys.executable, str(REPO / "examples" / "lm.py"), *TINY, "--steps", "4", "--eval-every", "0"]
    first = subprocess.run([*script, "--strategy", "fsdp", "--out", str(out), "--consolidate", str(weights)],
                           cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "strategy fsdp" in first.stdout and "lm: sharding: " in first.stdout
    assert is_sharded_checkpoint(out / "checkpoints" / "step_0000004.pt")
    model = LanguageModel(TINY_SPEC)
    model.load_state_dict(torch.load(weights, weights_only=True))  # one plain file, every weight
    assert run("--steps", "6", "--eval-every", "0", "--strategy", "auto", "--out", str(out), "--auto-resume") == 0
    printed = capsys.readouterr().out
    assert "strategy none" in printed and "resumed from" in printed and "at step 4" in printed
    assert summary_of(out)["steps"] == 6 and summary_of(out)["tokens_this_run"] == 2 * 8 * 16


@pytest.mark.slow
def test_compile_learns_the_eager_curve_and_the_summary_names_the_backend(tmp_path, capsys):
    curves = {}
    for flags in ([], ["--compile"]):
        out = tmp_path / ("compiled" if flags else "eager")
        assert run("--steps", "5", "--log-every", "1", "--eval-every", "0", "--sample-bytes", "0", "--out", str(out),
                   *flags) == 0
        curves[bool(flags)] = _losses(capsys.readouterr().out)
        compiled = summary_of(out)["compiled"]
    assert len(curves[True]) == 5 and curves[True] == pytest.approx(curves[False], rel=1e-4)
    assert compiled == "compiled whole with inductor"


def test_help_documents_every_flag():
    parser = cli.build_parser()
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert action.help and len(action.help) > 15, f"{action.option_strings} is undocumented"
    text = parser.format_help()
    for flag in ("--device", "--precision", "--strategy", "--steps", "--batch-size", "--context", "--width",
                 "--layers", "--heads", "--lr", "--warmup", "--min-lr", "--accumulate", "--clip", "--eval-every",
                 "--eval-batches", "--out", "--save-every", "--auto-resume", "--resume", "--recompute",
                 "--consolidate", "--seed", "--compile", "--device-option"):
        assert flag in text


# ---- two ranks (gloo) ----------------------------------------------------------------------------------

RANKS = [*TINY, "--steps", "6", "--log-every", "1", "--eval-every", "3", "--sample-bytes", "0"]


def _losses(stdout: str) -> list[float]:
    return [float(x) for x in re.findall(r"^step \d+/\d+  loss ([\d.]+)", stdout, re.MULTILINE)]


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm") / "fsdp"
    ranks = run_ranks(REPO / "examples" / "lm.py", [*RANKS, "--strategy", "fsdp", "--save-every", "3",
                                                     "--out", str(out)], timeout=600)
    return out, ranks[0].stdout


@pytest.mark.slow
def test_fsdp_and_ddp_on_two_ranks_learn_the_same_curve(fsdp_run, tmp_path):
    # fp32 on the same data and the same initial weights: the runs differ only in how the gradient is
    # reduced (DDP all-reduces whole buckets, FSDP reduce-scatters shards), i.e. in the order of float
    # additions: ~1e-7 relative per step. Losses are printed to 3 decimals, so they agree to one unit of
    # the last place; the held-out loss (full precision) to 1e-4, a thousandth of what one step changes it.
    out, fsdp_stdout = fsdp_run
    ddp = run_ranks(REPO / "examples" / "lm.py", [*RANKS, "--strategy", "ddp", "--out", str(tmp_path / "ddp")],
                    timeout=600)[0].stdout
    assert "strategy ddp over 2 processes" in ddp and "strategy fsdp over 2 processes" in fsdp_stdout
    fsdp_losses, ddp_losses = _losses(fsdp_stdout), _losses(ddp)
    assert len(fsdp_losses) == len(ddp_losses) == 6
    assert max(abs(a - b) for a, b in zip(fsdp_losses, ddp_losses, strict=True)) <= 1.5e-3
    assert fsdp_losses[-1] < fsdp_losses[0]
    assert summary_of(out)["final_eval_loss"] == pytest.approx(summary_of(tmp_path / "ddp")["final_eval_loss"],
                                                               rel=1e-4)


@pytest.mark.slow
def test_the_two_rank_fsdp_checkpoint_is_a_sharded_folder_that_resumes_exactly(fsdp_run, tmp_path):
    out, _stdout = fsdp_run
    middle = out / "checkpoints" / "step_0000003.pt"
    assert is_sharded_checkpoint(middle) and is_sharded_checkpoint(out / "checkpoints" / "step_0000006.pt")
    resumed = run_ranks(REPO / "examples" / "lm.py", [*RANKS, "--strategy", "fsdp", "--resume", str(middle),
                                                      "--out", str(tmp_path / "resumed")], timeout=600)[0].stdout
    assert "at step 3" in resumed and "step 4/6" in resumed and "step 3/6" not in resumed
    assert summary_of(tmp_path / "resumed")["final_eval_loss"] == summary_of(out)["final_eval_loss"]


@pytest.mark.slow
def test_tensor_parallel_on_two_ranks_learns_one_process_curve_and_held_out_loss(tmp_path, capsys):
    # both tensor-parallel ranks read the same batches, so one process on the same flags is the reference;
    # the held-out loss is summed over the ranks and must count each window once
    tp = run_ranks(REPO / "examples" / "lm.py", [*RANKS, "--strategy", "tp", "--out", str(tmp_path / "tp"),
                                                 "--consolidate", str(tmp_path / "tp.pt")], timeout=600)[0].stdout
    assert "strategy tp over 2 processes" in tp and "MLP split across 2 rank(s)" in tp
    assert example.main([*RANKS, "--out", str(tmp_path / "one")]) == 0
    one = capsys.readouterr().out
    tp_losses, one_losses = _losses(tp), _losses(one)
    assert len(tp_losses) == len(one_losses) == 6
    assert max(abs(a - b) for a, b in zip(tp_losses, one_losses, strict=True)) <= 1.5e-3
    assert summary_of(tmp_path / "tp")["final_eval_loss"] == pytest.approx(
        summary_of(tmp_path / "one")["final_eval_loss"], rel=1e-4)
    assert is_sharded_checkpoint(tmp_path / "tp" / "checkpoints" / "step_0000006.pt")
    weights = torch.load(tmp_path / "tp.pt", weights_only=True)  # the split MLP gathered into one plain file
    LanguageModel(TINY_SPEC).load_state_dict(weights)
    assert type(weights["blocks.0.mlp.0.weight"]) is torch.Tensor


def test_the_example_has_no_device_branch_and_no_vendor_import():
    import ast

    vendor = ("habana_frameworks", "apex", "nvidia", "dali", "habana")
    for path in [REPO / "examples" / "lm.py", *sorted((REPO / "examples" / "lm").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith(vendor) for a in node.names), path
            elif isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith((*vendor, "devplug.core", "devplug.plugins")), path
            elif isinstance(node, ast.Attribute):
                assert node.attr not in ("cuda", "hpu", "mps", "xpu"), f"{path}: .{node.attr}"
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value not in ("cuda", "hpu", "cpu", "mps", "xpu"), f"{path}: device branch"


@pytest.mark.parametrize(("flag", "expected"), [([], None), (["--pin-memory"], True), (["--no-pin-memory"], False)])
def test_pinning_is_the_plugins_choice_unless_the_command_line_says(flag, expected):
    assert cli.parse(flag).pin_memory is expected
