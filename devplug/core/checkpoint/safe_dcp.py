"""Reading a sharded checkpoint as data only: DCP's metadata and byte entries without running any code.

``torch.distributed.checkpoint`` reads a folder's ``.metadata`` with plain ``pickle.load`` and its non-tensor
entries (an optimizer's learning rate, betas ...) with ``torch.load(weights_only=False)``, so a crafted
checkpoint would run whatever it names on load. Here the metadata goes through an unpickler that builds only
DCP's own metadata records (and the torch sizes, dtypes, layouts and paths inside them), and the byte entries
through torch's weights-only unpickler; anything else is a one-line `CheckpointError` and nothing runs.
`SafeReader` and `SafeLoadPlanner` make DCP itself read that way.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo

from devplug.core.errors import CheckpointError

#: The file DCP writes last into a complete checkpoint folder.
DCP_METADATA = ".metadata"

_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name): getattr(dcp_metadata, name)
    for name in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                 "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")
}
_METADATA_CLASSES[("torch.distributed.checkpoint.filesystem", "_StorageInfo")] = _StorageInfo
_METADATA_CLASSES[("torch", "Size")] = torch.Size
_METADATA_CLASSES[("pathlib", "PosixPath")] = Path
_METADATA_CLASSES[("pathlib", "WindowsPath")] = Path
_METADATA_CLASSES[("pathlib", "PurePosixPath")] = Path
_METADATA_CLASSES[("pathlib", "PureWindowsPath")] = Path


def _layout(name: str) -> torch.layout:
    """A torch layout from its name (what torch pickles a layout as), refusing any other name."""
    found = {str(value): value for value in vars(torch).values() if isinstance(value, torch.layout)}
    if not isinstance(name, str) or name not in found:
        raise pickle.UnpicklingError(f"unknown tensor layout {name!r}")
    return found[name]


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only DCP's metadata records and the torch values inside them; any other global is refused."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = _METADATA_CLASSES.get((module, name))
        if allowed is not None:
            return allowed
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) == ("torch.serialization", "_get_layout"):
            return _layout
        raise pickle.UnpicklingError(f"it names {module}.{name}, which is not part of a checkpoint's metadata")


def _plain_name(relative: Any) -> bool:
    return isinstance(relative, str) and relative not in ("", ".", "..") and "/" not in relative \
        and "\\" not in relative and "\x00" not in relative


def read_metadata(folder: str | os.PathLike[str], name: str = DCP_METADATA) -> Any:
    """The DCP metadata of the checkpoint ``folder``, read as data only; a one-line `CheckpointError` otherwise.

    Only DCP's metadata records are built (no other class is imported or called), and every shard it points
    at must be a file name inside ``folder``.
    """
    path = Path(folder) / name
    where = f"sharded checkpoint {str(Path(folder))!r}"
    try:
        with path.open("rb") as handle:
            metadata = _MetadataUnpickler(handle).load()
    except FileNotFoundError:
        raise CheckpointError(f"{where} is damaged: its {name} is missing") from None
    except pickle.UnpicklingError as exc:
        raise CheckpointError(f"{where} was refused: its {name} is not plain checkpoint metadata ({exc}); "
                              "nothing in it was run. Use a checkpoint from a source you trust") from None
    except Exception as exc:  # truncated or garbled bytes: EOFError, ValueError, KeyError, TypeError ...
        raise CheckpointError(f"{where} is damaged: its {name} cannot be read "
                              f"({type(exc).__name__}: {' '.join(str(exc).split())[:120]})") from None
    problem = _shape_problem(metadata)
    if problem:
        raise CheckpointError(f"{where} is damaged: its {name} {problem}")
    return metadata


def _shape_problem(metadata: Any) -> str:
    """Why ``metadata`` is not what DCP writes (``""`` when it is)."""
    if not isinstance(metadata, dcp_metadata.Metadata):
        return f"holds a {type(metadata).__name__}, not DCP metadata"
    if not isinstance(metadata.state_dict_metadata, dict):
        return "lists no entries"
    storage = metadata.storage_data
    if not isinstance(storage, dict) or not all(
            isinstance(key, dcp_metadata.MetadataIndex) and isinstance(info, _StorageInfo)
            for key, info in storage.items()):
        return "does not say where its entries are stored"
    outside = sorted({str(info.relative_path) for info in storage.values() if not _plain_name(info.relative_path)})
    if outside:
        return f"points outside its folder ({outside[0]!r})"
    return ""


class SafeReader(FileSystemReader):
    """DCP's file-system reader with the metadata read as data only (`read_metadata`)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        """The folder's metadata through the restricted unpickler, with the load id DCP expects."""
        rank = kwargs.get("rank")
        name = DCP_METADATA if rank is None else f"__{rank}{DCP_METADATA}"
        metadata = read_metadata(Path(str(self.path)), name)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _DataOnlyBytes:
    """``load_bytes`` of DCP's planners with the entry read by torch's weights-only unpickler."""

    flatten_state_dict: bool
    original_state_dict: Any
    mappings: Any
    state_dict: Any

    def load_bytes(self, read_item: Any, value: Any) -> None:
        """Set one non-tensor entry, read as data only."""
        from torch.distributed.checkpoint._traverse import set_element

        try:
            loaded = torch.load(value, weights_only=True)
        except Exception as exc:
            raise CheckpointError("a sharded checkpoint entry holds something other than tensors and plain "
                                  f"values ({read_item.dest_index.fqn}); nothing in it was run") from exc
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


class SafeLoadPlanner(_DataOnlyBytes, DefaultLoadPlanner):
    """DCP's load planner with the non-tensor entries read by torch's weights-only unpickler.

    ``wrote`` turns True once DCP is about to copy a read tensor into one of the state dict's tensors:
    until then (the plan: keys, shapes; the metadata) a failed load has changed none of them.
    """

    wrote = False

    def resolve_tensor(self, read_item: Any) -> torch.Tensor:
        """The tensor the read item is copied into (the first one marks ``wrote``)."""
        self.wrote = True
        return super().resolve_tensor(read_item)


class SafeEmptyLoadPlanner(_DataOnlyBytes, _EmptyStateDictLoadPlanner):
    """DCP's planner that loads a whole checkpoint into an empty dict, non-tensor entries read as data only."""
