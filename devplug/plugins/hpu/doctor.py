"""What the Gaudi plugin tells ``devplug doctor``: its stack, the variables that change the bridge, pitfalls.

Read from package metadata and the environment only: the bridge is not imported (it would settle the
execution mode and claim a device).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from devplug import DoctorReport
from devplug.plugins.hpu.mode import EAGER_DEFAULT_SINCE, ENV_LAZY, bridge_release

PACKAGES = ("habana-torch-plugin", "habana-torch-dataloader", "habana-media-loader")
ENV = (ENV_LAZY, "PT_HPU_*", "HABANA_VISIBLE_DEVICES", "HABANA_VISIBLE_MODULES", "HCCL_*", "PT_HCCL_*")


def declared_mode(environ: Mapping[str, str] | None = None) -> str | None:
    """``"lazy"`` or ``"eager"``, as ``PT_HPU_LAZY_MODE`` and the installed release's default say; ``None``
    when neither the variable nor the bridge is there (nothing to say about Gaudi)."""
    environ = os.environ if environ is None else environ
    release = bridge_release()
    value = environ.get(ENV_LAZY)
    if value is None and release is None:
        return None
    default = "0" if release is not None and release >= EAGER_DEFAULT_SINCE else "1"
    return "eager" if (value if value is not None else default).strip() == "0" else "lazy"


def warnings(environ: Mapping[str, str] | None = None) -> list[str]:
    """Pitfalls of the execution mode in effect."""
    if declared_mode(environ) != "lazy":
        return []
    return [f"lazy mode ({ENV_LAZY}=1): build training loaders with drop_last=True; a smaller last batch "
            "compiles (and caches) a second graph for its shape every epoch"]


def report() -> DoctorReport:
    """The Gaudi plugin's contribution to ``devplug doctor``."""
    mode = declared_mode()
    return DoctorReport(packages=PACKAGES, versions={"Gaudi execution mode": mode} if mode else {}, env=ENV,
                        warnings=warnings())
