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
from devplug.testing.kit import STANDARD_OPTIMIZERS, DeviceUnderTest, NotApplicable, open_device


@attrs.frozen
class CheckResult:
    """One check's outcome: ``"passed"``, ``"failed"`` or ``"not applicable"``, with what it saw."""

    name: str
    outcome: str
    detail: str

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
    result: list[tuple[str, Callable[[DeviceUnderTest], str]]] = []
    for spec in registered_checks():
        kwargs = {arg: selection[key] for arg, key in spec.options.items()}
        cases = [None] if spec.over is None else list(selection[spec.over])
        for case in cases:
            label = spec.name if case is None else f"{spec.name}[{getattr(case, 'value', case)}]"
            args = () if case is None else (case,)
            result.append((label, _bind(spec.function, args, kwargs)))
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

    ``selection`` is passed to `all_checks` (``optimizer_names``, ``precisions``, ...).
    """
    dut = open_device(name, plugin_manager, options=options)
    results = []
    for check_name, check in all_checks(**selection):
        try:
            results.append(CheckResult(check_name, "passed", check(dut)))
        except NotApplicable as exc:
            results.append(CheckResult(check_name, "not applicable", str(exc)))
        except (AssertionError, DevplugError) as exc:
            results.append(CheckResult(check_name, "failed", str(exc)))
        except Exception as exc:
            results.append(CheckResult(check_name, "failed", f"{dut.label}: {type(exc).__name__}: {exc}"))
    return results
