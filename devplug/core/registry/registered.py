"""A device a plugin registered, and its availability probe run once under the time limit.

The probe runs in a daemon thread (`BoundedCall`); one that does not
answer within ``DEVPLUG_PROBE_TIMEOUT`` seconds makes the device unavailable ("probe timed out after N s"),
naming the plugin and its distribution, and is logged as a warning. A probe that timed out and is still
running is waited on again by a later registry rather than started a second time.
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import attrs

from devplug.core.contract.records import Availability, DeviceSpec
from devplug.core.registry.bounded import ENV_TIME_LIMIT, BoundedCall, seconds, time_limit
from devplug.core.registry.manager import ENV_BLOCK

log = logging.getLogger("devplug")


@attrs.define
class RegisteredDevice:
    """A device spec together with the plugin that registered it.

    Its probe runs at most once, in a daemon thread, under the time limit of
    `time_limit`: a probe that does not answer in time makes the
    device unavailable ("probe timed out after N s"), naming the plugin and its distribution.
    """

    spec: DeviceSpec
    plugin_name: str
    plugin: Any
    distribution: str
    _availability: Availability | None = attrs.field(default=None, alias="_availability")
    _probing: BoundedCall | None = attrs.field(default=None, init=False)
    _count_timed_out: bool = attrs.field(default=False, init=False)
    #: Why counting the devices failed (the count raised or answered something else than a number), or ``None``.
    count_problem: str | None = attrs.field(default=None, init=False)

    def start_probe(self) -> None:
        """Start the probe in the background (once) without waiting for it.

        A probe that timed out for an earlier registry and is still running is not started again: this
        registry waits on the same call, so a probe that hangs holds one thread, however many Trainers ask.
        """
        if self._availability is None and self._probing is None:
            earlier = _stuck_probes.get(_probe_key(self.spec))
            if earlier is not None and not earlier.done:
                self._probing = earlier
            else:
                self._probing = BoundedCall(self.spec.probe, f"probe of device {self.spec.name!r}")

    def availability(self, deadline: float | None = None) -> Availability:
        """Run the probe once, waiting up to the time limit (or until ``deadline``, a ``time.monotonic()`` value).

        A probe that raises reports the exception as the reason; one that does not answer in time reports
        that, naming the plugin and its distribution.
        """
        if self._availability is None:
            self.start_probe()
            assert self._probing is not None
            limit = time_limit()
            if not self._probing.wait_until(self._probing.started + limit if deadline is None else deadline):
                self._availability = self._timed_out(limit)
                return self._availability
            try:
                result = self._probing.result()
                if not isinstance(result, Availability):
                    raise TypeError(f"probe returned {result!r}, not an Availability")
                if not result.available and not str(result.reason).strip():
                    result = Availability.no(
                        f"its availability probe said so without a reason (plugin {self.plugin_name!r}, "
                        f"{self.distribution})", result.fix or f"report this to the maintainers of {self.distribution}"
                        ": a probe says why with Availability.no(reason, fix)")
            except BaseException as exc:  # raised in the probe's own thread (a Ctrl-C reaches the main thread)
                result = Availability.no(
                    f"its availability probe raised {type(exc).__name__}: {exc}",
                    f"report this to the maintainers of {self.distribution}",
                )
            self._availability = result
        return self._availability

    @property
    def probe_timed_out(self) -> bool:
        """True when the probe was waited on and did not answer within the time limit (it may still be running)."""
        return self._availability is not None and self._probing is not None and not self._probing.done

    def _timed_out(self, limit: float) -> Availability:
        if self._probing is not None:
            _stuck_probes[_probe_key(self.spec)] = self._probing
        who = f"plugin {self.plugin_name!r} ({self.distribution})"
        log.warning("device %r of %s: its availability probe did not answer within %s; treated as unavailable "
                    "(%s sets the limit)", self.spec.name, who, seconds(limit), ENV_TIME_LIMIT)
        return Availability.no(
            f"probe timed out after {seconds(limit)} ({who})",
            f"if the device is slow to start, raise {ENV_TIME_LIMIT} (seconds); otherwise skip the plugin with "
            f"{ENV_BLOCK}={self.plugin_name} and report the hanging probe to the maintainers of {self.distribution}",
        )

    def count(self) -> int:
        """How many devices of this type are visible (0 when unavailable, when counting fails or times out).

        A count that raises or answers something else than a whole number of devices is logged once, naming
        the plugin, and kept in `count_problem` for the errors that depend on the count.
        """
        if self._count_timed_out or self.count_problem is not None or not self.availability().available:
            return 0
        limit = time_limit()
        counting = BoundedCall(self.spec.count, f"count of device {self.spec.name!r}")
        if not counting.wait(limit):
            self._count_timed_out = True
            log.warning("device %r of plugin %r (%s): counting its devices did not finish within %s; counted 0",
                        self.spec.name, self.plugin_name, self.distribution, seconds(limit))
            return 0
        try:
            answer = counting.result()
        except BaseException as exc:  # raised in the count's own thread, as the probe's
            return self._count_failed(f"raised {type(exc).__name__}: {exc}")
        try:
            number = -1 if isinstance(answer, bool) else operator.index(answer)
        except TypeError:
            number = -1
        if number < 0:
            return self._count_failed(f"returned {answer!r}, not a number of devices")
        return number

    def _count_failed(self, what: str) -> int:
        self.count_problem = (f"DeviceSpec.count of device {self.spec.name!r} (plugin {self.plugin_name!r}, "
                              f"{self.distribution}) {what}; report this to the maintainers of {self.distribution}")
        log.warning("%s; counted 0", self.count_problem)
        return 0


#: Probes that timed out and may still be running, by device spec: a later registry waits on them.
_stuck_probes: dict[tuple[str, int], BoundedCall] = {}


def _probe_key(spec: DeviceSpec) -> tuple[str, int]:
    return (spec.name, id(spec.probe))
