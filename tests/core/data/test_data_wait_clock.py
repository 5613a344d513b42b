"""The time a batch is waited for counts the loader alone, not the stop check made at the same step boundary.

Under several processes the stop check is a collective: it waits for the slowest rank to finish its step. Counted
as data wait, that time would report a loader-bound run (and advise more workers) where a rank is slow.
"""

from __future__ import annotations

import torch

from devplug.core.data import device_loader
from devplug.core.data.device_loader import DeviceLoader, own_loader_choice
from devplug.core.data.position import LoopPosition


def test_the_stop_check_is_not_counted_as_waiting_for_data(monkeypatch):
    now = [0.0]

    def stop_check() -> bool:  # a collective that waits 1 s for another rank
        now[0] += 1.0
        return False

    monkeypatch.setattr(device_loader.time, "perf_counter", lambda: now[0])
    waits: list[float] = []
    position = LoopPosition(stop_check=stop_check)
    loader = DeviceLoader(own_loader_choice([torch.zeros(2, 3)] * 4, None), 0, position, lambda batch: batch,
                          lambda samples, seconds: waits.append(seconds))
    assert len(list(loader)) == 4 and now[0] == 5.0  # the check ran before each batch, and before the end
    assert waits == [0.0] * 4
