"""Stand-in for ``habana_frameworks.torch.utils.internal``: the bridge's own lazy-mode test."""

import os


def is_lazy() -> bool:
    """True in lazy mode: ``PT_HPU_LAZY_MODE`` unset or not ``0`` (HabanaAI/gaudi-pytorch-bridge 1.19,
    python_packages/habana_frameworks/torch/utils/internal.py lines 25-28;
    the default of releases before 1.21)."""
    return os.getenv("PT_HPU_LAZY_MODE", "1") != "0"
