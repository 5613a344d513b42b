"""Stand-in for ``habana_dataloader``, Intel's Gaudi media loader for PyTorch.

``HabanaDataLoader`` takes ``torch.utils.data.DataLoader``'s arguments. The real one accelerates
torchvision ``ImageFolder`` (and COCO) datasets with Gaudi's media pipeline or its aeon loader and
otherwise runs a plain torch DataLoader; the stand-in records its arguments and always does the latter.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import hpu_standin_calls
import torch.utils.data


class HabanaDataLoader:
    """A data loader for Gaudi, used like ``torch.utils.data.DataLoader``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        dataset = kwargs.get("dataset", args[0] if args else None)
        hpu_standin_calls.record(
            "HabanaDataLoader", dataset=type(dataset).__name__, **{k: v for k, v in kwargs.items() if k != "dataset"}
        )
        self.dataloader = torch.utils.data.DataLoader(*args, **kwargs)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.dataloader)

    def __len__(self) -> int:
        return len(self.dataloader)
