"""MFU and cost: FLOPs of one step counted with FlopCounterMode, peaks from the device plugin, samples per dollar."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from toys import SyncCounter, make_data, make_model

import devplug
from devplug.core.observe import flops as flops_module
from devplug.core.observe.flops import measured_matmul_flops
from devplug.core.registry.manager import create_plugin_manager
from devplug.plugins.cpu import peaks as cpu_peak
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
    # D: forward on real, on fake.detach(), on fake; weight gradients in the D step's two backward passes only
    # (the G step freezes D); input gradients: D step (2 passes) without the first layer, G step through all of D.
    analytic = (3 * f_g - g_layers[0]) + (8 * f_d - 2 * d_layers[0])
    assert counted == pytest.approx(analytic, rel=0.05)


def test_mfu_on_cpu_with_the_cpu_plugins_peak_lies_in_0_1_and_cost_is_reported():
    trainer, _ = _dcgan_run(8, log_every=4, price_per_hour=2.5)
    logged = trainer.last_metrics
    assert 0 < logged["mfu"] <= 1, (logged, trainer._flops.peak, trainer._flops.flops_per_sample)
    assert logged["samples_per_dollar"] == pytest.approx(logged["samples_per_sec"] * 3600 / 2.5)
    summary = trainer.summary()
    assert 0 < summary["mfu"] <= 1
    assert summary["samples_per_dollar"] == pytest.approx(summary["samples_per_hour"] / 2.5)
    assert summary["flops_per_sample"] == trainer._flops.flops_per_sample
    assert trainer._flops.peak == cpu_peak.peak_flops(torch.float32).value


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
# ---- the peak: computed or cached, never measured on every run --------------------------------------------------
def _toy_run(**options) -> devplug.Trainer:
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_every=2, seed=0, **options)
    model = trainer.setup(make_model())
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.01)
    loader = trainer.dataloader(make_data(64), batch_size=4, num_workers=0)
    for _ in trainer.epochs(1, max_steps=4):
        for x, y in loader:
            with trainer.autocast():
                loss = nn.functional.mse_loss(model(x), y)
            trainer.backward(loss)
            trainer.step(opt)
            trainer.log(loss=loss)
    return trainer


class FakeMeasurement:
    """Stands in for the matmul measurement: counts calls, answers ``figure`` (what a busy or idle host measures)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, figure: float) -> None:
        self.calls, self.figure = 0, figure
        monkeypatch.setattr(flops_module, "measured_matmul_flops", self)

    def __call__(self, device_type: str, dtype: torch.dtype, seconds: float = 0.25) -> float:
        self.calls += 1
        return self.figure


@pytest.fixture
def uncomputable(monkeypatch, empty_peak_cache):
    """A CPU whose peak cannot be computed: the plugin falls back to a measurement cached per machine (none yet)."""
    monkeypatch.setattr(cpu_peak, "computed_peak", lambda dtype: None)


def _expected_peak_here() -> float | None:
    """This machine's nominal FP32 peak from /proc/cpuinfo, worked out independently of the plugin."""
    if not Path("/proc/cpuinfo").exists() or cpu_peak.platform.machine() not in ("x86_64", "AMD64"):
        return None
    text = Path("/proc/cpuinfo").read_text()
    field = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        field[key.strip()] = value.strip()
    flags = set(field["flags"].split())
    zen4_or_older = field["vendor_id"] == "AuthenticAMD" and int(field["cpu family"]) <= 25
    per_cycle = (32 if zen4_or_older else 64) if "avx512f" in flags else 32 if {"avx2", "fma"} <= flags else None
    if "avx512f" in flags and _avx512_fma_units_here() == 1:  # an Intel part with one 512-bit FMA unit
        per_cycle = 32
    freq = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    ghz = int(freq.read_text()) / 1e6 if freq.exists() else float(field["cpu MHz"]) / 1000
    cores = {(b.split("physical id")[1].split("\n")[0], b.split("core id")[1].split("\n")[0])
             for b in text.strip().split("\n\n")
             if int(b.split(":", 1)[1].split("\n")[0]) in os.sched_getaffinity(0)}
    if per_cycle is None:
        return None
    return min(len(cores), torch.get_num_threads()) * ghz * 1e9 * per_cycle


def _avx512_fma_units_here() -> int | None:
    """The plugin's table of Intel's 512-bit FMA units, for this CPU (``None``: not in it)."""
    first = cpu_peak.cpuinfo_records()[0]
    return cpu_peak.avx512_fma_units(first.get("vendor_id", ""), int(first.get("cpu family", "0")),
                                     int(first.get("model", "0")), first.get("model name", ""))


def test_on_this_cpu_mfu_is_the_counted_flops_over_the_computed_nominal_peak(monkeypatch, empty_peak_cache):
    expected = _expected_peak_here()
    if expected is None:
        pytest.skip("no x86 /proc/cpuinfo here")
    measurement = FakeMeasurement(monkeypatch, 1e9)  # a matmul slower than the peak: the computed peak stands
    trainer = _toy_run()
    summary = trainer.summary()
    clock_is_an_upper_bound = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").exists()
    fma_units_unknown = "avx512f" in cpu_peak.cpuinfo_records()[0].get("flags", "").split() and (
        cpu_peak.cpuinfo_records()[0].get("vendor_id") == "GenuineIntel" and _avx512_fma_units_here() is None)
    # A measured matmul checks a clock that is not an upper bound, or counts an Intel part's FMA units.
    expected_calls = 0 if clock_is_an_upper_bound and not fma_units_unknown else 1
    assert summary["peak_source"] == "computed" and measurement.calls == expected_calls
    assert summary["peak_flops"] == pytest.approx(expected, rel=1e-6)
    per_device = summary["samples_per_sec"] / trainer.world_size
    assert summary["mfu"] == pytest.approx(summary["flops_per_sample"] * per_device / expected, rel=1e-6)
    assert trainer.last_metrics["peak_flops"] == pytest.approx(expected, rel=1e-6)


def test_a_busy_host_reports_the_peak_and_mfu_of_an_idle_one(monkeypatch, uncomputable):
    idle_measurement = FakeMeasurement(monkeypatch, 90e9)
    idle = _toy_run()
    busy_measurement = FakeMeasurement(monkeypatch, 30e9)  # what the cores would measure with other work on them
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        busy = _toy_run()
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert idle_measurement.calls == 1 and busy_measurement.calls == 0  # measured once, on the first run
    assert idle.summary()["peak_source"] == busy.summary()["peak_source"] == "measured (cached)"
    assert busy._flops.peak == pytest.approx(idle._flops.peak, rel=0.1)
    rate = 1000.0  # the same achieved rate on both: MFU then differs only through the peak
    assert busy._flops.figures(rate, rate)["mfu"] == pytest.approx(idle._flops.figures(rate, rate)["mfu"], rel=0.1)


def test_the_cache_is_written_once_and_reused(monkeypatch, uncomputable, tmp_path):
    monkeypatch.setenv("DEVPLUG_CACHE_DIR", str(tmp_path / "cache"))
    measurement = FakeMeasurement(monkeypatch, 50e9)
    first = _toy_run()
    cached = json.loads((tmp_path / "cache" / "peaks.json").read_text())
    assert list(cached.values()) == [50e9]
    key = next(iter(cached))
    assert cpu_peak.cpu_model() in key and f"{torch.get_num_threads()} threads" in key
    assert "torch.float32" in key and torch.__version__ in key
    second = _toy_run()
    assert measurement.calls == 1
    assert first._flops.peak == second._flops.peak == 50e9
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["peaks.json"]  # no temporary file left


@pytest.mark.parametrize("damage", ["{not json", "[1, 2]", '{"cpu": "fast"}', ""])
def test_a_damaged_cache_is_ignored_and_rewritten(monkeypatch, uncomputable, tmp_path, damage):
    monkeypatch.setenv("DEVPLUG_CACHE_DIR", str(tmp_path))
    (tmp_path / "peaks.json").write_text(damage)
    measurement = FakeMeasurement(monkeypatch, 40e9)
    trainer = _toy_run()
    assert measurement.calls == 1 and trainer._flops.peak == 40e9
    assert list(json.loads((tmp_path / "peaks.json").read_text()).values()) == [40e9]


def test_without_counting_or_with_the_authors_peak_nothing_is_measured(monkeypatch, uncomputable):
    measurement = FakeMeasurement(monkeypatch, 40e9)
    assert "peak_flops" not in _toy_run(count_flops=False).summary()
    authored = _toy_run(peak_flops=2.5e11).summary()
    assert measurement.calls == 0
    assert authored["peak_flops"] == 2.5e11 and authored["peak_source"] == "author"
    with pytest.raises(devplug.ConfigError, match="peak_flops must be a positive number"):
        devplug.Trainer(device="cpu", progress=False, peak_flops=float("nan"))


class _PeakPlugin:
    def __init__(self, answer):
        self.answer = answer

    @devplug.hookimpl(tryfirst=True)
    def devplug_peak_flops(self, device, precision):
        return self.answer


def _with_peak_plugin(answer):
    pm = devplug.create_plugin_manager(extra_plugins=[("oddpeak", _PeakPlugin(answer))])
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, plugin_manager=pm)
    return trainer


@pytest.mark.parametrize("answer", [0.0, -1e9, float("inf"), float("nan"), devplug.PeakFlops(float("nan"), "plugin")])
def test_an_unusable_peak_from_a_plugin_is_ignored_with_one_line_naming_it(answer, caplog):
    from devplug.core.log_once import forget_logged

    forget_logged()
    trainer = _with_peak_plugin(answer)
    with caplog.at_level("WARNING", logger="devplug"):
        peak = trainer._peak()
    assert peak is None
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "'oddpeak'" in warnings[0] and "\n" not in warnings[0]


def test_a_plain_float_from_a_plugin_still_counts_with_source_plugin():
    peak = _with_peak_plugin(3e11)._peak()
    assert peak == devplug.PeakFlops(3e11, "plugin")


def test_the_cpu_peak_follows_the_number_format_features():
    avx512_bf16 = frozenset({"avx2", "fma", "avx512f", "avx512_bf16"})
    assert cpu_peak.flops_per_cycle(avx512_bf16, torch.bfloat16, 64) == (128.0, "avx512_bf16")
    assert cpu_peak.flops_per_cycle(avx512_bf16 | {"amx_bf16"}, torch.bfloat16, 64) == (1024.0, "amx_bf16")
    assert cpu_peak.flops_per_cycle(frozenset({"avx2", "fma"}), torch.bfloat16, 32) == (
        32.0, "avx2+fma, bf16 at the fp32 rate")
    assert cpu_peak.fp32_flops_per_cycle(frozenset({"avx2", "fma"}), "GenuineIntel", 6) == 32
    assert cpu_peak.fp32_flops_per_cycle(avx512_bf16, "GenuineIntel", 6) == 64
    assert cpu_peak.fp32_flops_per_cycle(avx512_bf16, "AuthenticAMD", 25) == 32  # Zen 4: 256-bit pipes
    assert cpu_peak.fp32_flops_per_cycle(frozenset({"neon"}), "", 0) is None


def test_the_cpu_peak_counts_each_zen_generations_fma_width():
    avx2 = frozenset({"avx", "avx2", "fma"})
    assert cpu_peak.fp32_flops_per_cycle(avx2, "AuthenticAMD", 23, 0x01) == 16  # Zen 1 (Naples): 2 x 128-bit FMA
    assert cpu_peak.fp32_flops_per_cycle(avx2, "AuthenticAMD", 23, 0x31) == 32  # Zen 2 (Rome): 2 x 256-bit FMA
    assert cpu_peak.fp32_flops_per_cycle(avx2, "AuthenticAMD", 23, 0x71) == 32  # Zen 2 (Matisse)
    assert cpu_peak.fp32_flops_per_cycle(avx2, "AuthenticAMD", 23) == 32  # model unknown: never overstate MFU
    assert cpu_peak.fp32_flops_per_cycle(avx2, "AuthenticAMD", 25, 0x01) == 32  # Zen 3 (Milan), this machine
    assert cpu_peak.fp32_flops_per_cycle(avx2, "HygonGenuine", 24, 0x01) == 16  # Hygon Dhyana: Zen 1 core


def test_the_cpu_peak_of_a_zen_2_guest_without_cpufreq(monkeypatch, tmp_path, empty_peak_cache):
    measurement = FakeMeasurement(monkeypatch, 1e9)  # not this host's matmul: the guest's computed peak stands
    info = tmp_path / "cpuinfo"
    info.write_text("".join(f"processor\t: {n}\nvendor_id\t: AuthenticAMD\ncpu family\t: 23\nmodel\t\t: 49\n"
                            f"model name\t: AMD EPYC 7B12\ncpu MHz\t\t: 2249.998\nphysical id\t: 0\n"
                            f"core id\t\t: {n}\nflags\t\t: fpu sse2 avx fma avx2\n\n" for n in range(2)))
    monkeypatch.setattr(cpu_peak, "CPUINFO", info)
    monkeypatch.setattr(cpu_peak, "MAX_FREQ", tmp_path / "absent")
    monkeypatch.setattr(cpu_peak.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(cpu_peak.os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr(cpu_peak.torch, "get_num_threads", lambda: 2)
    cpu_peak.cpuinfo_records.cache_clear()
    try:
        fp32, bf16 = cpu_peak.computed_peak(torch.float32), cpu_peak.computed_peak(torch.bfloat16)
    finally:
        cpu_peak.cpuinfo_records.cache_clear()
    assert fp32 is not None and fp32.value == pytest.approx(2 * 2.249998e9 * 32)
    assert "32 FLOP/cycle (avx2+fma, fp32)" in fp32.detail
    assert bf16 is not None and bf16.value == fp32.value  # no native bf16: no bf16 peak above fp32
    assert measurement.calls == 2  # cpu MHz, a guest's nominal clock, is checked against a matmul in each format


def test_the_counted_step_of_a_compiled_fp8_model_compiles_nothing_and_compiling_resumes_after():
    # Older torch releases (2.11: 6 graphs of torchao's Float8TrainingTensor.__torch_dispatch__ compiled here)
    # trace what the counter's dispatch reaches unless torch.compile is told to stand aside for the step.
    pytest.importorskip("torchao")
    from torch._dynamo.utils import counters

    trainer = devplug.Trainer(device="cpu", precision="fp8-mixed", device_options={"fp8": "emulate"}, compile=True,
                              compile_options={"backend": "aot_eager"}, progress=False, log_every=100)
    model = trainer.setup(nn.Sequential(nn.Linear(64, 192), nn.GELU(), nn.Linear(192, 64)))
    opt = trainer.optimizer("adamw", model.parameters())
    loader = trainer.dataloader(torch.utils.data.TensorDataset(torch.randn(32, 16, 64)), batch_size=8, num_workers=0)
    frames = {}
    for _ in trainer.epochs(1, max_steps=4):
        for (x,) in loader:
            with trainer.autocast():
                loss = model(x).float().square().mean()
            trainer.backward(loss)
            trainer.step(opt)
            frames[trainer.global_step] = counters["frames"]["total"]
    assert trainer._flops.flops_per_sample > 0  # counted, uncompiled
    assert frames[1] == frames[2] == frames[4], frames  # compiled at step 1, nothing more
    before = counters["frames"]["total"]
    torch.compile(lambda t: t * 2 + 1, backend="eager")(torch.ones(3))
    assert counters["frames"]["total"] == before + 1  # the stance from before the counted step is back


def test_close_inside_the_counted_step_ends_the_counter_and_restores_compiling():
    from torch._dynamo.utils import counters
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_every=100)
    model = trainer.setup(nn.Linear(4, 4))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    loader = trainer.dataloader(torch.utils.data.TensorDataset(torch.randn(16, 4)), batch_size=4, num_workers=0)
    batches = iter(loader)
    (x,) = next(batches)  # a loop of the author's own: step 1, then the batch of step 2 (the counted one)
    trainer.backward(model(x).square().mean())
    trainer.step(opt)
    next(batches)
    assert _get_current_dispatch_mode_stack(), "the counted step should be under way"
    trainer.close()
    assert not _get_current_dispatch_mode_stack()
    before = counters["frames"]["total"]
    torch.compile(lambda t: t - 1, backend="eager")(torch.ones(2))
    assert counters["frames"]["total"] == before + 1


def test_a_resumed_run_counts_its_own_second_step_and_reports_mfu(tmp_path):
    # the counted step is the second this process runs: a run resumed past step 2 still gets its MFU
    def run(steps: int, resume: bool) -> devplug.RunSummary:
        trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, loggers=[], log_every=2,
                                  peak_flops=1e12, stop_signals=())
        model = trainer.setup(make_model())
        opt = trainer.optimizer("sgd", model.parameters(), lr=0.01)
        loader = trainer.dataloader(make_data(64), batch_size=4, num_workers=0)
        if resume:
            trainer.load(tmp_path / "ckpt.pt")
        for _ in trainer.epochs(1, max_steps=steps):
            for x, y in loader:
                trainer.backward(nn.functional.mse_loss(model(x), y))
                trainer.step(opt)
                trainer.log(loss=0.0)
        trainer.save(tmp_path / "ckpt.pt")
        trainer.close()
        return trainer.summary()

    first, resumed = run(5, resume=False), run(10, resume=True)
    assert resumed["steps"] == 10
    forward = 2 * (6 * 16 + 16 * 1)  # Linear(6, 16), Linear(16, 1)
    backward = forward + 2 * 16 * 1  # weight gradients of both; the input gradient of the second only
    assert first["flops_per_sample"] == resumed["flops_per_sample"] == pytest.approx(forward + backward)
    assert 0 < resumed["mfu"] <= 1


def test_an_evaluation_paused_inside_the_counted_step_is_not_counted_as_training_flops():
    # evaluating every step, inside trainer.throughput.paused() as documented: its forward passes are not
    # the training step's FLOPs (they would multiply flops_per_sample and MFU)
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, loggers=[], peak_flops=1e12,
                              stop_signals=())
    model = trainer.setup(make_model())
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.01)
    loader = trainer.dataloader(make_data(64), batch_size=4, num_workers=0)
    evaluation = trainer.dataloader(make_data(64), batch_size=4, num_workers=0, train=False)
    for _ in trainer.epochs(1, max_steps=4):
        for x, y in loader:
            trainer.backward(nn.functional.mse_loss(model(x), y))
            trainer.step(opt)
            with trainer.throughput.paused(), torch.no_grad():
                for held_out, _ in evaluation:
                    model(held_out)
    forward = 2 * (6 * 16 + 16 * 1)  # Linear(6, 16), Linear(16, 1)
    backward = forward + 2 * 16 * 1  # weight gradients of both; the input gradient of the second only
    assert trainer.summary()["flops_per_sample"] == pytest.approx(forward + backward)
