"""Stand-in for ``habana_frameworks.torch``, the Intel Gaudi PyTorch bridge.

Like the real package, importing it checks that it was built for the running torch (the stand-in
fails with ``$HPU_STANDIN_IMPORT_ERROR`` when set), loads the core, the HCCL backend and the ``hpu``
module, and makes the ``hpu_backend`` torch.compile backend available. The real bridge also registers
``torch.hpu``; the stand-in does not, because torch offers no way to undo that between tests. Like the
real package (HabanaAI/gaudi-pytorch-bridge 1.19, ``python_packages/habana_frameworks/torch/__init__.py``,
lines 18-57), it defines no ``__version__``.
"""

import os

import torch

_error = os.environ.get("HPU_STANDIN_IMPORT_ERROR")
if _error:
    raise AssertionError(_error)


def _hpu_backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
    """The ``hpu_backend`` torch.compile backend (used as in HabanaAI/gaudi-pytorch-bridge 1.19,
    python_packages/habana_frameworks/torch/core/quantize_pt2e.py line 241)."""
    # torch keeps the first registration for the whole session: look the call log up at call time.
    import hpu_standin_calls

    hpu_standin_calls.record("hpu_backend", nodes=len(gm.graph.nodes))
    return gm.forward


if "hpu_backend" not in torch._dynamo.list_backends(exclude_tags=()):
    torch._dynamo.register_backend(_hpu_backend, name="hpu_backend")

import habana_frameworks.torch.core  # noqa: E402
import habana_frameworks.torch.distributed.hccl  # noqa: E402
import habana_frameworks.torch.hpu  # noqa: E402, F401

