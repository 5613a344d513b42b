"""Stand-in for ``transformer_engine.recipe``: the fp8 formats and the delayed-scaling recipe.

Mirrors HabanaAI/gaudi-pytorch-bridge commit cb252c90 (the last bridge source before release 1.19 moved the
package out), ``python_packages/habana_frameworks/torch/hpex/experimental/transformer_engine/recipe.py``: on
Gaudi, E4M3's largest value is 240 (not 448 as on NVIDIA's fp8), HYBRID is E4M3 forward and E5M2 backward,
and only E5M2 and HYBRID train. The same fields and defaults are what optimum-habana 1.21.2 passes
(``accelerate/utils/dataclasses.py`` lines 33-45). The bridge's 1.19 tests build it as
``DelayedScaling(fp8_format=..., amax_history_len=16, amax_compute_algo="max", reduce_amax=False)``
(``tests/pytest_working/any_mode/test_hpu_fp8_te.py`` line 416).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any, NamedTuple


class _FormatHelper(NamedTuple):
    """The largest magnitude a format holds forward and backward (recipe.py lines 25-31 at commit cb252c90)."""

    max_fwd: float
    max_bwd: float


class Format(enum.Enum):
    """E4M3, E5M2 and HYBRID (E4M3 forward, E5M2 backward), with Gaudi's ranges (recipe.py lines 34-51 at
    commit cb252c90)."""

    E4M3 = _FormatHelper(max_fwd=240.0, max_bwd=240.0)
    E5M2 = _FormatHelper(max_fwd=57344.0, max_bwd=57344.0)
    HYBRID = _FormatHelper(max_fwd=240.0, max_bwd=57344.0)


@dataclasses.dataclass
class DelayedScaling:
    """Scale each fp8 tensor by a power of two from the amax seen in earlier steps (recipe.py lines 65-149 at
    commit cb252c90): ``margin``, ``interval`` (steps between scale updates), ``fp8_format``,
    ``amax_history_len``, ``amax_compute_algo`` (``"max"`` or ``"most_recent"``), ``reduce_amax`` (max over
    the fp8 group when distributed). A format other than E5M2 or HYBRID fails the vendor's assertion."""

    margin: int = 0
    interval: int = 1
    fp8_format: Format = Format.E5M2
    amax_history_len: int = 1
    amax_compute_algo: str | Callable[..., Any] = "most_recent"
    override_linear_precision: tuple[bool, bool, bool] = (False, False, False)
    scaling_factor_compute_algo: Callable[..., Any] | None = None
    reduce_amax: bool = True

    def __post_init__(self) -> None:
        assert self.fp8_format in (Format.E5M2, Format.HYBRID), "Only E5M2 and HYBRID training are currently supported."
        assert tuple(self.override_linear_precision) == (False, False, False), "No override is currently supported."
