"""The host CPU's peak FLOP/s: computed from its features and clock, else measured once per machine.

Computed: physical cores torch runs on × clock × FLOP per cycle per core, the last from the vector
units the feature flags in ``/proc/cpuinfo`` announce (two FMA pipes of the widest vector width; AMD
Zen 4 runs AVX-512 on 256-bit pipes; Intel parts with one 512-bit FMA unit, `avx512_fma_units`, half
that). Where an Intel part's model does not tell one unit from two, two are counted (MFU is never
overstated) and the peak's line says whether a measured fp32 matmul showed them or they are assumed.
The clock is ``cpuinfo_max_freq`` (the highest the cores may run
at, boost included), else the GHz in the model name, else ``cpu MHz``. The last two can lie below the
clock the cores run at: a model name gives the base clock, and a virtual machine (most cloud hosts have
no ``cpufreq``) reports the hypervisor's nominal rate. A peak computed from them is checked against a
matmul in the same format, measured once per machine and cached (``devplug.toolkit.plain_gemm_flops``,
the figure ``measure_gemm`` reports); where the matmul runs faster, the peak is the matmul's rate and the
clock the least that rate needs, so MFU is never overstated by a clock read too low. Where the
features or clock cannot be read (another OS, an unknown architecture), the peak is that measured
matmul. Either way the figure does not move with the machine's load.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import re
from pathlib import Path

import torch

from devplug import PeakFlops
from devplug.toolkit import cached_matmul_flops, plain_gemm_flops

log = logging.getLogger("devplug")

CPUINFO = Path("/proc/cpuinfo")
MAX_FREQ = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")


@functools.cache
def cpuinfo_records() -> tuple[dict[str, str], ...]:
    """One ``key: value`` mapping per processor in ``/proc/cpuinfo`` (empty where it does not exist)."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return ()
    records = []
    for block in text.split("\n\n"):
        fields = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if fields:
            records.append(fields)
    return tuple(records)


#: Where `clock` read the clock: the kernel's highest allowed clock, which no core exceeds.
CPUFREQ_MAX = "cpuinfo_max_freq"


def clock() -> tuple[float, str] | None:
    """The CPU's clock in GHz and where it was read, or ``None`` where it cannot be read.

    The sources, best first: ``"cpuinfo_max_freq"`` (cpufreq's highest clock, boost included), ``"the model
    name"`` (Intel's base clock) and ``"cpu MHz"`` (in a virtual machine the hypervisor's nominal rate, on bare
    metal without cpufreq the current clock). Only the first is an upper bound of the cores' clock.
    """
    try:
        return int(MAX_FREQ.read_text().strip()) / 1e6, CPUFREQ_MAX  # kHz
    except (OSError, ValueError):
        pass
    records = cpuinfo_records()
    first = records[0] if records else {}
    match = re.search(r"@\s*([\d.]+)\s*GHz", first.get("model name", ""))
    if match:
        return float(match.group(1)), "the model name"
    try:
        mhz = float(first.get("cpu MHz", ""))
    except ValueError:
        return None
    return (mhz / 1000, "cpu MHz") if mhz > 0 else None


def physical_cores() -> int:
    """Physical cores among the CPUs this process may run on (hyper-threads share their core's units)."""
    try:
        allowed = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        allowed = set(range(os.cpu_count() or 1))
    cores = set()
    for fields in cpuinfo_records():
        try:
            cpu = int(fields.get("processor", ""))
        except ValueError:
            continue
        if cpu in allowed:
            cores.add((fields.get("physical id", "0"), fields.get("core id", str(cpu))))
    return len(cores) or len(allowed)


def fp32_flops_per_cycle(flags: frozenset[str], vendor: str, family: int, model: int | None = None) -> int | None:
    """FP32 FLOP per cycle per core on x86 (two FMA pipes of the widest width), ``None``: not x86 or unknown.

    AMD family 23 holds Zen 1 (models below 0x30: 128-bit FMA pipes, 16) and Zen 2 (0x30 and up: 256-bit, 32);
    with the model unknown it counts Zen 2's pipes, so MFU is never overstated. Hygon's family 24 is Zen 1.
    """
    if "avx512f" in flags:
        return 32 if vendor == "AuthenticAMD" and family <= 25 else 64  # Zen 4: AVX-512 on 256-bit pipes
    if "avx2" in flags and "fma" in flags:
        zen1 = (vendor == "AuthenticAMD" and family == 23 and model is not None and model < 0x30) or (
            vendor == "HygonGenuine" and family == 24)
        return 16 if zen1 else 32  # Zen 1: 128-bit FMA pipes
    if "avx" in flags:
        return 16
    if "sse2" in flags:
        return 8
    return None


#: CPUID models (family 6) of Intel's client cores with AVX-512: one 512-bit FMA unit (ports 0 and 1 fused,
#: no second unit on port 5). Intel's optimization reference manual: "All processors based on Ice Lake Client
#: microarchitecture contain a single 512-bit FMA unit"; Cannon Lake, Tiger Lake and Rocket Lake (Xeon
#: W-1300, E-2300 included) are client cores of that design.
ONE_FMA_CLIENT_MODELS = {102: "Cannon Lake", 125: "Ice Lake", 126: "Ice Lake", 140: "Tiger Lake", 141: "Tiger Lake",
                         167: "Rocket Lake"}
#: Xeon Scalable model names: metal, then the number (thousands: tier; hundreds: generation, 1 Skylake-SP,
#: 2 Cascade Lake, 3 Cooper/Ice Lake ...).
_XEON_SCALABLE = re.compile(r"Xeon(?:\(R\))?\s+(Platinum|Gold|Silver|Bronze)\s+(\d)(\d)\d\d")
#: Xeon W-2100/2200/3200 and Core X-series (Skylake-X, Cascade Lake-X): two units on every model.
_TWO_FMA_WORKSTATION = re.compile(r"Xeon(?:\(R\))?\s+(?:CPU\s+)?W-[23]\d{3}|Core(?:\(TM\))?\s+i[79]-\d{4,5}X")


def avx512_fma_units(vendor: str, family: int, model: int | None, model_name: str) -> int | None:
    """512-bit FMA units per core of an Intel CPU with AVX-512: 1 or 2, ``None`` where its model does not say.

    From Intel's specifications (ark.intel.com, "# of AVX-512 FMA Units"): in the 1st and 2nd generation
    Xeon Scalable (Skylake-SP ``x1xx``, Cascade Lake ``x2xx``) Bronze, Silver and Gold 5xxx have one, except
    Gold 5122 and 5222; Gold 6xxx and Platinum of every generation, Xeon W-2100/2200/3200 and the Core
    X-series have two; client cores (`ONE_FMA_CLIENT_MODELS`) have one. Anything else (a later Silver, a
    Xeon D, a cloud guest's ``Intel Xeon Processor (Cascadelake)``) is ``None``; so is AMD, whose AVX-512
    width `fp32_flops_per_cycle` counts from the family.
    """
    if vendor != "GenuineIntel":
        return None
    if family == 6 and model in ONE_FMA_CLIENT_MODELS:
        return 1
    match = _XEON_SCALABLE.search(model_name)
    if match:
        metal, tier, generation = match.groups()
        if metal == "Platinum" or (metal == "Gold" and tier == "6"):
            return 2
        if generation in ("1", "2"):
            return 2 if re.search(r"Gold\s+5[12]22\b", model_name) else 1
        return None
    return 2 if _TWO_FMA_WORKSTATION.search(model_name) else None


#: Short names of the number formats a peak is given for.
FORMAT_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def vector_units(flags: frozenset[str], vendor: str = "", family: int = 0) -> str:
    """The FP32 vector units `fp32_flops_per_cycle` counts, as the feature that gives them (``"avx2+fma"``)."""
    if "avx512f" in flags:
        return "avx512f on 256-bit pipes" if vendor == "AuthenticAMD" and family <= 25 else "avx512f"
    if "avx2" in flags and "fma" in flags:
        return "avx2+fma"
    for feature in ("avx", "sse2"):
        if feature in flags:
            return feature
    return "fp32 units"


def flops_per_cycle(flags: frozenset[str], dtype: torch.dtype, fp32: int,
                    units: str | None = None) -> tuple[float, str]:
    """FLOP per cycle per core in ``dtype`` for a CPU doing ``fp32`` in FP32, and the feature that gives it.

    AMX tiles: 1024 (BF16, FP16); AVX-512 BF16/FP16 dot products: twice the FP32 rate; otherwise the
    format is computed on the FP32 units (``units``: their name, `vector_units`; by default read from
    ``flags``), said as such for a reduced format (``"avx2+fma, bf16 at the fp32 rate"``).
    """
    native = {torch.bfloat16: ("amx_bf16", "avx512_bf16"), torch.float16: ("amx_fp16", "avx512_fp16")}
    amx, vector = native.get(dtype, (None, None))
    if amx in flags:
        return 1024.0, str(amx)
    if vector in flags:
        return 2.0 * fp32, str(vector)
    units = units if units is not None else vector_units(flags)
    if dtype in native:
        return float(fp32), f"{units}, {FORMAT_NAMES[dtype]} at the fp32 rate"
    return float(fp32), units


def computed_peak(dtype: torch.dtype) -> PeakFlops | None:
    """cores × clock × FLOP per cycle for ``dtype``, or ``None`` where the CPU's features or clock are unknown."""
    records = cpuinfo_records()
    if not records or platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return None
    first = records[0]
    flags = frozenset(first.get("flags", "").split())
    try:
        family = int(first.get("cpu family", "0"))
    except ValueError:
        family = 0
    try:
        model: int | None = int(first.get("model", ""))
    except ValueError:
        model = None
    vendor = first.get("vendor_id", "")
    per_cycle = fp32_flops_per_cycle(flags, vendor, family, model)
    read = clock()
    if per_cycle is None or read is None:
        return None
    ghz, source = read
    units = vector_units(flags, vendor, family)
    fma_units: int | None = 2  # two FMA pipes of the widest width, unless an Intel model says one or none
    if units == "avx512f" and vendor == "GenuineIntel":
        fma_units = avx512_fma_units(vendor, family, model, first.get("model name", ""))
    if fma_units == 1:
        per_cycle //= 2
        units = "avx512f on one 512-bit FMA unit"
    per_cycle_here, feature = flops_per_cycle(flags, dtype, per_cycle, units)
    if feature.startswith("avx512_") and units.endswith("256-bit pipes"):  # Zen 4's dot products, half width
        feature += " on 256-bit pipes"
    elif feature.startswith("avx512_") and fma_units == 1:  # the dot products run on the one FMA unit
        feature += " on one 512-bit FMA unit"
    cores = min(physical_cores(), torch.get_num_threads())
    name = FORMAT_NAMES.get(dtype, str(dtype).removeprefix("torch."))
    described = feature if feature.endswith("fp32 rate") else f"{feature}, {name}"
    if fma_units is None and not feature.startswith("amx_"):  # AMX tiles do not run on the FMA units
        described += "; " + _two_fma_units(cores * ghz * 1e9 * per_cycle / 2, source)
    peak = cores * ghz * 1e9 * per_cycle_here
    if source != CPUFREQ_MAX:
        matmul = _measured_matmul(dtype)
        if matmul is not None and matmul > peak:
            needed = matmul / (cores * 1e9 * per_cycle_here)
            detail = (f"{cores} cores × {needed:.3g} GHz × {per_cycle_here:g} FLOP/cycle ({described}); that clock is "
                      f"the least that the {name} matmul measured here needs ({source} says {ghz:.3g} GHz)")
            return PeakFlops(matmul, "computed", detail)
    detail = f"{cores} cores × {ghz:.3g} GHz × {per_cycle_here:g} FLOP/cycle ({described})"
    return PeakFlops(peak, "computed", detail)


def _two_fma_units(one_unit_peak: float, source: str) -> str:
    """How the peak's line counts two 512-bit FMA units on an Intel part whose model does not say.

    Shown: the fp32 matmul measured here (once per machine) runs faster than one unit allows at a clock no
    core exceeds (``cpuinfo_max_freq``). Otherwise assumed, and the line says one unit would halve the peak:
    a slower matmul proves nothing (a busy host, or cores slowed under AVX-512 load, also measure low).
    """
    if source == CPUFREQ_MAX and torch.get_float32_matmul_precision() == "highest":  # fp32 on the FMA units
        matmul = _measured_matmul(torch.float32, "the CPU's FMA units were not counted from a measured matmul "
                                                 "(%s): two are assumed")
        if matmul is not None and matmul > one_unit_peak:
            return (f"two FMA units: the fp32 matmul measured here, {matmul / 1e9:.4g} GFLOP/s, beats one "
                    f"unit's {one_unit_peak / 1e9:.4g} GFLOP/s")
    return "two FMA units assumed, one would halve this peak"


def _measured_matmul(dtype: torch.dtype,
                     failed: str = "the CPU's clock was not checked against a measured matmul (%s): MFU may read high",
                     ) -> float | None:
    """A matmul's FLOP/s in ``dtype`` here, measured once per machine; ``None`` where it failed (``failed``, a
    warning whose ``%s`` is the error)."""
    try:
        return plain_gemm_flops("cpu", dtype)  # the figure `Trainer(measure_gemm=True)` reports, measured once
    except Exception as exc:
        log.warning(failed, " ".join(str(exc).split()) or type(exc).__name__)
        return None


def cpu_model() -> str:
    """The CPU's model name (``platform.processor()`` where ``/proc/cpuinfo`` does not exist)."""
    records = cpuinfo_records()
    return (records[0].get("model name") if records else None) or platform.processor() or platform.machine()


def peak_flops(dtype: torch.dtype) -> PeakFlops:
    """The computed peak for ``dtype``; where it cannot be computed, a matmul measured once per machine."""
    computed = computed_peak(dtype)
    if computed is not None:
        return computed
    return PeakFlops(cached_matmul_flops("cpu", dtype, cpu_model()), "measured (cached)",
                     f"best {FORMAT_NAMES.get(dtype, dtype)} matmul on {cpu_model()}, measured once on this machine")
