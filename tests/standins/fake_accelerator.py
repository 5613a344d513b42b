"""Test-only stand-in: PyTorch's device-generic API made to report an accelerator this machine does not have.

Never shipped, never used outside tests. It patches **torch's boundary only** (devplug's code is
unchanged) and records every call devplug makes through it:

- ``torch.accelerator``: ``current_accelerator``, ``is_available``, ``device_count``,
  ``current_device_index``, ``set_device_index``, ``synchronize``, ``memory_allocated``,
  ``memory_reserved``, ``max_memory_allocated``, ``get_memory_info``;
- ``torch.get_device_module(<fake type>)``: a `FakeDeviceModule` (``is_available``,
  ``device_count``, ``set_device``, ``synchronize``, ``is_bf16_supported``, per-device RNG states);
- ``torch.amp.is_autocast_available(<fake type>)``: True;
- ``torch.distributed.Backend.default_device_backend_map``: a `RecordingMap` that also maps the fake
  type to `FAKE_BACKEND`;
- with ``privateuse1=NAME``: ``torch._C._get_privateuse1_backend_name`` answers ``NAME``, as it does once an
  out-of-tree extension (``torch_npu``) renamed the PrivateUse1 backend.

Why the fake accelerator's type is a real torch device type (``"mtia"`` by default) rather than a new
name: devplug places tensors with ``torch.device(type)``, which parses only the types torch's C++ core
knows; a new name exists only after ``torch.utils.rename_privateuse1_backend``, which cannot be undone
in a process, and no tensor could live there without a C++ backend anyway. ``mtia`` is a type torch
parses, has no hardware here, and whose real module answers "not built"; the stand-in makes torch
report it present and makes its module the recording fake. Tests built on it place **no tensor** on the
fake device: they resolve it, build a Trainer on it and drive everything the generic path does
without tensors — synchronize, memory statistics, device selection, RNG state in checkpoints,
precision and collective choices — and check the recorded calls. Training end to end through the same
generic paths runs for real on the CPU (the generic plugin serving ``cpu``, and a third-party plugin
that only declares a CPU-typed device).

With ``privateuse1=NAME`` the current accelerator is reported as a bare object with ``.type == NAME``
(``torch.device(NAME)`` would not parse); only registration and probing use that name.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

#: The collective backend the stand-in's backend map gives the fake type.
FAKE_BACKEND = "fakeccl"


class Calls(list):
    """``(function, args)`` pairs, in call order."""

    def names(self) -> list[str]:
        """The functions called, in order."""
        return [name for name, _args in self]

    def of(self, name: str) -> list[tuple[Any, ...]]:
        """The arguments of every call of ``name``."""
        return [args for called, args in self if called == name]


class RecordingMap(dict):
    """A dict that records ``get`` and ``[]`` look-ups (the backend map devplug reads)."""

    def __init__(self, data: dict[str, str], calls: Calls) -> None:
        super().__init__(data)
        self.calls = calls

    def get(self, key: Any, default: Any = None) -> Any:
        """``dict.get``, recorded."""
        self.calls.append(("Backend.default_device_backend_map.get", (key,)))
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.calls.append(("Backend.default_device_backend_map[]", (key,)))
        return super().__getitem__(key)


class FakeDeviceModule(types.ModuleType):
    """``torch.<fake type>``: what a device module offers, recorded; RNG states are CPU byte tensors."""

    def __init__(self, device_type: str, count: int, calls: Calls) -> None:
        super().__init__(f"torch.{device_type}")
        self.device_type, self.count, self.calls = device_type, count, calls
        self.rng_states = [torch.full((8,), i, dtype=torch.uint8) for i in range(count)]

    def _record(self, name: str, *args: Any) -> None:
        self.calls.append((f"torch.{self.device_type}.{name}", args))

    def is_available(self) -> bool:
        """True: the fake device is present."""
        self._record("is_available")
        return True

    def device_count(self) -> int:
        """The fake's device count."""
        self._record("device_count")
        return self.count

    def set_device(self, index: int) -> None:
        """Record the device selected."""
        self._record("set_device", index)

    def synchronize(self, device: Any = None) -> None:
        """Record the wait."""
        self._record("synchronize", device)

    def is_bf16_supported(self, including_emulation: bool = True) -> bool:
        """True: the fake computes bf16 natively."""
        self._record("is_bf16_supported", including_emulation)
        return True

    def get_rng_state_all(self) -> list[torch.Tensor]:
        """A copy of every device's RNG state."""
        self._record("get_rng_state_all")
        return [s.clone() for s in self.rng_states]

    def set_rng_state_all(self, states: list[torch.Tensor]) -> None:
        """Replace every device's RNG state."""
        self._record("set_rng_state_all", [s.clone() for s in states])
        self.rng_states = [torch.as_tensor(s).clone() for s in states]


class FakeAccelerator:
    """What the stand-in reports, and every call devplug made through it (``calls``)."""

    def __init__(self, device_type: str, count: int, privateuse1: str | None) -> None:
        self.device_type, self.count, self.privateuse1 = device_type, count, privateuse1
        self.calls = Calls()
        self.module = FakeDeviceModule(device_type, count, self.calls)
        self.current_index = 0
        self.memory = {"memory_allocated": 1 << 20, "memory_reserved": 2 << 20, "max_memory_allocated": 3 << 20}
        self.total_memory = 16 << 30

    def device(self) -> Any:
        """The fake as ``torch.accelerator.current_accelerator`` returns it."""
        try:
            return torch.device(self.device_type)
        except RuntimeError:  # a renamed PrivateUse1 name torch's parser does not know
            return types.SimpleNamespace(type=self.device_type)

    def _accelerator(self, name: str, result: Any) -> Any:
        def function(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((f"torch.accelerator.{name}", args))
            return result(*args, **kwargs) if callable(result) else result

        function.__name__ = name
        return function

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Patch torch's boundary for the duration of the test."""
        patch = {
            "current_accelerator": lambda check_available=False: self.device(),
            "is_available": True,
            "device_count": self.count,
            "current_device_index": lambda: self.current_index,
            "set_device_index": self._select,
            "synchronize": None,
            "get_memory_info": lambda device=None: (self.total_memory - self.memory["memory_reserved"],
                                                    self.total_memory),
            **self.memory,
        }
        for name, result in patch.items():
            monkeypatch.setattr(torch.accelerator, name, self._accelerator(name, result), raising=False)

        real_module = torch.get_device_module

        def get_device_module(device: Any = None) -> Any:
            kind = device if isinstance(device, str) else getattr(device, "type", None)
            if kind is not None and kind.split(":")[0] == self.device_type:
                self.calls.append(("torch.get_device_module", (kind,)))
                return self.module
            return real_module(device)

        monkeypatch.setattr(torch, "get_device_module", get_device_module)

        real_autocast = torch.amp.is_autocast_available

        def is_autocast_available(device_type: str) -> bool:
            if device_type == self.device_type:
                self.calls.append(("torch.amp.is_autocast_available", (device_type,)))
                return True
            return real_autocast(device_type)

        monkeypatch.setattr(torch.amp, "is_autocast_available", is_autocast_available)
        backends = RecordingMap({**dist.Backend.default_device_backend_map, self.device_type: FAKE_BACKEND},
                                self.calls)
        monkeypatch.setattr(dist.Backend, "default_device_backend_map", backends)
        if self.privateuse1 is not None:
            monkeypatch.setattr(torch._C, "_get_privateuse1_backend_name", lambda: self.privateuse1)

    def _select(self, index: int) -> None:
        self.current_index = int(index)


def fake_accelerator(monkeypatch: pytest.MonkeyPatch, device_type: str = "mtia", *, count: int = 2,
                     privateuse1: str | None = None) -> FakeAccelerator:
    """Make torch report ``device_type`` (with ``count`` devices) as its present accelerator; returns the recorder.

    ``privateuse1=NAME`` reports a renamed PrivateUse1 backend ``NAME`` as the accelerator instead
    (``device_type`` is then ``NAME``).
    """
    fake = FakeAccelerator(privateuse1 or device_type, count, privateuse1)
    fake.install(monkeypatch)
    if privateuse1:
        # An out-of-tree backend is tried in a child process before it is trusted; the fake exists in this
        # process only, so it stands for a backend this machine has already tried and found working.
        from devplug.plugins.generic import trial

        trial.remember(privateuse1, {item: "" for item in trial.ITEMS})
    return fake


@pytest.fixture
def accelerator(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAccelerator]:
    """A fake ``mtia`` accelerator with two devices (see the module docstring)."""
    yield fake_accelerator(monkeypatch)
