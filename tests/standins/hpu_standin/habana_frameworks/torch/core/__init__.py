"""Stand-in for ``habana_frameworks.torch.core`` (``htcore``): ``mark_step`` records its call."""

import hpu_standin_calls


def mark_step(device_str: str = "", sync: bool = False) -> None:
    """Flush the ops accumulated in lazy mode into a graph (HabanaAI/gaudi-pytorch-bridge 1.19,
    python_packages/habana_frameworks/torch/core/step_closure.py line 70;
    stand-in: record the call)."""
    hpu_standin_calls.record("mark_step", device_str=device_str, sync=sync)
