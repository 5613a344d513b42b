"""A content digest of a checkpoint's state, to detect corruption on disk or in transfer.

BLAKE2b over a deterministic traversal of the state: containers in their (pickled, so preserved)
order, each tensor as its dtype, shape and raw bytes, each other leaf as its type and ``repr``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch

ALGORITHM = "blake2b"


def _feed(hasher: Any, obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        tensor = obj.detach()
        hasher.update(f"T{tensor.dtype}{tuple(tensor.shape)}".encode())
        if tensor.is_quantized:
            tensor = tensor.dequantize()
        elif tensor.layout != torch.strided:
            tensor = tensor.to_dense()
        raw = tensor.cpu().resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)
        try:
            # an ndarray is a buffer; numpy declares __buffer__ for Python 3.12 and newer only
            hasher.update(memoryview(raw.numpy()))  # type: ignore[arg-type]
        except RuntimeError:  # torch without numpy
            hasher.update(bytes(raw.tolist()))
    elif isinstance(obj, Mapping):
        hasher.update(f"D{len(obj)}".encode())
        for key, value in obj.items():
            _feed(hasher, key)
            _feed(hasher, value)
    elif isinstance(obj, (list, tuple)):
        hasher.update(f"{'L' if isinstance(obj, list) else 'U'}{len(obj)}".encode())
        for value in obj:
            _feed(hasher, value)
    else:
        text = repr(obj)
        hasher.update(f"{type(obj).__name__}:{len(text)}:{text}".encode())


def digest(state: Any) -> str:
    """``"blake2b:<hex>"`` over ``state`` (tensors by their bytes, other leaves by type and ``repr``)."""
    hasher = hashlib.blake2b(digest_size=32)
    _feed(hasher, state)
    return f"{ALGORITHM}:{hasher.hexdigest()}"
