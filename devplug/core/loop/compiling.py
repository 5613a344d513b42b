"""``Trainer(compile=True)``: the device plugin's `CompilePlan` applied per block under FSDP, whole otherwise.

Under FSDP the blocks ``fully_shard`` was applied to are compiled one by one in place
(``nn.Module.compile``), as torchtitan compiles each transformer block rather than the sharded root: the
all-gathers and reduce-scatters between blocks stay outside the graphs, and parameter names (hence
checkpoints) stay those of the uncompiled model. A module without sharded blocks is compiled whole.

A plugin written before compile plans (contract 1.7) compiles through ``devplug_compile`` instead: where
only the core fallback answers ``devplug_compile_plan`` and a plugin implements ``devplug_compile``, that
hook compiles the module (whole), as it did before plans existed, rather than being passed over.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from devplug.core.contract import hookspecs
from devplug.core.contract.records import CompilePlan
from devplug.core.distributed.fsdp import is_sharded
from devplug.core.errors import PluginError


def compile_options(plan: CompilePlan, author: Mapping[str, Any]) -> dict[str, Any]:
    """``torch.compile`` keyword arguments: the plan's backend and options, the author's laid over them."""
    return {"backend": plan.backend, **plan.options, **author}


def sharded_blocks(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The submodules ``fully_shard`` was applied to, the root excluded, outermost first (none nested)."""
    blocks: list[torch.nn.Module] = []
    inside: set[int] = set()
    for child in module.modules():
        if child is module or id(child) in inside or not is_sharded(child):
            continue
        blocks.append(child)
        inside.update(id(m) for m in child.modules())
    return blocks


def apply_compile(module: torch.nn.Module, plan: CompilePlan, author: Mapping[str, Any]) -> tuple[Any, str]:
    """Compile ``module`` as ``plan`` says; the module to use and a line for the summary saying what was done."""
    options = compile_options(plan, author)
    backend = options.get("backend")
    if backend is None:
        return module, f"not compiled: {plan.reason}"
    blocks = sharded_blocks(module)
    if blocks:
        for block in blocks:
            block.compile(**options)
        kinds = sorted({type(block).__name__.removeprefix("FSDP") for block in blocks})
        return module, f"{len(blocks)} sharded blocks ({', '.join(kinds)}) compiled with {backend}"
    return torch.compile(module, **options), f"compiled whole with {backend}"


def compiles_by_hook(hooks: Any, plan_from: str | None, fallback: str) -> bool:
    """True where the plan came from the core fallback (``plan_from``) and a plugin implements ``devplug_compile``."""
    return plan_from == fallback and any(name != fallback for name in hooks.answered_by(hookspecs.devplug_compile))


def compile_by_hook(hooks: Any, module: torch.nn.Module, author: Mapping[str, Any]) -> tuple[Any, str]:
    """``module`` compiled by the plugin's ``devplug_compile`` (the author's options passed on); the module to use
    and a line for the summary. An answer that cannot be called is a `PluginError` naming the plugin."""
    compiled, plugin = hooks.first_answer(hookspecs.devplug_compile, module=module, options=dict(author))
    if compiled is None or not callable(compiled):
        raise PluginError(f"devplug_compile of plugin {plugin or 'unknown'!r} returned {compiled!r}, which cannot be "
                          "called; it returns the compiled module (or None to defer)")
    return compiled, f"compiled whole by devplug_compile of plugin {plugin or 'unknown'!r}"
