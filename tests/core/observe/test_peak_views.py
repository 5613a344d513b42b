"""The two views of MFU: the peak named in one line (value, format, how it was obtained) on every kind of CPU
and GPU, and the achieved fraction of a plain GEMM's rate in the same format, measured once per machine."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
import torch
from toys import train_toy

import devplug
from devplug import toolkit
from devplug.core.observe import flops as flops_module
from devplug.core.observe.flops import FlopMeter
from devplug.plugins.cpu import peaks as cpu_peak
from devplug.plugins.cpu import plugin as cpu_plugin
from devplug.plugins.cuda import peaks as cuda_peaks
from devplug.plugins.cuda import plugin as cuda_plugin

#: name -> (vendor, family, model, model name, cpu MHz, flags, cpuinfo_max_freq in kHz or None)
CPUS = {
    "avx2 only (Haswell)": ("GenuineIntel", 6, 63, "Intel(R) Xeon(R) CPU E5-2680 v3 @ 2.50GHz", 1200.0,
                            "fpu sse2 avx fma avx2", None),
    "avx-512 (Skylake-SP)": ("GenuineIntel", 6, 85, "Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz", 2400.0,
                             "fpu sse2 avx fma avx2 avx512f avx512bw", 3_700_000),
    "avx512_bf16 (Cooper Lake)": ("GenuineIntel", 6, 85, "Intel(R) Xeon(R) Platinum 8380H CPU @ 2.90GHz", 2900.0,
                                  "fpu sse2 avx fma avx2 avx512f avx512_bf16", None),
    "avx512_bf16 (Zen 4)": ("AuthenticAMD", 25, 17, "AMD EPYC 9654 96-Core Processor", 2400.0,
                            "fpu sse2 avx fma avx2 avx512f avx512_bf16", None),
    "amx (Sapphire Rapids)": ("GenuineIntel", 6, 143, "Intel(R) Xeon(R) Platinum 8480+", 2000.0,
                              "fpu sse2 avx fma avx2 avx512f avx512_bf16 avx512_fp16 amx_tile amx_bf16", 3_800_000),
    "avx-512 on one FMA unit (Xeon Silver)": ("GenuineIntel", 6, 85, "Intel(R) Xeon(R) Silver 4114 CPU @ 2.20GHz",
                                              2200.0, "fpu sse2 avx fma avx2 avx512f avx512bw", 3_000_000),
    "avx-512 on one FMA unit (Ice Lake client)": ("GenuineIntel", 6, 126, "Intel(R) Core(TM) i7-1065G7 CPU @ 1.30GHz",
                                                  1300.0, "fpu sse2 avx fma avx2 avx512f avx512bw", 3_900_000),
    "avx-512, FMA units unknown (Ice Lake-SP Silver)": ("GenuineIntel", 6, 106, "Intel(R) Xeon(R) Silver 4314 CPU @ "
                                                        "2.40GHz", 2400.0, "fpu sse2 avx fma avx2 avx512f", 3_400_000),
    "avx-512, FMA units unknown (cloud guest)": ("GenuineIntel", 6, 85, "Intel Xeon Processor (Cascadelake)", 2800.0,
                                                 "fpu sse2 avx fma avx2 avx512f avx512bw", None),
    "avx512_bf16 (Zen 5)": ("AuthenticAMD", 26, 2, "AMD EPYC 9755 128-Core Processor", 2700.0,
                            "fpu sse2 avx fma avx2 avx512f avx512_bf16", None),
    "amx, FMA units unknown (cloud guest)": ("GenuineIntel", 6, 143, "Intel Xeon Processor (SapphireRapids)", 2000.0,
                                             "fpu sse2 avx fma avx2 avx512f avx512_bf16 amx_tile amx_bf16", None),
}

#: name -> the one-line peak of 2 cores in fp32 and in bf16, worked out by hand from the features and clock.
EXPECTED = {
    "avx2 only (Haswell)": (
        "160 GFLOP/s fp32, computed: 2 cores × 2.5 GHz × 32 FLOP/cycle (avx2+fma, fp32)",
        "160 GFLOP/s bf16, computed: 2 cores × 2.5 GHz × 32 FLOP/cycle (avx2+fma, bf16 at the fp32 rate)"),
    "avx-512 (Skylake-SP)": (
        "473.6 GFLOP/s fp32, computed: 2 cores × 3.7 GHz × 64 FLOP/cycle (avx512f, fp32)",
        "473.6 GFLOP/s bf16, computed: 2 cores × 3.7 GHz × 64 FLOP/cycle (avx512f, bf16 at the fp32 rate)"),
    "avx512_bf16 (Cooper Lake)": (
        "371.2 GFLOP/s fp32, computed: 2 cores × 2.9 GHz × 64 FLOP/cycle (avx512f, fp32)",
        "742.4 GFLOP/s bf16, computed: 2 cores × 2.9 GHz × 128 FLOP/cycle (avx512_bf16, bf16)"),
    "avx512_bf16 (Zen 4)": (
        "153.6 GFLOP/s fp32, computed: 2 cores × 2.4 GHz × 32 FLOP/cycle (avx512f on 256-bit pipes, fp32)",
        "307.2 GFLOP/s bf16, computed: 2 cores × 2.4 GHz × 64 FLOP/cycle (avx512_bf16 on 256-bit pipes, bf16)"),
    "amx (Sapphire Rapids)": (
        "486.4 GFLOP/s fp32, computed: 2 cores × 3.8 GHz × 64 FLOP/cycle (avx512f, fp32)",
        "7.782 TFLOP/s bf16, computed: 2 cores × 3.8 GHz × 1024 FLOP/cycle (amx_bf16, bf16)"),
    "avx-512 on one FMA unit (Xeon Silver)": (
        "192 GFLOP/s fp32, computed: 2 cores × 3 GHz × 32 FLOP/cycle (avx512f on one 512-bit FMA unit, fp32)",
        "192 GFLOP/s bf16, computed: 2 cores × 3 GHz × 32 FLOP/cycle (avx512f on one 512-bit FMA unit, bf16 at the "
        "fp32 rate)"),
    "avx-512 on one FMA unit (Ice Lake client)": (
        "249.6 GFLOP/s fp32, computed: 2 cores × 3.9 GHz × 32 FLOP/cycle (avx512f on one 512-bit FMA unit, fp32)",
        "249.6 GFLOP/s bf16, computed: 2 cores × 3.9 GHz × 32 FLOP/cycle (avx512f on one 512-bit FMA unit, bf16 at "
        "the fp32 rate)"),
    # Where the model does not say, two units are counted, and the line says they are assumed (the fake matmul,
    # 1 GFLOP/s, shows nothing); a faster one shows them (see the test below).
    "avx-512, FMA units unknown (Ice Lake-SP Silver)": (
        "435.2 GFLOP/s fp32, computed: 2 cores × 3.4 GHz × 64 FLOP/cycle (avx512f, fp32; two FMA units assumed, one "
        "would halve this peak)",
        "435.2 GFLOP/s bf16, computed: 2 cores × 3.4 GHz × 64 FLOP/cycle (avx512f, bf16 at the fp32 rate; two FMA "
        "units assumed, one would halve this peak)"),
    "avx-512, FMA units unknown (cloud guest)": (
        "358.4 GFLOP/s fp32, computed: 2 cores × 2.8 GHz × 64 FLOP/cycle (avx512f, fp32; two FMA units assumed, one "
        "would halve this peak)",
        "358.4 GFLOP/s bf16, computed: 2 cores × 2.8 GHz × 64 FLOP/cycle (avx512f, bf16 at the fp32 rate; two FMA "
        "units assumed, one would halve this peak)"),
    "avx512_bf16 (Zen 5)": (  # full-width AVX-512 pipes, and no Intel FMA-unit question
        "345.6 GFLOP/s fp32, computed: 2 cores × 2.7 GHz × 64 FLOP/cycle (avx512f, fp32)",
        "691.2 GFLOP/s bf16, computed: 2 cores × 2.7 GHz × 128 FLOP/cycle (avx512_bf16, bf16)"),
    "amx, FMA units unknown (cloud guest)": (  # AMX tiles do not run on the FMA units: bf16 needs no note
        "256 GFLOP/s fp32, computed: 2 cores × 2 GHz × 64 FLOP/cycle (avx512f, fp32; two FMA units assumed, one "
        "would halve this peak)",
        "4.096 TFLOP/s bf16, computed: 2 cores × 2 GHz × 1024 FLOP/cycle (amx_bf16, bf16)"),
}


@pytest.fixture
def fake_cpu(monkeypatch, tmp_path, empty_peak_cache):
    """Make the CPU plugin read a 2-core CPU of the given kind (its /proc/cpuinfo and cpufreq) instead of this one;
    its matmuls, where its clock is checked against one, measure 1 GFLOP/s unless the test says otherwise."""

    def install(kind: str) -> FakeGemm:
        vendor, family, model, name, mhz, flags, max_khz = CPUS[kind]
        info = tmp_path / f"cpuinfo-{family}-{model}"
        info.write_text("".join(
            f"processor\t: {n}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
            f"model name\t: {name}\ncpu MHz\t\t: {mhz}\nphysical id\t: 0\ncore id\t\t: {n}\nflags\t\t: {flags}\n\n"
            for n in range(2)))
        freq = tmp_path / f"max_freq-{family}-{model}"
        if max_khz is not None:
            freq.write_text(f"{max_khz}\n")
        monkeypatch.setattr(cpu_peak, "CPUINFO", info)
        monkeypatch.setattr(cpu_peak, "MAX_FREQ", freq)
        monkeypatch.setattr(cpu_peak.platform, "machine", lambda: "x86_64")
        monkeypatch.setattr(cpu_peak.os, "sched_getaffinity", lambda _pid: {0, 1})
        monkeypatch.setattr(cpu_peak.torch, "get_num_threads", lambda: 2)
        cpu_peak.cpuinfo_records.cache_clear()
        return FakeGemm(monkeypatch, 1e9)

    yield install
    cpu_peak.cpuinfo_records.cache_clear()


def _peak_line(precision: str, number_format: str) -> str | None:
    """The summary's one-line peak for a CPU run in ``precision``, from the CPU plugin's own hook."""
    device = SimpleNamespace(index=None)
    meter = FlopMeter(steps_done=lambda: 0, samples_done=lambda: 0, number_format=number_format,
                      peak=lambda: cpu_plugin.devplug_peak_flops(device, precision))
    return meter.peak_line


@pytest.mark.parametrize("kind", list(CPUS))
def test_every_kind_of_cpu_names_its_peak_and_how_it_was_computed_in_one_line(fake_cpu, kind):
    fake_cpu(kind)
    fp32_line, bf16_line = EXPECTED[kind]
    assert _peak_line("32-true", "fp32") == fp32_line
    assert _peak_line("bf16-mixed", "bf16") == bf16_line
    value, unit = fp32_line.split()[:2]  # the value in the line is the figure MFU divides by
    fp32 = cpu_peak.peak_flops(torch.float32)
    assert fp32.value == pytest.approx(float(value) * {"GFLOP/s": 1e9, "TFLOP/s": 1e12}[unit], rel=1e-3)


def test_a_clock_read_below_the_cores_running_clock_is_raised_to_what_a_measured_matmul_needs(fake_cpu):
    gemm = fake_cpu("avx512_bf16 (Zen 4)")  # a cloud guest: no cpufreq, no GHz in its model name, cpu MHz 2400
    gemm.figure = 400e9  # its bf16 matmul runs faster than 2 cores × 2.4 GHz × 64 FLOP/cycle (307.2 GFLOP/s)
    assert _peak_line("bf16-mixed", "bf16") == (
        "400 GFLOP/s bf16, computed: 2 cores × 3.12 GHz × 64 FLOP/cycle (avx512_bf16 on 256-bit pipes, bf16); that "
        "clock is the least that the bf16 matmul measured here needs (cpu MHz says 2.4 GHz)")
    peak = cpu_peak.peak_flops(torch.bfloat16)
    assert (peak.value, peak.source) == (400e9, "computed")  # the figure MFU divides by
    gemm.figure = 100e9  # slower than the computed peak (or measured while the cores were busy): that peak stays
    assert _peak_line("32-true", "fp32") == EXPECTED["avx512_bf16 (Zen 4)"][0]
    assert gemm.calls == [torch.bfloat16, torch.float32]


def test_a_base_clock_in_the_model_name_is_checked_too_and_cpufreqs_maximum_is_not(fake_cpu):
    gemm = fake_cpu("avx2 only (Haswell)")  # "@ 2.50GHz": the base clock; turbo runs higher
    gemm.figure = 200e9
    assert _peak_line("32-true", "fp32").startswith("200 GFLOP/s fp32, computed: 2 cores × 3.12 GHz × 32 FLOP/cycle")
    assert _peak_line("32-true", "fp32").endswith("(the model name says 2.5 GHz)")
    gemm = fake_cpu("avx-512 (Skylake-SP)")  # cpuinfo_max_freq, 3.7 GHz: no core runs faster, nothing measured
    gemm.figure = 900e9
    assert _peak_line("32-true", "fp32") == EXPECTED["avx-512 (Skylake-SP)"][0] and gemm.calls == []


def test_a_failed_clock_check_is_one_warning_and_keeps_the_computed_peak(fake_cpu, caplog):
    gemm = fake_cpu("avx512_bf16 (Zen 4)")
    gemm.figure = RuntimeError("oneDNN\nhas no kernel")
    with caplog.at_level(logging.WARNING, logger="devplug"):
        assert _peak_line("bf16-mixed", "bf16") == EXPECTED["avx512_bf16 (Zen 4)"][1]
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "oneDNN has no kernel" in warning and "MFU may read high" in warning


@pytest.mark.parametrize(
    ("name", "units"),
    [("Intel(R) Xeon(R) Bronze 3104 CPU @ 1.70GHz", 1), ("Intel(R) Xeon(R) Silver 4216 CPU @ 2.10GHz", 1),
     ("Intel(R) Xeon(R) Gold 5120 CPU @ 2.20GHz", 1), ("Intel(R) Xeon(R) Gold 5218 CPU @ 2.30GHz", 1),
     ("Intel(R) Xeon(R) Gold 5122 CPU @ 3.60GHz", 2), ("Intel(R) Xeon(R) Gold 5222 CPU @ 3.80GHz", 2),
     ("Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz", 2), ("Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz", 2),
     ("Intel(R) Xeon(R) Platinum 8480+", 2), ("Intel(R) Xeon(R) W-2123 CPU @ 3.60GHz", 2),
     ("Intel(R) Core(TM) i9-7900X CPU @ 3.30GHz", 2), ("Intel(R) Core(TM) i9-10980XE CPU @ 3.00GHz", 2),
     ("Intel(R) Xeon(R) Silver 4314 CPU @ 2.40GHz", None), ("Intel(R) Xeon(R) Gold 5318H CPU @ 2.50GHz", None),
     ("Intel(R) Xeon(R) D-2146NT CPU @ 2.30GHz", None), ("Intel(R) Xeon(R) CPU @ 2.20GHz", None),
     ("Intel Xeon Processor (Cascadelake)", None)],
)
def test_intels_avx512_fma_units_come_from_its_published_specifications(name, units):
    assert cpu_peak.avx512_fma_units("GenuineIntel", 6, 85, name) == units


def test_intels_client_cores_have_one_fma_unit_and_amd_is_not_counted_here():
    assert cpu_peak.avx512_fma_units("GenuineIntel", 6, 140, "11th Gen Intel(R) Core(TM) i7-1185G7 @ 3.00GHz") == 1
    assert cpu_peak.avx512_fma_units("GenuineIntel", 6, 167, "Intel(R) Xeon(R) W-1390P @ 3.50GHz") == 1
    assert cpu_peak.avx512_fma_units("AuthenticAMD", 25, 17, "AMD EPYC 9654 96-Core Processor") is None


def test_a_measured_fp32_matmul_beyond_one_fma_units_peak_shows_two(fake_cpu):
    gemm = fake_cpu("avx-512, FMA units unknown (Ice Lake-SP Silver)")  # one unit: 2 × 3.4 GHz × 32 = 217.6 G
    gemm.figure = 300e9  # more than one unit can do at a clock no core exceeds
    fp32_line, bf16_line = EXPECTED["avx-512, FMA units unknown (Ice Lake-SP Silver)"]
    assumed, shown = ("two FMA units assumed, one would halve this peak)",
                      "two FMA units: the fp32 matmul measured here, 300 GFLOP/s, beats one unit's 217.6 GFLOP/s)")
    assert _peak_line("32-true", "fp32") == fp32_line.replace(assumed, shown)
    assert _peak_line("bf16-mixed", "bf16") == bf16_line.replace(assumed, shown)
    assert cpu_peak.peak_flops(torch.float32).value == pytest.approx(2 * 3.4e9 * 64)
    assert gemm.calls == [torch.float32]  # measured once per machine, for either format


def test_a_slower_matmul_leaves_two_fma_units_assumed(fake_cpu):
    gemm = fake_cpu("avx-512, FMA units unknown (Ice Lake-SP Silver)")
    gemm.figure = 200e9  # below one unit's 217.6 GFLOP/s: one unit, or two on a busy host or at an AVX-512 clock
    assert _peak_line("32-true", "fp32") == EXPECTED["avx-512, FMA units unknown (Ice Lake-SP Silver)"][0]
    assert cpu_peak.peak_flops(torch.float32).value == pytest.approx(2 * 3.4e9 * 64)  # MFU never overstated


def test_a_failed_matmul_is_one_warning_and_leaves_two_fma_units_assumed(fake_cpu, caplog):
    gemm = fake_cpu("avx-512, FMA units unknown (Ice Lake-SP Silver)")
    gemm.figure = RuntimeError("no\nkernel")
    with caplog.at_level(logging.WARNING, logger="devplug"):
        assert _peak_line("32-true", "fp32") == EXPECTED["avx-512, FMA units unknown (Ice Lake-SP Silver)"][0]
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "FMA units were not counted" in warning and "no kernel" in warning and "two are assumed" in warning


def test_without_an_upper_bound_of_the_clock_a_matmul_shows_no_fma_units(fake_cpu):
    gemm = fake_cpu("avx-512, FMA units unknown (cloud guest)")  # cpu MHz only: the cores may run faster
    gemm.figure = 300e9  # beats one unit at 2.8 GHz (179.2 G), but one unit at a higher clock could do it too
    assert _peak_line("32-true", "fp32") == EXPECTED["avx-512, FMA units unknown (cloud guest)"][0]
    assert gemm.calls == [torch.float32]  # the clock's check, nothing more


def test_a_one_fma_unit_xeon_without_cpufreq_still_raises_its_clock_to_the_matmuls(fake_cpu, monkeypatch):
    gemm = fake_cpu("avx-512 on one FMA unit (Xeon Silver)")
    monkeypatch.setattr(cpu_peak, "MAX_FREQ", cpu_peak.MAX_FREQ.parent / "absent")  # the model name's 2.2 GHz
    gemm.figure = 160e9  # above 2 cores × 2.2 GHz × 32 (140.8 G): turbo
    assert _peak_line("32-true", "fp32") == (
        "160 GFLOP/s fp32, computed: 2 cores × 2.5 GHz × 32 FLOP/cycle (avx512f on one 512-bit FMA unit, fp32); "
        "that clock is the least that the fp32 matmul measured here needs (the model name says 2.2 GHz)")


def test_a_runs_summary_prints_the_peak_line_and_rates_in_flop_per_second(fake_cpu):
    fake_cpu("amx (Sapphire Rapids)")
    trainer = devplug.Trainer(device="cpu", precision="bf16-mixed", progress=False, seed=0)
    train_toy(trainer, steps=4)
    summary = trainer.summary()
    assert summary["peak"] == EXPECTED["amx (Sapphire Rapids)"][1]
    assert summary["peak_flops"] == pytest.approx(2 * 3.8e9 * 1024) and summary["peak_source"] == "computed"
    per_device = summary["samples_per_sec"] / trainer.world_size
    assert summary["achieved_flops"] == pytest.approx(summary["flops_per_sample"] * per_device)
    assert summary["mfu"] == pytest.approx(summary["achieved_flops"] / summary["peak_flops"])
    lines = str(summary).splitlines()
    assert any(line.split() == ["peak", *EXPECTED["amx (Sapphire Rapids)"][1].split()] for line in lines)
    assert any(line.split() == ["peak_flops", "7.782", "TFLOP/s"] for line in lines), lines
    assert "gemm_flops" not in summary and "gemm_fraction" not in summary  # not measured unless asked for


def test_a_cpu_whose_peak_cannot_be_computed_names_the_measurement(monkeypatch, tmp_path):
    monkeypatch.setenv("DEVPLUG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpu_peak, "computed_peak", lambda dtype: None)
    FakeGemm(monkeypatch, 50e9)
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, seed=0)
    train_toy(trainer, steps=4)
    assert trainer.summary()["peak"] == (f"50 GFLOP/s fp32, measured (cached): best fp32 matmul on "
                                         f"{cpu_peak.cpu_model()}, measured once on this machine")


def test_the_authors_peak_is_named_as_such():
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, seed=0, peak_flops=2.5e11)
    train_toy(trainer, steps=4)
    assert trainer.summary()["peak"] == "250 GFLOP/s fp32, author"


def test_a_gpus_datasheet_peak_names_the_row_and_format(monkeypatch):
    monkeypatch.setattr(cuda_plugin.torch.cuda, "get_device_name", lambda _index=None: "NVIDIA H200")
    peak = cuda_plugin.devplug_peak_flops(SimpleNamespace(index=0), "bf16-mixed")
    assert peak == devplug.PeakFlops(989.4e12, "datasheet",
                                     "NVIDIA's published H200 figure, bf16 dense tensor core (NVIDIA H200)")
    meter = FlopMeter(steps_done=lambda: 0, samples_done=lambda: 0, peak=lambda: peak, number_format="bf16")
    assert meter.peak_line == ("989.4 TFLOP/s bf16, datasheet: NVIDIA's published H200 figure, bf16 dense tensor "
                               "core (NVIDIA H200)")
    assert cuda_peaks.peak_row("NVIDIA H100 80GB HBM3", "32-true", tf32=True) == ("H100", "tf32", 494.7e12)
    assert cuda_peaks.peak_row("NVIDIA H100 80GB HBM3", "32-true", tf32=False) == ("H100", "fp32", 67e12)
    assert cuda_peaks.peak_row("Tesla V100-SXM2-16GB", "32-true", tf32=True) == ("V100-SXM", "fp32", 15.7e12)
    assert cuda_peaks.peak_row("NVIDIA GH200 480GB", "bf16-mixed") == ("GH200", "bf16", 989.4e12)  # not "H200"
    assert "fp32 on the CUDA cores" in cuda_peaks.peak_detail("Tesla V100-SXM2-16GB", "V100-SXM", "fp32")


class FakeGemm:
    """Stands in for the matmul measurement: counts calls and the formats asked for, answers ``figure``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, figure: float | Exception) -> None:
        self.calls: list[torch.dtype] = []
        self.figure = figure
        monkeypatch.setattr(flops_module, "measured_matmul_flops", self)

    def __call__(self, device_type: str, dtype: torch.dtype, seconds: float = 0.25) -> float:
        self.calls.append(dtype)
        if isinstance(self.figure, Exception):
            raise self.figure
        return self.figure


@pytest.fixture
def computed(monkeypatch):
    """A CPU whose peak is computed (on any host), so the only matmul measured is the plain GEMM's."""
    monkeypatch.setattr(cpu_peak, "computed_peak", lambda dtype: devplug.PeakFlops(1e12, "computed", "a test's"))


def test_a_plain_gemms_rate_is_measured_once_per_machine_on_request(monkeypatch, tmp_path, computed):
    monkeypatch.setenv("DEVPLUG_CACHE_DIR", str(tmp_path))
    gemm = FakeGemm(monkeypatch, 80e9)
    default = devplug.Trainer(device="cpu", precision="bf16-mixed", progress=False, seed=0)
    train_toy(default, steps=4)
    assert "gemm_flops" not in default.summary() and gemm.calls == []  # not by default: a run's start stays as fast
    runs = []
    for _ in range(2):
        trainer = devplug.Trainer(device="cpu", precision="bf16-mixed", progress=False, seed=0, measure_gemm=True)
        train_toy(trainer, steps=4)
        runs.append(trainer.summary())
    assert gemm.calls == [torch.bfloat16]  # the run's format, measured once, then read from the cache
    for summary in runs:
        assert summary["gemm_flops"] == 80e9
        assert summary["gemm_fraction"] == pytest.approx(summary["achieved_flops"] / 80e9)
    (key,) = json.loads((tmp_path / "peaks.json").read_text())
    assert "torch.bfloat16" in key and key.startswith("cpu | ")
    assert any(line.split()[:2] == ["gemm_flops", "80"] for line in str(runs[0]).splitlines())


def test_a_failed_gemm_measurement_is_one_warning_and_the_run_goes_on(monkeypatch, tmp_path, caplog, computed):
    monkeypatch.setenv("DEVPLUG_CACHE_DIR", str(tmp_path))
    FakeGemm(monkeypatch, RuntimeError("out of memory\nallocating 768 MiB"))
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, seed=0, measure_gemm=True)
    with caplog.at_level(logging.WARNING, logger="devplug"):
        train_toy(trainer, steps=4)
    summary = trainer.summary()
    assert trainer.global_step == 4 and "gemm_flops" not in summary and "mfu" in summary
    warnings = [r.getMessage() for r in caplog.records if "GEMM" in r.getMessage()]
    assert len(warnings) == 1 and "out of memory allocating 768 MiB" in warnings[0]


def test_measure_gemm_must_be_a_bool():
    with pytest.raises(devplug.ConfigError, match="measure_gemm"):
        devplug.Trainer(device="cpu", progress=False, measure_gemm="yes")


def _fake_matmuls(monkeypatch, rate: float, stall_at: int = 0) -> list[int]:
    """Matmuls that take 2n³/rate seconds, plus a 30 ms wait for a core at size ``stall_at``; returns the sizes."""
    sizes: list[int] = []

    def seconds(a: torch.Tensor, _b: torch.Tensor, _device: torch.device) -> float:
        n = a.shape[0]
        sizes.append(n)
        return 2.0 * n**3 / rate + (0.03 if n == stall_at else 0.0)

    monkeypatch.setattr(flops_module, "matmul_seconds", seconds)
    return sizes


def test_a_core_taken_during_a_small_matmul_does_not_stop_the_measurement_there(monkeypatch):
    sizes = _fake_matmuls(monkeypatch, 100e9, stall_at=256)
    measured = flops_module.timed_matmul_flops("cpu", torch.float32, seconds=0.0)
    assert measured == pytest.approx(100e9)  # not 2·256³ / 30 ms = 1.1 GFLOP/s
    assert max(sizes) == 1024  # the first size whose matmul takes over 20 ms of work


def test_a_rate_that_seems_to_keep_growing_on_a_busy_host_stops_the_search_at_a_tenth_of_a_second(monkeypatch):
    sizes: list[int] = []

    def seconds(a: torch.Tensor, _b: torch.Tensor, _device: torch.device) -> float:  # 1.6x faster each doubling
        n = a.shape[0]
        sizes.append(n)
        return 2.0 * n**3 / (1e9 * 1.6 ** (n.bit_length() - 9))

    monkeypatch.setattr(flops_module, "matmul_seconds", seconds)
    flops_module.timed_matmul_flops("cpu", torch.float32, seconds=0.0)
    assert max(sizes) == 512  # 0.17 s a matmul at 512: not 8192, whose matmul would take 16 minutes here


def test_a_slow_format_is_measured_at_a_small_size(monkeypatch):
    sizes = _fake_matmuls(monkeypatch, 5e9)
    assert flops_module.timed_matmul_flops("cpu", torch.bfloat16, seconds=0.0) == pytest.approx(5e9)
    assert max(sizes) == 512


def test_an_fp32_gemm_measured_with_tf32_allowed_is_cached_apart(monkeypatch, tmp_path):
    monkeypatch.setenv("DEVPLUG_CACHE_DIR", str(tmp_path))
    gemm = FakeGemm(monkeypatch, 30e9)
    before = torch.get_float32_matmul_precision()
    try:
        assert toolkit.plain_gemm_flops("cpu", torch.float32) == 30e9
        torch.set_float32_matmul_precision("high")  # TF32 (or bf16 passes) allowed inside fp32 matmuls
        gemm.figure = 60e9
        assert toolkit.plain_gemm_flops("cpu", torch.float32) == 60e9
    finally:
        torch.set_float32_matmul_precision(before)
    assert toolkit.plain_gemm_flops("cpu", torch.float32) == 30e9 and len(gemm.calls) == 2
    keys = sorted(json.loads((tmp_path / "peaks.json").read_text()))
    assert len(keys) == 2 and keys[1] == keys[0] + " | float32 matmul high"


def test_a_process_measures_again_when_its_threads_or_fp32_matmul_precision_change(monkeypatch):
    def seconds(a: torch.Tensor, _b: torch.Tensor, _device: torch.device) -> float:  # a rate the settings give
        fast = 2 if torch.get_float32_matmul_precision() != "highest" else 1
        return 2.0 * a.shape[0] ** 3 / (10e9 * torch.get_num_threads() * fast)

    monkeypatch.setattr(flops_module, "matmul_seconds", seconds)
    threads, precision = torch.get_num_threads(), torch.get_float32_matmul_precision()
    measured = {}
    try:
        for count, allowed in ((1, "highest"), (2, "highest"), (2, "high"), (1, "highest")):
            torch.set_num_threads(count)
            torch.set_float32_matmul_precision(allowed)
            measured[count, allowed] = flops_module.measured_matmul_flops("cpu", torch.float64, seconds=0.0)
    finally:
        torch.set_num_threads(threads)
        torch.set_float32_matmul_precision(precision)
    assert measured == pytest.approx({(1, "highest"): 10e9, (2, "highest"): 20e9, (2, "high"): 40e9})
