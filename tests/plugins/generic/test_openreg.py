"""The generic plugin on a real out-of-tree device: openreg, a PrivateUse1 backend built from C++ for the tests.

The backend (``tests/standins/openreg``) is built once per session and cached between runs; each test
runs its code in a child process (a process can register one PrivateUse1 backend, and it then becomes
torch's accelerator for the rest of the process); the examples and the whole kit are also marked slow.
Variants of the backend drive the failure tests: no pinned-memory allocator (pinning crashes the
process), operators without a kernel, no autocast kernels.
"""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import pytest
import torch
from openreg_scripts import AUTO, CROSS_DEVICE_RESUME, LOADER, MLP_LOSSES, PRECISION, SAVE_ON_DEVICE

from devplug.plugins.generic.trial import ITEMS

pytestmark = pytest.mark.accelerator

NO_HOST_ALLOCATOR = {"DEVPLUG_OPENREG_NO_HOST_ALLOCATOR": "1"}
NO_LINEAR = {"DEVPLUG_OPENREG_MISSING": "addmm,mm"}
NO_AUTOCAST = {"DEVPLUG_OPENREG_NO_AUTOCAST": "1"}
FP16_AUTOCAST_ONLY = {"DEVPLUG_OPENREG_AMP_DTYPES": "float16"}
NO_NORMS = {"DEVPLUG_OPENREG_MISSING": "_foreach_norm,linalg_vector_norm"}


def ok(done) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_backend_is_a_real_privateuse1_device_torch_accelerator_reports(openreg):
    out = ok(openreg.python(
        "import torch; x = torch.arange(6.0, device='openreg').view(2, 3); y = (x @ x.T).cpu();"
        "print(torch._C._get_privateuse1_backend_name(), torch.accelerator.current_accelerator(),"
        " torch.accelerator.device_count(), y.tolist(), torch.openreg.memory_allocated() > 0)"))
    assert out.split()[:3] == ["openreg", "openreg", "1"]
    assert "[[5.0, 14.0], [14.0, 50.0]]" in out and out.strip().endswith("True")


def test_the_generic_plugin_lists_and_chooses_it(openreg):
    out = ok(openreg.run(["-m", "devplug", "devices"]))
    row = next(line.split() for line in out.splitlines() if line.startswith("openreg "))
    assert row[2:5] == ["available", "1", "generic"]
    assert "'auto' selects: openreg" in out


@pytest.mark.slow  # the whole kit, or an example end to end, in a child process
def test_devplug_check_passes_on_it(openreg):
    done = openreg.run(["-m", "devplug", "check", "openreg"], timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 failed" in done.stdout and "FAILED" not in done.stdout


def test_a_trainer_mlp_gives_the_cpus_losses(openreg):
    device, cpu = json.loads(ok(openreg.python(MLP_LOSSES)).splitlines()[-1])
    assert device["device"].startswith("openreg") and device["plugin"] == "generic"
    assert len(device["losses"]) == 8
    assert device["losses"] == pytest.approx(cpu["losses"], rel=1e-5, abs=1e-7)


def test_a_checkpoint_moves_device_to_cpu_and_back(openreg, tmp_path):
    result = json.loads(ok(openreg.run(["-c", CROSS_DEVICE_RESUME, str(tmp_path)])).splitlines()[-1])
    assert result["same"]  # the weights saved on the device load on the CPU and back unchanged
    assert len(result["later_cpu"]) == 1  # and train on alike from either
    assert result["later_cpu"] == pytest.approx(result["later_dev"], rel=1e-5)


@pytest.mark.slow  # the whole kit, or an example end to end, in a child process
def test_the_dcgan_example_trains_a_few_steps_on_it(openreg, tmp_path):
    done = openreg.run(["examples/dcgan.py", "--device", "openreg", "--data", "fake", "--steps", "2",
                        "--batch-size", "8", "--log-every", "1", "--no-progress", "--workers", "0",
                        "--out", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache")], timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["device"].startswith("openreg")
    assert (tmp_path / "run" / "checkpoints" / "step_0000002.pt").exists()


LM_SMALL = ["--steps", "3", "--log-every", "1", "--width", "32", "--layers", "1", "--heads", "2", "--context", "16",
            "--batch-size", "4", "--corpus-mb", "0.1", "--eval-every", "0", "--sample-bytes", "0", "--workers", "0"]


@pytest.mark.slow  # the whole kit, or an example end to end, in a child process
def test_the_lm_example_trains_a_few_steps_on_it(openreg, tmp_path):
    done = openreg.run(["examples/lm.py", "--device", "openreg", *LM_SMALL, "--out", str(tmp_path)], timeout=600)
    out = ok(done)
    assert "device         openreg (plugin generic)" in out
    losses = [float(line.split()[3]) for line in out.splitlines() if line.startswith("step ")]
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)


# ---- probe before trusting: the variants ---------------------------------------------------------------
def test_without_a_host_allocator_pinning_crashes_the_process(openreg):
    """The variant is faithful: pinning host memory on it kills the process (what the loaders must avoid)."""
    done = openreg.python("import torch; torch.randn(4).pin_memory()", variant=NO_HOST_ALLOCATOR)
    assert done.returncode == -signal.SIGSEGV


def test_without_a_host_allocator_loaders_do_not_pin(openreg):
    out = ok(openreg.run(["-c", LOADER, "default"], variant=NO_HOST_ALLOCATOR))
    assert "batches [(8, 6), (8, 6)]" in out and "pin_memory=False" in out
    # with workers, where pinning would run on the loader's own thread, the failed trial keeps it off
    out = ok(openreg.run(["-c", LOADER, "default", "2"], variant=NO_HOST_ALLOCATOR))
    assert "workers=2, pin_memory=False" in out


def test_a_working_backend_pins_only_where_the_loader_has_workers(openreg):
    assert "workers=2, pin_memory=True" in ok(openreg.run(["-c", LOADER, "default", "2"]))
    out = ok(openreg.run(["-c", LOADER, "default"]))  # in the main process pinning would only add a copy
    assert "batches [(8, 6), (8, 6)]" in out and "workers=0, pin_memory=False" in out
    assert "workers=0, pin_memory=True" in ok(openreg.run(["-c", LOADER, "on"]))  # the author's word stands


def test_without_a_host_allocator_asking_to_pin_is_one_clear_error(openreg):
    done = openreg.run(["-c", LOADER, "on"], variant=NO_HOST_ALLOCATOR)
    assert done.returncode == 2, done.stdout + done.stderr
    message = done.stdout.strip().splitlines()[-1]
    assert "openreg" in message and "devplug-openreg 0.1.0" in message and "generic plugin" in message
    assert "pin_memory=False" in message


@pytest.mark.slow  # the whole kit, or an example end to end, in a child process
def test_without_a_host_allocator_both_examples_train(openreg, tmp_path):
    ok(openreg.run(["examples/lm.py", "--device", "openreg", *LM_SMALL, "--out", str(tmp_path / "lm")],
                   variant=NO_HOST_ALLOCATOR, timeout=600))
    ok(openreg.run(["examples/dcgan.py", "--device", "openreg", "--data", "fake", "--steps", "1", "--batch-size", "4",
                    "--no-progress", "--workers", "0", "--out", str(tmp_path / "dcgan"),
                    "--cache-dir", str(tmp_path / "cache")], variant=NO_HOST_ALLOCATOR, timeout=600))


def test_auto_passes_over_a_backend_that_cannot_run_a_linear_layer(openreg):
    assert "chose cpu" in ok(openreg.python(AUTO, variant=NO_LINEAR))
    out = ok(openreg.run(["-m", "devplug", "devices"], variant=NO_LINEAR))
    assert "'auto' selects: cpu" in out
    detail = next(line for line in out.splitlines() if line.strip().startswith("openreg:"))
    assert "could not train a Linear layer" in detail and "devplug-openreg 0.1.0" in detail
    assert "generic plugin" in detail and "addmm" in detail


def test_asking_for_a_backend_that_cannot_train_names_it(openreg):
    done = openreg.run(["-c", "import devplug; devplug.Trainer(device='openreg')"], variant=NO_LINEAR)
    assert done.returncode != 0
    assert "could not train a Linear layer" in done.stderr and "devplug-openreg 0.1.0" in done.stderr


def test_mixed_precision_is_refused_where_autocast_cannot_run(openreg, tmp_path):
    done = openreg.run(["-c", PRECISION, "bf16-mixed"], variant=NO_AUTOCAST)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "refused: PrecisionError" in done.stdout and "devplug-openreg 0.1.0" in done.stdout
    assert "32-true" in done.stdout
    assert "plan 32-true" in ok(openreg.run(["-c", PRECISION, "auto"], variant=NO_AUTOCAST))
    # the backend with autocast kernels (tried afresh: another backend build on another machine)
    assert "plan bf16-mixed" in ok(openreg.run(["-c", PRECISION, "bf16-mixed"],
                                               DEVPLUG_CACHE_DIR=str(tmp_path / "other-machine")))


def test_bf16_is_refused_where_torch_turns_autocast_off_for_it(openreg, tmp_path):
    """torch.autocast only warns and casts nothing for a dtype the backend does not list: the trial must see that
    bf16 did not run, not that entering autocast raised nothing."""
    cache = {"DEVPLUG_CACHE_DIR": str(tmp_path / "cache")}
    # a trial kept by a devplug that took entering autocast for working: not trusted, tried again
    (tmp_path / "cache").mkdir()
    old_key = f"openreg|devplug-openreg 0.1.0|torch {torch.__version__}"
    (tmp_path / "cache" / "trials.json").write_text(json.dumps({old_key: dict.fromkeys(ITEMS, "")}))
    done = openreg.run(["-c", PRECISION, "bf16-mixed"], variant=FP16_AUTOCAST_ONLY, **cache)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "refused: PrecisionError" in done.stdout and "bfloat16" in done.stdout
    assert "plan 32-true" in ok(openreg.run(["-c", PRECISION, "auto"], variant=FP16_AUTOCAST_ONLY, **cache))
    assert "plan 16-mixed" in ok(openreg.run(["-c", PRECISION, "16-mixed"], variant=FP16_AUTOCAST_ONLY, **cache))


def test_saving_works_on_a_backend_without_norm_kernels(openreg, tmp_path):
    out = ok(openreg.run(["-c", SAVE_ON_DEVICE, str(tmp_path / "ck.pt")], variant=NO_NORMS))
    assert "saved" in out and (tmp_path / "ck.pt").exists()
    assert "refused:" in out  # and the check still catches NaN, on host copies
    assert not Path(str(tmp_path / "ck.pt") + ".nan").exists()


@pytest.mark.slow  # the whole kit, or an example end to end, in a child process
def test_the_lm_example_can_turn_pinning_off_and_says_why_it_cannot_pin(openreg, tmp_path):
    lm = ["examples/lm.py", "--device", "openreg", *LM_SMALL]
    ok(openreg.run([*lm, "--no-pin-memory", "--out", str(tmp_path / "a")], variant=NO_HOST_ALLOCATOR, timeout=600))
    done = openreg.run([*lm, "--pin-memory", "--out", str(tmp_path / "b")], variant=NO_HOST_ALLOCATOR, timeout=600)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "cannot pin host memory" in done.stderr and "devplug-openreg 0.1.0" in done.stderr
