"""Stand-in for ``habana_frameworks.medialoaders.torch.media_dataloader_mediapipe``: ``HPUMediaPipe``.

Importable only where the media loader is installed: ``$HPU_STANDIN_MEDIA_PIPE=0`` makes the import
fail, as on an installation without the media package (HabanaAI/gaudi-pytorch-bridge 1.19,
``pytorch_helpers/dataloader/habana_dataloader/habana_dataloader/habana_dataset.py`` lines 333-339
then falls back to the aeon loader). The class only carries its arguments; the stand-in's
``habana_dataloader`` reads them to deal samples as the media pipeline does.
"""

from __future__ import annotations

import os
from typing import Any

if os.environ.get("HPU_STANDIN_MEDIA_PIPE", "1") == "0":
    raise ImportError("No module named 'habana_frameworks.mediapipe' (stand-in: media loader not installed)")


class HPUMediaPipe:
    """The ResNet media pipe: its keyword arguments as ``habana_dataset.py`` lines 377-388 pass them."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
