"""Running the checks without pytest: `iter_checks` runs every check and yields one result each as it
finishes, `run_checks` returns them all.

Each check runs under a time limit (``DEVPLUG_CHECK_TIMEOUT`` seconds, default `DEFAULT_CHECK_TIME_LIMIT`)
in a daemon thread: a check that does not finish in time fails, naming the hook it was stuck in, and the
run goes on. ``devplug check <device>`` prints the results as they come; the pytest base class
`devplug.testing.DeviceConformance` runs the same checks as one test each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from devplug.core.contract.records import PRECISIONS, Phase
from devplug.core.errors import DevplugError
from devplug.core.registry.bounded import BoundedCall, seconds
from devplug.core.registry.manager import DevplugPluginManager
from devplug.core.validators import seconds_from_environment
from devplug.testing.checks import registered_checks
from devplug.testing.kit import (
    STANDARD_OPTIMIZERS,
    CheckSpec,
    DeviceUnderTest,
    NotApplicable,
    open_device,
    selection_cases,
)

#: The outcomes of a check: ``advisory`` is a failed check the plugin need not pass yet (it declares a
#: contract older than the one that introduced the check).
OUTCOMES = ("passed", "failed", "not applicable", "advisory")
#: The variable that sets each check's time limit, in seconds.
ENV_CHECK_TIME_LIMIT = "DEVPLUG_CHECK_TIMEOUT"
#: Seconds one check may take by default: the training checks run a few dozen steps on a slow device.
DEFAULT_CHECK_TIME_LIMIT = 300.0


def check_time_limit(environ: Mapping[str, str] | None = None) -> float:
    """Each check's time limit: ``DEVPLUG_CHECK_TIMEOUT`` (a positive number of seconds), else the default."""
    return seconds_from_environment(ENV_CHECK_TIME_LIMIT, DEFAULT_CHECK_TIME_LIMIT, environ)


@attrs.frozen
class CheckResult:
    """One check's outcome (one of `OUTCOMES`) with what it saw, and the contract that introduced it."""

    name: str
    outcome: str
    detail: str
    since: str = "1.0"

    def __str__(self) -> str:
        return f"{self.outcome.upper():<15} {self.name}: {self.detail}"


def all_checks(
    *,
    optimizer_names: Sequence[str] = STANDARD_OPTIMIZERS,
    precisions: Sequence[str] = PRECISIONS,
    training_precision: str = "auto",
    run_compiled: bool = False,
) -> list[tuple[str, Callable[[DeviceUnderTest], str]]]:
    """Every check as ``(name, function of a DeviceUnderTest)``, in the order `run_checks` runs them.

    The list follows the hook contract: each hook's checks in the order of the hook reference,
    parametrised checks expanded (``optimizer[adam]``), end-to-end checks last.
    """
    selection: dict[str, Any] = {"optimizer_names": optimizer_names, "precisions": precisions, "phases": list(Phase),
                                 "training_precision": training_precision, "run_compiled": run_compiled}
    return [(label, check) for label, _spec, check in _expanded(selection)]


def _expanded(selection: Mapping[str, Any]) -> list[tuple[str, CheckSpec, Callable[[DeviceUnderTest], str]]]:
    result: list[tuple[str, CheckSpec, Callable[[DeviceUnderTest], str]]] = []
    for spec in registered_checks():
        kwargs = {arg: selection[key] for arg, key in spec.options.items()}
        cases = [None] if spec.over is None else selection_cases(selection[spec.over])
        for case in cases:
            label = spec.name if case is None else f"{spec.name}[{getattr(case, 'value', case)}]"
            args = () if case is None else (case,)
            result.append((label, spec, _bind(spec.function, args, kwargs)))
    return result


def _bind(
    function: Callable[..., str], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Callable[[DeviceUnderTest], str]:
    return lambda dut: function(dut, *args, **kwargs)


def run_checks(
    name: str,
    plugin_manager: DevplugPluginManager | None = None,
    *,
    options: Mapping[str, Any] | None = None,
    **selection: Any,
) -> list[CheckResult]:
    """Run every check against device ``name`` and return the results (nothing raises but a missing device).

    ``selection`` is passed to `all_checks` (``optimizer_names``, ``precisions``, ...). A check
    introduced in a contract newer than the one the device's plugin declares is ``"advisory"`` when it
    fails (see `DeviceUnderTest.contract`). `iter_checks` yields the same results as they come.
    """
    return list(iter_checks(name, plugin_manager, options=options, **selection))


def iter_checks(
    name: str,
    plugin_manager: DevplugPluginManager | None = None,
    *,
    options: Mapping[str, Any] | None = None,
    time_limit: float | None = None,
    **selection: Any,
) -> Iterator[CheckResult]:
    """Run every check against device ``name``, yielding each result as soon as its check finishes.

    Each check runs under ``time_limit`` seconds (default `check_time_limit`); one that takes longer
    fails, naming the hook it is stuck in, and the next check runs. A check that raises anything (a
    plugin's ``BaseException`` included, but not ``KeyboardInterrupt``) fails; nothing else stops the run.
    """
    defaults: dict[str, Any] = {"optimizer_names": STANDARD_OPTIMIZERS, "precisions": PRECISIONS,
                                "training_precision": "auto", "run_compiled": False}
    unknown = sorted(set(selection) - set(defaults))
    if unknown:
        raise TypeError(f"run_checks() got unexpected selection {', '.join(unknown)}; "
                        f"choose from {', '.join(defaults)}")
    limit = check_time_limit() if time_limit is None else time_limit
    dut = open_device(name, plugin_manager, options=options)
    for check_name, spec, check in _expanded({**defaults, **selection, "phases": list(Phase)}):
        yield _run_one(dut, check_name, spec, check, limit)


def _run_one(dut: DeviceUnderTest, check_name: str, spec: CheckSpec, check: Callable[[DeviceUnderTest], str],
             limit: float) -> CheckResult:
    call = BoundedCall(lambda: check(dut), f"check {check_name}")
    if not call.wait(limit):
        label = call.running_hook()
        inside = (f"; it is stuck in {label}: report this to the maintainers of {label.distribution}"
                  if label is not None else "")
        detail = (f"{dut.label}: the check did not finish within {seconds(limit)} "
                  f"({ENV_CHECK_TIME_LIMIT} sets the limit){inside}")
        return _failed(dut, check_name, spec, detail)
    try:
        return CheckResult(check_name, "passed", call.result(), spec.since)
    except NotApplicable as exc:
        return CheckResult(check_name, "not applicable", str(exc), spec.since)
    except (AssertionError, DevplugError) as exc:
        detail = str(exc)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a plugin's exception of any kind fails its check, never the run
        detail = f"{dut.label}: {type(exc).__name__}: {exc}"
    return _failed(dut, check_name, spec, detail)


def _failed(dut: DeviceUnderTest, check_name: str, spec: CheckSpec, detail: str) -> CheckResult:
    if dut.holds_to(spec.since):
        return CheckResult(check_name, "failed", detail, spec.since)
    return CheckResult(check_name, "advisory", f"{detail} (introduced in contract {spec.since}; "
                       f"the plugin declares {dut.contract}, so it need not pass yet)", spec.since)
