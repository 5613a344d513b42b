"""Running the checks without pytest: `run_checks` runs every check and returns one result each.

``devplug check <device>`` prints these results; the pytest base class
`devplug.testing.DeviceConformance` runs the same checks as one test each.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from devplug.core.contract.records import PRECISIONS, Phase
from devplug.core.errors import DevplugError
from devplug.core.registry.manager import DevplugPluginManager
from devplug.testing.checks import registered_checks
from devplug.testing.kit import STANDARD_OPTIMIZERS, CheckSpec, DeviceUnderTest, NotApplicable, open_device

#: The outcomes of a check: ``advisory`` is a failed check the plugin need not pass yet (it declares a
#: contract older than the one that introduced the check).
OUTCOMES = ("passed", "failed", "not applicable", "advisory")


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
        cases = [None] if spec.over is None else list(selection[spec.over])
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
    fails (see `DeviceUnderTest.contract`).
    """
    defaults: dict[str, Any] = {"optimizer_names": STANDARD_OPTIMIZERS, "precisions": PRECISIONS,
                                "training_precision": "auto", "run_compiled": False}
    unknown = sorted(set(selection) - set(defaults))
    if unknown:
        raise TypeError(f"run_checks() got unexpected selection {', '.join(unknown)}; "
                        f"choose from {', '.join(defaults)}")
    dut = open_device(name, plugin_manager, options=options)
    results = []
    for check_name, spec, check in _expanded({**defaults, **selection, "phases": list(Phase)}):
        try:
            results.append(CheckResult(check_name, "passed", check(dut), spec.since))
            continue
        except NotApplicable as exc:
            results.append(CheckResult(check_name, "not applicable", str(exc), spec.since))
            continue
        except (AssertionError, DevplugError) as exc:
            detail = str(exc)
        except Exception as exc:
            detail = f"{dut.label}: {type(exc).__name__}: {exc}"
        if dut.holds_to(spec.since):
            results.append(CheckResult(check_name, "failed", detail, spec.since))
        else:
            results.append(CheckResult(check_name, "advisory", f"{detail} (introduced in contract {spec.since}; "
                                       f"the plugin declares {dut.contract}, so it need not pass yet)", spec.since))
    return results
