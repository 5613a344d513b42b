"""``devplug doctor``'s findings: versions, the environment that changes device behaviour, what goes wrong.

Every plugin contributes a `DoctorReport` through ``devplug_doctor``; this
module merges them: versions of each plugin's stack (from package metadata, nothing imported), the
variables set that the plugins declare, incompatible pairs (a plugin's own, plus any requirement a
stack's distribution declares that the installed packages do not meet) and warnings. A plugin whose hook
fails, or does not answer within the time limit (``DEVPLUG_PROBE_TIMEOUT``), is itself a finding, never a
crash or a hang.
"""

from __future__ import annotations

import fnmatch
import importlib.metadata as metadata
import os
import time
from collections.abc import Mapping

import attrs
from packaging.requirements import InvalidRequirement, Requirement

from devplug.core.contract.records import DoctorReport
from devplug.core.registry.bounded import ENV_TIME_LIMIT, BoundedCall, seconds, time_limit
from devplug.core.registry.manager import DevplugPluginManager


@attrs.frozen
class Finding:
    """One line of the report and the plugin that contributed it."""

    plugin: str
    text: str


@attrs.define
class Diagnosis:
    """Everything doctor found, merged across plugins, in contribution order."""

    versions: dict[str, str] = attrs.field(factory=dict)
    env_patterns: list[str] = attrs.field(factory=list)
    incompatible: list[Finding] = attrs.field(factory=list)
    warnings: list[Finding] = attrs.field(factory=list)

    def environment(self, environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
        """Each declared variable that is set (with its value), and each exact name that is not (``None``)."""
        environ = os.environ if environ is None else environ
        found: dict[str, str | None] = {}
        for pattern in self.env_patterns:
            if "*" in pattern:
                found.update({k: environ[k] for k in sorted(environ) if fnmatch.fnmatchcase(k, pattern)})
            else:
                found.setdefault(pattern, environ.get(pattern))
        return found


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (from its metadata), or ``None``."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def unmet_requirements(distribution: str) -> list[str]:
    """Requirements ``distribution`` declares (no extras) that the installed packages do not meet, one line each."""
    try:
        declared = metadata.requires(distribution) or []
    except metadata.PackageNotFoundError:
        return []
    version = installed_version(distribution)
    problems = []
    for text in declared:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        have = installed_version(requirement.name)
        if have is not None and requirement.specifier and not requirement.specifier.contains(have, prereleases=True):
            problems.append(f"{distribution} {version} requires {requirement.name}{requirement.specifier}, "
                            f"but {requirement.name} {have} is installed")
    return problems


def diagnose(pm: DevplugPluginManager, *, deadline: float | None = None) -> Diagnosis:
    """Ask every plugin for its `DoctorReport` and merge them.

    The hooks run at once, each in its own thread; one that has not answered by ``deadline`` (a
    ``time.monotonic()`` value; default: one time limit from now, ``DEVPLUG_PROBE_TIMEOUT``) is named in the
    warnings and left out.
    """
    limit = time_limit()
    deadline = time.monotonic() + limit if deadline is None else deadline
    impls = pm.hook.devplug_doctor.get_hookimpls()  # the core fallback (trylast) first, then load order
    calls = [(impl, BoundedCall(impl.function, f"devplug_doctor of {impl.plugin_name!r}")) for impl in impls]
    diagnosis = Diagnosis()
    for impl, call in calls:
        if not call.wait_until(deadline):
            diagnosis.warnings.append(Finding(impl.plugin_name, (
                f"its doctor hook did not answer within {seconds(limit)} and was left out (plugin "
                f"{impl.plugin_name!r} from {pm.distribution_of(impl.plugin_name)}; {ENV_TIME_LIMIT} sets the limit)")))
            continue
        try:
            report = call.result()
        except (Exception, SystemExit) as exc:  # guarded hooks raise PluginError; doctor itself must not crash
            diagnosis.warnings.append(Finding(impl.plugin_name, f"its doctor hook failed: {exc}"))
            continue
        if isinstance(report, DoctorReport):  # or None: the guard let nothing else through
            _merge(diagnosis, impl.plugin_name, report)
    return diagnosis


def _merge(diagnosis: Diagnosis, plugin: str, report: DoctorReport) -> None:
    for package in report.packages:
        diagnosis.versions.setdefault(package, installed_version(package) or "not installed")
        for problem in unmet_requirements(package):
            diagnosis.incompatible.append(Finding(plugin, problem))
    for name, value in report.versions.items():
        diagnosis.versions.setdefault(str(name), str(value))
    diagnosis.env_patterns += [p for p in report.env if p not in diagnosis.env_patterns]
    diagnosis.incompatible += [Finding(plugin, line) for line in report.incompatible]
    diagnosis.warnings += [Finding(plugin, line) for line in report.warnings]
