"""A content digest of a checkpoint's state, to detect corruption on disk or in transfer.

BLAKE2b over a deterministic traversal of the state: containers in their (pickled, so preserved)
order, each tensor as its dtype, shape and raw bytes, each other leaf as its type and ``repr``. A set has
no order to preserve (a set of strings iterates differently in each process, whose string hashes are
seeded afresh), so its members are taken by their own digests, sorted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch

ALGORITHM = "blake2b"


def _feed(hasher: Any, obj: Any, sets_in_order: bool = False) -> None:
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
            _feed(hasher, key, sets_in_order)
            _feed(hasher, value, sets_in_order)
    elif isinstance(obj, (list, tuple)):
        hasher.update(f"{'L' if isinstance(obj, list) else 'U'}{len(obj)}".encode())
        for value in obj:
            _feed(hasher, value, sets_in_order)
    elif isinstance(obj, (set, frozenset)) and not sets_in_order:
        hasher.update(f"{type(obj).__name__}:{len(obj)}".encode())
        for member in sorted(_member_digest(value) for value in obj):
            hasher.update(member)
    else:
        text = repr(obj)
        hasher.update(f"{type(obj).__name__}:{len(text)}:{text}".encode())


def _member_digest(value: Any) -> bytes:
    hasher = hashlib.blake2b(digest_size=32)
    _feed(hasher, value)
    return hasher.digest()


def digest(state: Any, *, sets_in_order: bool = False) -> str:
    """``"blake2b:<hex>"`` over ``state`` (tensors by their bytes, other leaves by type and ``repr``).

    ``sets_in_order``: take a set by its ``repr``, in its iteration order, as devplug did before sets were
    digested member by member (to check a checkpoint written then).
    """
    hasher = hashlib.blake2b(digest_size=32)
    _feed(hasher, state, sets_in_order)
    return f"{ALGORITHM}:{hasher.hexdigest()}"
