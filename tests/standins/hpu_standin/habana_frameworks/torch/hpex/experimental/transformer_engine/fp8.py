"""Stand-in for ``transformer_engine.fp8``: the fp8 autocast context, its global state, the availability check.

Mirrors the pre-1.19 bridge source (HabanaAI/gaudi-pytorch-bridge commit cb252c90, ``.../transformer_engine/
fp8.py``: ``check_fp8_support``, ``FP8GlobalStateManager.fp8_autocast_enter``, ``fp8_autocast``) and the bridge's
1.19 tests (``tests/pytest_working/any_mode/test_hpu_fp8_te.py``): the context wraps the forward only, the
backward runs outside it and follows the forward's settings, and first-generation Gaudi has no fp8. Lightning's
HPU plugin asks ``fp8.is_fp8_available()`` for ``(available, reason)`` (lightning-habana 1.6.0,
``utils/resources.py`` lines 131-142, after Lightning-AI/pytorch-lightning's HPU precision plugin).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import hpu_standin_calls
import torch

from habana_frameworks.torch.hpex.experimental.transformer_engine.recipe import DelayedScaling, Format

#: The vendor's reason on first-generation Gaudi (its text, as the 1.19 tests' skip reason paraphrases it).
NO_FP8_REASON = "FP8 not supported on Gaudi, Gaudi2 or higher required"


def check_fp8_support() -> tuple[bool, str]:
    """``(False, reason)`` on first-generation Gaudi, whose name is ``"GAUDI"`` (the bridge's 1.19 tests skip every
    fp8 test there: test_hpu_fp8_te.py lines 48-50; message as fp8.py ``check_fp8_support`` at commit cb252c90)."""
    from habana_frameworks.torch import hpu

    first_generation = hpu.get_device_name() == "GAUDI"
    return (False, NO_FP8_REASON) if first_generation else (True, "")


def is_fp8_available() -> tuple[bool, str]:
    """Whether this Gaudi trains in fp8, and why not (as lightning-habana 1.6.0 calls it, resources.py line 142)."""
    return check_fp8_support()


def get_fp8_te_dtype(fp8_recipe: DelayedScaling, fprop_tensor: bool = True) -> torch.dtype:
    """E4M3 for forward tensors under HYBRID, E5M2 otherwise (test_hpu_fp8_te.py lines 651-688 run both formats;
    HYBRID = E4M3 forward, E5M2 backward, recipe.py lines 44-46 at commit cb252c90)."""
    e4m3 = (Format.E4M3, Format.HYBRID) if fprop_tensor else (Format.E4M3,)
    return torch.float8_e4m3fn if fp8_recipe.fp8_format in e4m3 else torch.float8_e5m2


class FP8GlobalStateManager:
    """Process-wide fp8 state: whether fp8 is on, with which recipe, how deep the contexts nest (the class of the
    same name in fp8.py at commit cb252c90; the 1.19 tests import it, test_hpu_fp8_te.py line 33)."""

    FP8_ENABLED = False
    FP8_RECIPE: DelayedScaling | None = None
    FP8_DISTRIBUTED_GROUP: Any = None
    FP8_AUTOCAST_DEPTH = 0
    FP8_AUTOCAST_COUNTER = 0

    @classmethod
    def is_fp8_enabled(cls) -> bool:
        """Whether a module's forward runs in fp8 now (inside ``fp8_autocast(enabled=True)``; the test at
        test_hpu_fp8_te.py lines 272-357 shows a te.Linear outside it is a plain linear)."""
        return cls.FP8_ENABLED

    @classmethod
    def get_fp8_recipe(cls) -> DelayedScaling:
        """The recipe of the innermost context, the default ``DelayedScaling()`` without one (recipe.py lines
        138-145 at commit cb252c90 give its defaults)."""
        return cls.FP8_RECIPE if cls.FP8_RECIPE is not None else DelayedScaling()


@contextlib.contextmanager
def fp8_autocast(enabled: bool = False, force_measurement: bool | None = None,
                 fp8_recipe: DelayedScaling | None = None, fp8_group: Any = None) -> Iterator[None]:
    """Run the forward of te modules in fp8 with ``fp8_recipe`` (Intel's FP8 training page; used around the forward
    only in test_hpu_fp8_te.py lines 209-216). Enabled on first-generation Gaudi it fails the vendor's
    assertion with the reason from `check_fp8_support`. The previous state comes back on exit."""
    saved = (FP8GlobalStateManager.FP8_ENABLED, FP8GlobalStateManager.FP8_RECIPE,
             FP8GlobalStateManager.FP8_DISTRIBUTED_GROUP)
    hpu_standin_calls.record("te.fp8_autocast.enter", enabled=enabled, recipe=fp8_recipe, fp8_group=fp8_group)
    try:
        FP8GlobalStateManager.FP8_ENABLED = enabled
        FP8GlobalStateManager.FP8_RECIPE = DelayedScaling() if fp8_recipe is None else fp8_recipe
        FP8GlobalStateManager.FP8_DISTRIBUTED_GROUP = fp8_group
        if FP8GlobalStateManager.FP8_AUTOCAST_DEPTH == 0:
            FP8GlobalStateManager.FP8_AUTOCAST_COUNTER += 1
        FP8GlobalStateManager.FP8_AUTOCAST_DEPTH += 1
        if enabled:
            available, reason = check_fp8_support()
            assert available, reason
        yield
    finally:
        (FP8GlobalStateManager.FP8_ENABLED, FP8GlobalStateManager.FP8_RECIPE,
         FP8GlobalStateManager.FP8_DISTRIBUTED_GROUP) = saved
        FP8GlobalStateManager.FP8_AUTOCAST_DEPTH -= 1
        hpu_standin_calls.record("te.fp8_autocast.exit")
