"""The model author's view: the Trainer against plain PyTorch, sync-freedom, logging, errors."""

from __future__ import annotations

import pytest
import torch
from toys import SyncCounter, make_data, make_model

import devplug
from devplug.core.errors import ConfigError, DeviceUnavailableError, NonFiniteLossError, UnknownDeviceError
from devplug.core.registry.manager import create_plugin_manager
from devplug.plugins.cpu import plugin as cpu_plugin
from devplug.toolkit import autocast_plan


def test_trainer_matches_plain_pytorch_exactly():
    data = make_data()
    # plain PyTorch, same optimizer implementation the CPU plugin picks
    reference = make_model()
    fused = cpu_plugin.supports_fused("adam")
    opt = torch.optim.Adam(reference.parameters(), lr=1e-2, betas=(0.5, 0.999), **({"fused": True} if fused else {}))
    for x, y in torch.utils.data.DataLoader(data, batch_size=8):
        loss = torch.nn.functional.mse_loss(reference(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False)
    model = trainer.setup(make_model())
    topt = trainer.optimizer("adam", model.parameters(), lr=1e-2, betas=(0.5, 0.999))
    assert trainer.optimizer_implementation(topt) == ("torch.optim.Adam(fused=True)" if fused else "torch.optim.Adam")
    loader = trainer.dataloader(data, batch_size=8, num_workers=0)
    for _epoch in trainer.epochs(1):
        for x, y in loader:
            with trainer.autocast():
                loss = torch.nn.functional.mse_loss(model(x), y)
            trainer.backward(loss)
            trainer.step(topt)
            trainer.log(loss=loss)
    assert trainer.global_step == 6
    for a, b in zip(reference.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_training_step_reads_nothing_back_except_at_log_points(monkeypatch):
    trainer = devplug.Trainer(device="cpu", precision="32-true", log_every=4, progress=False)
    model = trainer.setup(make_model())
    opt = trainer.optimizer("adamw", model.parameters(), lr=1e-3)
    loader = trainer.dataloader(make_data(64), batch_size=4, num_workers=0)
    counter = SyncCounter(monkeypatch)
    reads_per_step = []
    for _ in trainer.epochs(1, max_steps=12):
        for x, y in loader:
            before = counter.count
            with trainer.autocast():
                loss = torch.nn.functional.mse_loss(model(x), y)
            trainer.backward(loss)
            trainer.step(opt)
            reported = trainer.log(loss=loss, mean_output=loss.detach() * 2)
            reads_per_step.append((trainer.global_step, counter.count - before, reported is not None))
    assert [s for s, reads, _ in reads_per_step if reads] == [4, 8, 12]
    assert all(reported == (step % 4 == 0) for step, _, reported in reads_per_step)
    assert set(trainer.last_metrics) >= {"loss", "mean_output", "samples_per_sec"}


def test_logged_values_are_averaged_between_log_points():
    trainer = devplug.Trainer(device="cpu", log_every=3, progress=False)
    trainer.global_step = 1
    assert trainer.log(v=torch.tensor(1.0)) is None
    trainer.global_step = 2
    trainer.log(v=torch.tensor(2.0))
    trainer.global_step = 3
    assert trainer.log(v=6.0)["v"] == pytest.approx(3.0)


def test_nan_loss_raises_clear_error_at_log_point():
    trainer = devplug.Trainer(device="cpu", log_every=1, progress=False)
    trainer.global_step = 1
    with pytest.raises(NonFiniteLossError, match=r"loss=nan at step 1.*Lower the learning rate"):
        trainer.log(loss=torch.tensor(float("nan")))


def test_nan_loss_can_be_downgraded_to_a_warning():
    trainer = devplug.Trainer(device="cpu", log_every=1, progress=False, nonfinite="warn")
    trainer.global_step = 1
    with pytest.warns(RuntimeWarning, match="diverged"):
        trainer.log(loss=torch.tensor(float("inf")))


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"log_every": 0}, "log_every"),
        ({"log_every": "10"}, "log_every"),
        ({"precision": ""}, "precision"),
        ({"nonfinite": "explode"}, "nonfinite"),
        ({"seed": -1}, "seed"),
        ({"bucket_cap_mb": 0}, "bucket_cap_mb"),
        ({"progress": "yes"}, "progress"),
        ({"lr": 0.1}, "lr"),
    ],
)
def test_bad_config_values_name_the_field(options, field):
    with pytest.raises(ConfigError, match=field):
        devplug.Trainer(**options)


def test_unknown_precision_is_a_clear_error():
    with pytest.raises(devplug.PrecisionError, match=r"'fp8-magic'.*32-true"):
        devplug.Trainer(device="cpu", precision="fp8-magic")


def test_unknown_device_lists_known_devices():
    with pytest.raises(UnknownDeviceError, match=r"unknown device 'tpu'; known devices: .*cpu"):
        devplug.Trainer(device="tpu")


def test_unavailable_device_gives_reason_fix_and_alternatives():
    with pytest.raises(DeviceUnavailableError) as info:
        devplug.Trainer(device="cuda:1")
    message = str(info.value)
    assert "'cuda' is not available" in message and "Available devices: cpu" in message


def test_out_of_range_index_is_rejected():
    with pytest.raises(DeviceUnavailableError, match="cpu:3"):
        devplug.Trainer(device="cpu:3")


def test_env_var_picks_default_device(monkeypatch):
    monkeypatch.setenv("DEVPLUG_DEVICE", "tpu")
    with pytest.raises(UnknownDeviceError):
        devplug.Trainer()
    monkeypatch.setenv("DEVPLUG_DEVICE", "cpu")
    assert devplug.Trainer(progress=False).device.name == "cpu"


def test_precision_auto_on_cpu_follows_native_bf16(monkeypatch):
    monkeypatch.setattr(cpu_plugin, "has_native_bf16", lambda: True)
    trainer = devplug.Trainer(device="cpu", precision="auto", progress=False)
    assert trainer.precision.name == "bf16-mixed" and trainer.scaler is None
    with trainer.autocast():
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")
    monkeypatch.setattr(cpu_plugin, "has_native_bf16", lambda: False)
    assert devplug.Trainer(device="cpu", precision="auto", progress=False).precision.name == "32-true"


def test_native_bf16_detection_reads_cpu_flags(monkeypatch):
    cpu_plugin.cpu_flags.cache_clear()
    monkeypatch.setattr(cpu_plugin, "cpu_flags", lambda: frozenset({"avx2", "amx_bf16"}))
    assert cpu_plugin.has_native_bf16()
    monkeypatch.setattr(cpu_plugin, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert not cpu_plugin.has_native_bf16()


@pytest.mark.parametrize(("precision", "native_flags"), [("bf16-mixed", {"avx512_bf16"}),
                                                         ("16-mixed", {"avx512_fp16"})])
def test_reduced_precision_the_cpu_only_emulates_warns_once(monkeypatch, caplog, precision, native_flags):
    from devplug.toolkit import forget_logged

    def warnings_for(flags):
        forget_logged()
        caplog.clear()
        monkeypatch.setattr(cpu_plugin, "cpu_flags", lambda: frozenset({"avx2", "fma", *flags}))
        with caplog.at_level("WARNING", logger="devplug"):
            for _ in range(2):
                assert devplug.Trainer(device="cpu", precision=precision, progress=False).precision.name == precision
        return [r.getMessage() for r in caplog.records if "emulates" in r.getMessage()]

    number_format = "bf16" if precision.startswith("bf16") else "fp16"
    emulated = warnings_for(set())
    assert len(emulated) == 1  # once per process
    assert f"precision={precision!r}: this CPU has no native {number_format} arithmetic" in emulated[0]
    assert "at least 2-3x slower than with precision='32-true'" in emulated[0]
    assert warnings_for(native_flags) == []
    warnings_for(set())
    forget_logged()
    caplog.clear()
    with caplog.at_level("WARNING", logger="devplug"):  # no native format: auto picks 32-true, and says nothing
        assert devplug.Trainer(device="cpu", precision="auto", progress=False).precision.name == "32-true"
    assert not [m for m in caplog.messages if "emulates" in m]


def test_16_mixed_on_cpu_uses_a_grad_scaler_and_trains():
    trainer = devplug.Trainer(device="cpu", precision="16-mixed", progress=False)
    assert trainer.scaler is not None
    model = trainer.setup(make_model())
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = make_data(8).tensors
    initial_scale = trainer.scaler.get_scale()
    for _ in range(20):  # overflowing steps are skipped while the scaler backs off, as on a GPU
        with trainer.autocast():
            loss = torch.nn.functional.mse_loss(model(x), y)
        trainer.backward(loss)
        trainer.step(opt)
    assert trainer.scaler.get_scale() < initial_scale
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())


class Fp16Plan:
    """A neutral plugin whose 16-mixed plan has no grad scaler (with ``reason``: one that says why)."""

    def __init__(self, reason: str = "") -> None:
        self.reason = reason

    @devplug.hookimpl(tryfirst=True)
    def devplug_precision(self, device: devplug.Device, precision: str) -> devplug.PrecisionPlan:
        return devplug.PrecisionPlan(name="16-mixed", autocast=lambda: torch.autocast("cpu", dtype=torch.float16),
                                     no_scaler_reason=self.reason)


def test_a_16_mixed_plan_without_a_grad_scaler_is_refused_naming_the_plugin():
    pm = create_plugin_manager(autoload=False, extra_plugins=[("fp16-plan", Fp16Plan())])
    with pytest.raises(devplug.PluginError) as caught:
        devplug.Trainer(device="cpu", precision="16-mixed", progress=False, plugin_manager=pm)
    message = str(caught.value)
    assert message.startswith("devplug_precision of plugin 'fp16-plan' (registered at run time) raised ValueError: "
                              "a '16-mixed' PrecisionPlan (float16 autocast) has no grad scaler"), message
    assert "no_scaler_reason=" in message and "\n" not in message


def test_a_16_mixed_plan_without_a_scaler_is_accepted_when_it_says_why():
    reason = "the fused optimizer scales the loss itself"
    pm = create_plugin_manager(autoload=False, extra_plugins=[("fp16-plan", Fp16Plan(reason))])
    trainer = devplug.Trainer(device="cpu", precision="16-mixed", progress=False, plugin_manager=pm)
    assert trainer.scaler is None and trainer.precision.no_scaler_reason == reason
    device = trainer.device
    with pytest.raises(ValueError, match="has no grad scaler"):
        autocast_plan(device, "16-mixed", scaler=False)
    assert autocast_plan(device, "16-mixed", scaler=False, no_scaler_reason=reason).scaler is None
    assert autocast_plan(device, "bf16-mixed").scaler is None  # bfloat16 has float32's range: no scaler, no reason


def test_tensorboard_scalars_and_images_are_written(tmp_path):
    trainer = devplug.Trainer(device="cpu", log_dir=str(tmp_path / "tb"), log_every=1, progress=False)
    trainer.global_step = 1
    trainer.log(loss=torch.tensor(0.5))
    trainer.log_images("samples", torch.rand(4, 3, 8, 8) * 2 - 1, nrow=2, path=str(tmp_path / "grid.png"))
    trainer.close()
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert (tmp_path / "grid.png").stat().st_size > 0


def test_loader_read_outside_epochs_yields_every_batch_each_pass():
    trainer = devplug.Trainer(device="cpu", progress=False)
    loader = trainer.dataloader(make_data(16), batch_size=4, num_workers=0)
    assert [sum(1 for _ in loader) for _ in range(3)] == [4, 4, 4]


def test_log_between_log_points_keeps_tensors_detached_and_queues_no_device_work():
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_every=1000)
    weight = torch.ones(1, requires_grad=True)
    loss, plain = (weight * 3).sum().reshape(1), torch.tensor([[2.0]])
    trainer.log(loss=loss, plain=plain, count=4)
    trainer.log(loss=loss * 0 + 1, plain=plain, count=6)
    pending = trainer._reporter.metrics._values
    assert all(not v.requires_grad for v in pending["loss"]) and pending["plain"][0] is plain  # no copy, no op
    assert pending["count"] == [4.0, 6.0]
    with pytest.raises(ValueError, match="must be a scalar"):
        trainer.log(bad=torch.ones(2))
    # no step was taken: the point carries the logged values and no rates
    assert trainer.flush_logs() == pytest.approx({"loss": 2.0, "plain": 2.0, "count": 5.0}, abs=1e-6)


class _PlainHost:
    """A device on the host's torch type whose plugin states no layout preference."""

    @devplug.hookimpl
    def devplug_register_devices(self):
        return devplug.DeviceSpec(name="plainhost", description="host, no preference", priority=-1,
                                  probe=devplug.Availability.yes, torch_type="cpu")


def test_channels_last_auto_takes_the_plugins_preference_and_the_authors_choice_wins():
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
    auto = devplug.Trainer(device="cpu", channels_last="auto", progress=False)
    assert auto.device.channels_last and auto.device.layout_reason.startswith("the cpu plugin's choice: oneDNN")
    model = auto.setup(conv, name="conv")
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert auto.to_device(torch.zeros(2, 3, 8, 8)).is_contiguous(memory_format=torch.channels_last)
    for choice in (False, True):  # the author's word wins, and no reason is claimed for it
        trainer = devplug.Trainer(device="cpu", channels_last=choice, progress=False)
        assert trainer.device.channels_last is choice and trainer.device.layout_reason == ""
    assert not devplug.Trainer(device="cpu", progress=False).device.channels_last  # the default keeps the layout
    pm = create_plugin_manager(autoload=False, extra_plugins=[("plainhost", _PlainHost())])
    plain = devplug.Trainer(device="plainhost", channels_last="auto", progress=False, plugin_manager=pm)
    assert not plain.device.channels_last and plain.device.layout_reason == "the plainhost plugin prefers no other"


def test_a_layout_that_is_not_a_choice_is_one_line_naming_the_field():
    expected = r"channels_last must be True, False or 'auto' \(the device plugin's choice\), got 'yes'"
    with pytest.raises(ConfigError, match=expected):
        devplug.Trainer(channels_last="yes")


def test_close_finishes_the_loggers_and_lets_go_of_the_folder_when_a_background_save_failed(tmp_path, monkeypatch):
    # an asynchronous save that failed is reported by close(); the loggers still get their final point (the
    # summary, TensorBoard's last events, MLflow's end of run) and the checkpoint folder's run lock is released
    import errno
    import os

    from dist_scripts.fsdp_model import Block, lm_loss, make_lm, rank_batch
    from torch.distributed.checkpoint import filesystem

    from devplug.core.checkpoint import runlock

    class Recorder:
        def __init__(self) -> None:
            self.finals = 0

        def devplug_log(self, point) -> None:
            self.finals += point.final

    recorder = Recorder()
    folder = tmp_path / "ckpt"
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, strategy="fsdp", loggers=[recorder],
                              checkpoints=devplug.CheckpointPolicy(directory=folder), stop_signals=())
    model = trainer.setup(make_lm(), name="lm", shard=[Block])
    opt = trainer.optimizer("adamw", model.parameters(), lr=1e-2)
    trainer.backward(lm_loss(model, rank_batch(0, 0, 1)))
    trainer.step(opt)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(filesystem, "_write_item", full)
    trainer.save(folder / "step_0000001.pt", async_save=True)
    with pytest.raises(devplug.CheckpointError, match=r"^the disk is full"):
        trainer.close()
    assert recorder.finals == 1
    assert str(folder.resolve()) not in runlock._HELD


def test_a_trainer_refused_for_its_checkpoint_format_holds_no_folder_and_starts_no_logger(tmp_path):
    # the refusal comes before anything is taken: no run lock left on the folder (another job would be told
    # it is in use for as long as this process lives), no logger run started that never ends
    from devplug.core.checkpoint import runlock

    points = []

    class Recorder:
        def devplug_log(self, point) -> None:
            points.append(point)

    folder = tmp_path / "ckpt"
    with pytest.raises(devplug.ConfigError, match="checkpoint_format='plain' is written by rank 0 alone"):
        devplug.Trainer(device="cpu", precision="32-true", progress=False, stop_signals=(), strategy="fsdp",
                        checkpoint_format="plain", checkpoints=devplug.CheckpointPolicy(directory=folder),
                        loggers=[Recorder()])
    assert str(folder.resolve()) not in runlock._HELD
    assert points == []


def test_a_trainer_whose_logger_cannot_start_lets_go_of_its_checkpoint_folder(tmp_path, monkeypatch):
    # MLflow refuses a local directory unless MLFLOW_ALLOW_FILE_STORE is set: one line, and the folder the
    # refused Trainer had locked is free for the next job at once, not when this process ends
    pytest.importorskip("mlflow")
    from devplug.core.checkpoint import runlock

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    folder = tmp_path / "ckpt"
    with pytest.raises(devplug.ConfigError, match="the mlflow logger cannot start a run"):
        devplug.Trainer(device="cpu", progress=False, stop_signals=(), loggers=["mlflow"], log_dir=tmp_path,
                        checkpoints=devplug.CheckpointPolicy(directory=folder))
    assert str(folder.resolve()) not in runlock._HELD


def test_a_trainer_whose_logger_refuses_the_runs_first_point_lets_go_of_its_checkpoint_folder(tmp_path):
    from devplug.core.checkpoint import runlock

    class Refusing:
        def devplug_log(self, point):
            raise RuntimeError("the tracking server refused the run")

    folder = tmp_path / "ckpt"
    with pytest.raises(RuntimeError, match="refused the run"):
        devplug.Trainer(device="cpu", progress=False, stop_signals=(), loggers=[Refusing()], hparams={"lr": 0.1},
                        checkpoints=devplug.CheckpointPolicy(directory=folder))
    assert str(folder.resolve()) not in runlock._HELD
    devplug.Trainer(device="cpu", progress=False, stop_signals=(), loggers=[],
                    checkpoints=devplug.CheckpointPolicy(directory=folder)).close()  # the next job may use it


@pytest.mark.parametrize("value", [None, "n/a", [1.0, 2.0]])
def test_a_logged_value_that_is_not_a_number_is_one_line_naming_it(value):
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, loggers=[], stop_signals=())
    for name in ("loss", "val_loss"):  # kept until a log point, and written at once
        with pytest.raises(ValueError, match=rf"^logged value '{name}' must be a number or a one-element tensor, "
                                             rf"got {type(value).__name__}"):
            trainer.log(**{name: value})


class PlanThatWantsCompiling:
    """A device-neutral plugin whose precision plan says what training it uncompiled costs (test stand-in)."""

    DEVPLUG_CONTRACT = devplug.CONTRACT_VERSION
    NOTE = "this stand-in plan is slow uncompiled: pass compile=True"

    @devplug.hookimpl
    def devplug_precision(self, precision: str) -> devplug.PrecisionPlan:
        return devplug.PrecisionPlan(name="32-true", description="stand-in plan", uncompiled_note=self.NOTE)


def test_a_plan_that_is_slow_uncompiled_is_said_once_where_the_model_is_not_compiled(caplog, monkeypatch):
    from devplug.core import log_once

    monkeypatch.setattr(log_once, "_logged", set())
    pm = create_plugin_manager(autoload=False, extra_plugins=[("wants-compiling", PlanThatWantsCompiling())])

    def warnings_after_setting_up(**options: object) -> list[str]:
        caplog.clear()
        with caplog.at_level("WARNING", logger="devplug"):
            trainer = devplug.Trainer(device="cpu", progress=False, plugin_manager=pm, **options)
            assert trainer.precision.uncompiled_note == PlanThatWantsCompiling.NOTE
            trainer.setup(torch.nn.Linear(4, 4), name="first")
            trainer.setup(torch.nn.Linear(4, 4), name="second")
            trainer.close()
        return [r.getMessage() for r in caplog.records if r.getMessage() == PlanThatWantsCompiling.NOTE]

    assert warnings_after_setting_up(compile=True) == []  # compiled (lazily: nothing is built here)
    assert warnings_after_setting_up() == [PlanThatWantsCompiling.NOTE]  # once, not once per module


def test_a_plan_says_nothing_about_compiling_unless_it_has_something_to_say():
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False)
    assert trainer.precision.uncompiled_note == ""
    trainer.close()
