"""Mixed precision on Gaudi: bf16 autocast, or Habana Mixed Precision (HMP) where the stack ships it.

- ``"auto"`` and ``"bf16-mixed"``: ``torch.autocast(device_type="hpu", dtype=torch.bfloat16)`` around
  forward and loss, Intel's recommended method. bf16 keeps fp32's exponent range, so no grad scaler.
- ``"hmp"`` (a precision name), or ``device_options={"hmp": ...}`` with ``"auto"``/``"bf16-mixed"``:
  ``habana_frameworks.torch.hpex.hmp``. ``hmp.convert(opt_level, bf16_file_path, fp32_file_path,
  isVerbose)`` patches torch functions process-wide to cast their inputs (once per process, in
  ``PrecisionPlan.convert_module``; a later Trainer in the process asking for other HMP settings is a
  `PrecisionError`), and every optimizer step runs inside ``hmp.disable_casts()`` so the update stays in
  fp32. Intel deprecated HMP (announced for removal in release 1.13) in favour of
  autocast; asking for it where the stack no longer has it is a `PrecisionError`.
  The ``hmp`` option is ``True``, an opt level (``"O1"``, ``"O2"``), or a mapping with ``opt_level``,
  ``bf16_ops``, ``fp32_ops`` (a file of op names, one a line, or a list of names) and ``verbose``.
  HMP reads the op lists at ``O1`` only, so lists with ``O2`` are a `PrecisionError` rather than
  silently unused.
- ``"32-true"``: fp32. ``"16-mixed"``: a `PrecisionError` (fp16 with loss scaling is a GPU recipe).
- ``"fp8-mixed"``: Intel's Gaudi Transformer Engine on Gaudi 2 and 3 (`devplug.plugins.hpu.fp8`); refused on
  first-generation Gaudi.

Every plan, HMP's included, is built through the precision layer (``devplug.toolkit.precision_plan``);
another registered precision that does not compute in fp16 is planned the same way.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import torch

from devplug import Device, PrecisionError, PrecisionPlan
from devplug.plugins.hpu import fp8, runtime
from devplug.toolkit import find_precision, precision_named, precision_names, precision_plan

HMP_MODULE = "habana_frameworks.torch.hpex.hmp"
HMP_OPT_LEVELS = ("O1", "O2")


@attrs.frozen
class HmpSettings:
    """Arguments for ``hmp.convert``: op lists are file paths, lists of op names, or ``None`` (HMP's own)."""

    opt_level: str = "O1"
    bf16_ops: str | os.PathLike[str] | list[str] | None = None
    fp32_ops: str | os.PathLike[str] | list[str] | None = None
    verbose: bool = False

    @classmethod
    def parse(cls, value: Any) -> HmpSettings:
        """Settings from the ``hmp`` device option (``True``, an opt level, or a mapping)."""
        if value is True or value is None:
            settings = cls()
        elif isinstance(value, str):
            settings = cls(opt_level=value)
        elif isinstance(value, Mapping):
            unknown = sorted(set(value) - {"opt_level", "bf16_ops", "fp32_ops", "verbose"})
            if unknown:
                raise PrecisionError(
                    f"unknown HMP setting(s) {', '.join(unknown)}; use opt_level, bf16_ops, fp32_ops, verbose"
                )
            settings = cls(**value)
        else:
            raise PrecisionError(f"device option hmp={value!r}: use True, 'O1', 'O2' or a mapping of HMP settings")
        if settings.opt_level not in HMP_OPT_LEVELS:
            raise PrecisionError(f"HMP opt_level must be 'O1' or 'O2', got {settings.opt_level!r}")
        if settings.opt_level == "O2" and (settings.bf16_ops is not None or settings.fp32_ops is not None):
            raise PrecisionError("HMP reads the bf16_ops/fp32_ops lists at opt_level 'O1' only and ignores them "
                                 "at 'O2'; use opt_level='O1' with your lists, or leave them out for O2")
        return settings


def _op_file(ops: str | os.PathLike[str] | list[str] | None, folder: Path, name: str) -> str:
    """The path ``hmp.convert`` reads an op list from ("" for HMP's built-in list)."""
    if ops is None:
        return ""
    if isinstance(ops, (str, os.PathLike)):
        return os.fspath(ops)
    path = folder / name
    path.write_text("\n".join(ops) + "\n")
    return str(path)


def _refuse_other_settings(settings: HmpSettings) -> None:
    """A `PrecisionError` when ``hmp.convert`` already patched this process with other settings."""
    rt = runtime.state()
    if rt.hmp_converted and rt.hmp_settings is not None and rt.hmp_settings != settings:
        first = rt.hmp_settings
        raise PrecisionError(
            f"HMP patched torch in this process with opt_level={first.opt_level} (bf16_ops={first.bf16_ops!r}, "
            f"fp32_ops={first.fp32_ops!r}) and cannot be converted again; this Trainer asks for "
            f"opt_level={settings.opt_level} (bf16_ops={settings.bf16_ops!r}, fp32_ops={settings.fp32_ops!r}): "
            "use the same HMP settings, or run it in a new process")


def _convert_once(hmp: ModuleType, settings: HmpSettings) -> Callable[[torch.nn.Module], torch.nn.Module]:
    def convert_module(module: torch.nn.Module) -> torch.nn.Module:
        """Run ``hmp.convert`` the first time (it patches torch for the whole process); return ``module``."""
        rt = runtime.state()
        _refuse_other_settings(settings)
        if not rt.hmp_converted:
            with tempfile.TemporaryDirectory(prefix="devplug-hmp-") as folder:
                hmp.convert(
                    opt_level=settings.opt_level,
                    bf16_file_path=_op_file(settings.bf16_ops, Path(folder), "bf16_ops.txt"),
                    fp32_file_path=_op_file(settings.fp32_ops, Path(folder), "fp32_ops.txt"),
                    isVerbose=settings.verbose,
                )
            rt.hmp_converted, rt.hmp_settings = True, settings
        return module

    return convert_module


def hmp_plan(settings: HmpSettings, device: Device) -> PrecisionPlan:
    """HMP: bf16-mixed with no autocast, converted once, ``hmp.disable_casts()`` around every optimizer step.

    A process converted already with other settings is refused (`PrecisionError`): HMP patches torch once.
    """
    _refuse_other_settings(settings)
    try:
        hmp = importlib.import_module(HMP_MODULE)
    except ImportError as exc:
        raise PrecisionError(
            f"HMP was asked for, but the installed Intel Gaudi software has no {HMP_MODULE} ({exc}); Intel "
            "deprecated HMP for torch.autocast: use precision='bf16-mixed' (or 'auto') instead"
        ) from exc
    return precision_plan(
        device,
        "bf16-mixed",
        autocast=False,
        convert_module=_convert_once(hmp, settings),
        optimizer_step_context=hmp.disable_casts,
        description=f"Habana Mixed Precision (hmp.convert opt_level={settings.opt_level}, "
        "hmp.disable_casts() around optimizer steps)",
    )


def plan_precision(device: Device, precision: str) -> PrecisionPlan:
    """The precision plan for ``precision`` on a Gaudi device (see the module docstring)."""
    hmp_option = device.options.get("hmp")
    if precision == "fp8-mixed":
        if hmp_option not in (None, False):
            raise PrecisionError(f"device option hmp={hmp_option!r} needs precision 'auto', 'bf16-mixed' or 'hmp', "
                                 "not 'fp8-mixed'")
        return fp8.plan_fp8(device)
    known = find_precision(precision)
    if known is not None and known.compute_dtype == torch.float16:
        raise PrecisionError(
            "precision='16-mixed' (fp16 with a grad scaler) is a GPU recipe; Gaudi trains in bf16, which needs "
            "no loss scaling: use precision='bf16-mixed' (or 'auto')"
        )
    if precision == "hmp" or (hmp_option not in (None, False) and precision in ("auto", "bf16-mixed")):
        return hmp_plan(HmpSettings.parse(hmp_option), device)
    if hmp_option not in (None, False):
        raise PrecisionError(f"device option hmp={hmp_option!r} needs precision 'auto', 'bf16-mixed' or 'hmp', "
                             f"not {precision!r}")
    if precision == "auto":
        return precision_plan(device, "bf16-mixed")
    if known is not None:
        return precision_plan(device, precision)
    runs = [name for name in precision_names() if precision_named(name).compute_dtype != torch.float16]
    raise PrecisionError(f"precision {precision!r} is not one of {', '.join(['auto', *runs, 'hmp'])} "
                         "(the settings Gaudi runs)")
