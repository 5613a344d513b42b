"""``Trainer(compile=True)`` with a plugin written before compile plans (contract 1.7): its ``devplug_compile``
compiles the module, as the contract's minor versions promise (they only add), instead of being passed over
for the core fallback's plan."""

from __future__ import annotations

import pytest
import torch

import devplug
from devplug.core.registry.manager import create_plugin_manager


class CompilesItself:
    """A CPU-typed device whose plugin (contract 1.6) compiles with its own backend through ``devplug_compile``."""

    DEVPLUG_CONTRACT = "1.6"

    def __init__(self, answer: str = "compiled", plan: bool = False) -> None:
        self.calls: list[dict[str, object]] = []
        self.answer = answer
        if plan:  # a 1.7 plugin that also states its plan: the plan wins
            self.devplug_compile_plan = devplug.hookimpl(lambda: devplug.CompilePlan(backend="eager"))

    @devplug.hookimpl
    def devplug_register_devices(self):
        return devplug.DeviceSpec(name="selfcompiling", description="compiles through devplug_compile", priority=-5,
                                  probe=devplug.Availability.yes, torch_type="cpu")

    @devplug.hookimpl
    def devplug_compile(self, module, options):
        self.calls.append(dict(options))
        return torch.compile(module, backend="eager") if self.answer == "compiled" else self.answer


def _set_up(plugin: CompilesItself) -> devplug.Trainer:
    pm = create_plugin_manager(autoload=False, extra_plugins=[("selfcompiling", plugin)])
    return devplug.Trainer(device="selfcompiling", precision="32-true", progress=False, plugin_manager=pm,
                           compile=True, compile_options={"dynamic": False})


def test_a_plugin_that_compiles_through_devplug_compile_is_called_and_its_module_used():
    plugin = CompilesItself()
    trainer = _set_up(plugin)
    model = trainer.setup(torch.nn.Linear(3, 1))
    assert plugin.calls == [{"dynamic": False}]  # the author's options are passed on
    assert isinstance(model, torch._dynamo.eval_frame.OptimizedModule)
    assert trainer.summary()["compiled"] == {"linear": "compiled whole by devplug_compile of plugin 'selfcompiling'"}
    assert model(torch.ones(2, 3)).shape == (2, 1)
    trainer.close()


def test_a_plugin_with_a_compile_plan_is_compiled_by_its_plan_not_its_compile_hook():
    plugin = CompilesItself(plan=True)
    trainer = _set_up(plugin)
    trainer.setup(torch.nn.Linear(3, 1))
    assert plugin.calls == []
    assert trainer.summary()["compiled"] == {"linear": "compiled whole with eager"}
    trainer.close()


def test_a_compile_hook_answer_that_cannot_be_called_is_refused_naming_the_plugin():
    trainer = _set_up(CompilesItself(answer="compiled!"))
    with pytest.raises(devplug.PluginError, match="devplug_compile of plugin 'selfcompiling' returned 'compiled!', "
                                                  "which cannot be called"):
        trainer.setup(torch.nn.Linear(3, 1))
    trainer.close()


def test_where_only_the_fallback_compiles_the_fallbacks_plan_is_applied():
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, compile=True,
                              plugin_manager=create_plugin_manager(autoload=False))
    trainer.setup(torch.nn.Linear(3, 1))
    assert trainer.summary()["compiled"] == {"linear": "compiled whole with inductor"}
    trainer.close()
