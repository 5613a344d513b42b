"""The public marker plugins use: ``@devplug.hookimpl`` (pluggy's HookimplMarker for "devplug")."""

import pluggy

from devplug.core.contract.hookspecs import PROJECT

hookimpl = pluggy.HookimplMarker(PROJECT)
"""The marker of a hook implementation: ``@devplug.hookimpl`` over a ``devplug_*`` function of a plugin."""
