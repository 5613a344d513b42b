"""Stand-in for ``habana_frameworks.torch.hpex.experimental.transformer_engine``, the Intel Gaudi Transformer Engine.

In HabanaAI/gaudi-pytorch-bridge 1.19 this package is a shim (``python_packages/habana_frameworks/torch/hpex/
experimental/transformer_engine/__init__.py`` lines 27-37) that re-exports the separately shipped
``intel_transformer_engine`` package, names and submodules (``recipe``, ``fp8`` ...) alike; that package's
source is not public. Its behaviour here follows the bridge's own tests of it in the same release
(``tests/pytest_working/any_mode/test_hpu_fp8_te.py``) and the pre-1.19 bridge source of the same API (commits
cb252c90, ac47fb7c and f90046f4: ``recipe.py``, ``fp8.py``, ``module/base.py``, ``module/linear.py``). The usage
(``te.Linear`` in place of ``nn.Linear``, ``te.fp8_autocast(enabled=True, fp8_recipe=recipe.DelayedScaling(...))``
around the forward) is Intel's "FP8 Training with Intel Gaudi Transformer Engine" page
(https://docs.habana.ai/en/latest/PyTorch/PyTorch_FP8_Training/index.html).

The stand-in computes on the CPU: fp8 casts are emulated (scaled, clamped to the format's range, rounded
through torch's float8 dtypes), and it records ``te.fp8_autocast`` and ``te.Linear`` calls in
``hpu_standin_calls`` so tests see which layers ran in fp8 and when the context was entered.
"""

from habana_frameworks.torch.hpex.experimental.transformer_engine import fp8, recipe
from habana_frameworks.torch.hpex.experimental.transformer_engine.fp8 import fp8_autocast
from habana_frameworks.torch.hpex.experimental.transformer_engine.module import Linear

__all__ = ["Linear", "fp8", "fp8_autocast", "recipe"]
