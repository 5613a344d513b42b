"""MFU and cost: FLOPs of one step counted with FlopCounterMode, peaks from the device plugin, samples per dollar."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_trainer import SyncCounter, make_data, make_model
from torch import nn

import devplug
from devplug.core.observe.flops import measured_matmul_flops
from devplug.core.registry.manager import create_plugin_manager
from devplug.plugins.cuda import peaks as cuda_peaks
from devplug.plugins.hpu import peaks as hpu_peaks

from dcgan.models import PRESETS, Discriminator, Generator  # examples/dcgan/
from dcgan.step import DCGANStep

BATCH = 16


def _conv_flops(model: nn.Module, x: torch.Tensor) -> list[float]:
    """Forward FLOPs of each (transposed) convolution of ``model`` on ``x``, computed from shapes by hand."""
    flops: list[float] = []

    def record(module, inputs, output):
        n, c_in, h_in, w_in = inputs[0].shape
        kh, kw = module.kernel_size
        if isinstance(module, nn.ConvTranspose2d):  # every input pixel scatters a Cout×k×k patch
            flops.append(2.0 * n * c_in * h_in * w_in * module.out_channels * kh * kw)
        else:  # every output pixel gathers a Cin×k×k patch
            _, c_out, h_out, w_out = output.shape
            flops.append(2.0 * n * c_out * h_out * w_out * c_in * kh * kw)

    convs = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d))]
    handles = [m.register_forward_hook(record) for m in convs]
    with torch.no_grad():
        model(x)
    for handle in handles:
        handle.remove()
    return flops


def _dcgan_run(steps: int, **options):
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, seed=0, **options)
    spec = PRESETS["tiny-32"]
    step = DCGANStep(trainer, spec)
    images = torch.rand(BATCH * 8, 3, spec.image_size, spec.image_size) * 2 - 1
    loader = trainer.dataloader(torch.utils.data.TensorDataset(images), batch_size=BATCH, num_workers=0)
    for _ in trainer.epochs(1, max_steps=steps):
        for (real,) in loader:
            trainer.log(**step(real))
    return trainer, spec


def test_the_dcgan_step_count_matches_the_analytic_count():
    trainer, spec = _dcgan_run(3, log_every=100)
    counted = trainer._flops.flops_per_sample * BATCH
    g, d = Generator(spec), Discriminator(spec)
    g_layers = _conv_flops(g, torch.randn(BATCH, spec.nz, 1, 1))
    d_layers = _conv_flops(d, torch.randn(BATCH, 3, spec.image_size, spec.image_size))
    f_g, f_d = sum(g_layers), sum(d_layers)
    # G forward, then backward: weight gradients, input gradients except the first layer's (noise needs none).
    # D: forward on real, on fake.detach(), on fake; weight gradients in both backward passes (3 of them);
    # input gradients: D step (2 passes) without the first layer, G step through all of D into G.
    analytic = (3 * f_g - g_layers[0]) + (9 * f_d - 2 * d_layers[0])
    assert counted == pytest.approx(analytic, rel=0.05)


def test_mfu_on_cpu_with_the_measured_peak_lies_in_0_1_and_cost_is_reported():
    measured_matmul_flops.cache_clear()  # measured in this test's conditions (the figure is cached per process)
    trainer, _ = _dcgan_run(8, log_every=4, price_per_hour=2.5)
    logged = trainer.last_metrics
    assert 0 < logged["mfu"] <= 1, (logged, trainer._flops.peak, trainer._flops.flops_per_sample)
    assert logged["samples_per_dollar"] == pytest.approx(logged["samples_per_sec"] * 3600 / 2.5)
    summary = trainer.summary()
    assert 0 < summary["mfu"] <= 1
    assert summary["samples_per_dollar"] == pytest.approx(summary["samples_per_hour"] / 2.5)
    assert summary["flops_per_sample"] == trainer._flops.flops_per_sample
    assert trainer._flops.peak == measured_matmul_flops("cpu", torch.float32)


def test_counting_adds_no_host_sync_between_log_points(monkeypatch):
    trainer = devplug.Trainer(device="cpu", precision="32-true", log_every=4, progress=False)
    model = trainer.setup(make_model())
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.01)
    loader = trainer.dataloader(make_data(64), batch_size=4, num_workers=0)
    measured_matmul_flops("cpu", torch.float32)  # measured outside the counted loop (cached per process)
    counter = SyncCounter(monkeypatch)
    reads = []
    for _ in trainer.epochs(1, max_steps=8):
        for x, y in loader:
            before = counter.count
            with trainer.autocast():
                loss = nn.functional.mse_loss(model(x), y)
            trainer.backward(loss)
            trainer.step(opt)
            trainer.log(loss=loss)
            reads.append((trainer.global_step, counter.count - before))
    assert [s for s, n in reads if n] == [4, 8]
    forward = 2 * (6 * 16 + 16 * 1)  # Linear(6, 16), Linear(16, 1)
    backward = forward + 2 * 16 * 1  # weight gradients of both; the input gradient of the second only
    assert trainer._flops.flops_per_sample == pytest.approx(forward + backward)


def test_a_loop_that_leaves_the_counted_step_early_leaves_no_counter_behind():
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False)
    model = trainer.setup(make_model())
    loader = trainer.dataloader(make_data(64), batch_size=4, num_workers=0)
    for index, (x, _y) in enumerate(loader):  # no epochs(): the loop itself moves the steps
        model(x)
        if index == 1:  # inside step 2, the counted one
            assert _get_current_dispatch_mode_stack()
            break
    assert not _get_current_dispatch_mode_stack()
    assert trainer._flops.flops_per_sample == pytest.approx(2 * (6 * 16 + 16 * 1))  # the forward pass only


def test_without_counting_or_a_price_nothing_is_claimed():
    trainer, _ = _dcgan_run(4, log_every=2, count_flops=False)
    assert not {"mfu", "flops_per_sample", "samples_per_dollar"} & set(trainer.summary())


def test_gpu_and_gaudi_peaks_come_from_the_published_tables():
    assert cuda_peaks.peak_flops("NVIDIA H100 80GB HBM3", "bf16-mixed") == pytest.approx(989.4e12)
    assert cuda_peaks.peak_flops("NVIDIA H100 PCIe", "16-mixed") == pytest.approx(756e12)
    assert cuda_peaks.peak_flops("NVIDIA A100-SXM4-80GB", "32-true", tf32=True) == pytest.approx(156e12)
    assert cuda_peaks.peak_flops("NVIDIA A100-SXM4-80GB", "32-true", tf32=False) == pytest.approx(19.5e12)
    assert cuda_peaks.peak_flops("Tesla V100-SXM2-16GB", "bf16-mixed") is None  # no BF16 on Volta
    assert cuda_peaks.peak_flops("NVIDIA A10G", "bf16-mixed") is None
    assert cuda_peaks.peak_flops("Some Future GPU", "bf16-mixed") is None
    assert hpu_peaks.peak_flops("GAUDI2", "bf16-mixed") == pytest.approx(432e12)
    assert hpu_peaks.peak_flops("GAUDI3", "hmp") == pytest.approx(1835e12)
    assert hpu_peaks.peak_flops("GAUDI", "bf16-mixed") == pytest.approx(60e12)
    assert hpu_peaks.peak_flops("GAUDI2", "32-true") is None


@pytest.mark.parametrize("price", [0, -1.0, "2", float("inf"), True])
def test_a_bad_price_is_one_clear_line(price):
    with pytest.raises(devplug.ConfigError, match="price_per_hour must be a positive number") as info:
        devplug.Trainer(device="cpu", progress=False, price_per_hour=price)
    assert "\n" not in str(info.value)


def test_an_impossible_mfu_is_not_reported_but_explained(caplog):
    from devplug.core.log_once import forget_logged
    from devplug.core.observe.flops import FlopMeter

    forget_logged()
    meter = FlopMeter(steps_done=lambda: 0, samples_done=lambda: 0, peak=lambda: 1e9)
    meter.flops_per_sample = 1e8
    assert meter.peak == 1e9
    assert meter.figures(5.0, 5.0)["mfu"] == pytest.approx(0.5)
    with caplog.at_level("WARNING", logger="devplug"):
        figures = meter.figures(50.0, 50.0)  # 5 GFLOP/s achieved against a 1 GFLOP/s "peak"
    assert "mfu" not in figures and figures["flops_per_sample"] == 1e8
    assert "MFU not reported" in caplog.text


def test_measuring_the_peak_draws_nothing_from_the_training_rng():
    before = torch.random.get_rng_state()
    measured_matmul_flops("cpu", torch.float32, seconds=0.01)
    assert torch.equal(torch.random.get_rng_state(), before)  # a run's random numbers do not depend on it


class LyingPeak:
    """A neutral plugin that reports ``peak`` as the device's peak FLOP/s."""

    def __init__(self, peak: Any) -> None:
        self.peak = peak

    @devplug.hookimpl(tryfirst=True)
    def devplug_peak_flops(self, device: devplug.Device, precision: str) -> Any:
        return self.peak


@pytest.mark.parametrize("peak", [-4.3e12, 0.0, float("inf"), float("nan"), True])
def test_a_peak_that_is_not_positive_and_finite_is_refused_with_one_warning_and_no_mfu(caplog, peak):
    measured_matmul_flops("cpu", torch.float32)  # the CPU plugin's own peak, which must not stand in for it
    pm = create_plugin_manager(autoload=False, extra_plugins=[("liar", LyingPeak(peak))])
    trainer = devplug.Trainer(device="cpu", precision="32-true", log_every=2, progress=False, plugin_manager=pm)
    model = trainer.setup(make_model())
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.01)
    loader = trainer.dataloader(make_data(64), batch_size=4, num_workers=0)
    with caplog.at_level("WARNING", logger="devplug"):
        for _ in trainer.epochs(1, max_steps=6):
            for x, y in loader:
                trainer.backward(nn.functional.mse_loss(model(x), y))
                trainer.step(opt)
                trainer.log(loss=trainer.global_step)
    assert trainer.global_step == 6
    assert "mfu" not in trainer.last_metrics and "mfu" not in trainer.summary()
    assert trainer._flops.flops_per_sample is not None  # counted; only the peak was refused
    warnings = [r.getMessage() for r in caplog.records if "devplug_peak_flops" in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert warnings[0].startswith("MFU not reported: devplug_peak_flops of plugin 'liar' (registered at run time) "
                                  "returned ")
    if not isinstance(peak, bool):  # a bool is not a float at all: the guard's type check says so
        assert f"returned an unusable peak: {peak!r} is not a positive, finite number of FLOP/s" in warnings[0]


def test_a_positive_finite_peak_is_taken_as_it_is():
    pm = create_plugin_manager(autoload=False, extra_plugins=[("honest", LyingPeak(2.5e12))])
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, plugin_manager=pm)
    assert trainer._flops.peak == 2.5e12
