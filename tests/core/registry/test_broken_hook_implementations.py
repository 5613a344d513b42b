"""Hook implementations a plugin author gets wrong, reported in one line naming the plugin: an argument the
hook does not have, an old-style ``hookwrapper=True`` that forces a wrong answer or raises, a wrong answer
whose repr spans several lines."""

from __future__ import annotations

import pytest
import torch

import devplug
from devplug.core.registry.manager import create_plugin_manager


def _loaded(name: str, plugin: object):
    return create_plugin_manager(autoload=False, extra_plugins=[(name, plugin)])


def test_an_argument_the_hook_does_not_have_is_refused_in_one_line_that_says_what_the_hook_takes():
    class Renamed:
        @devplug.hookimpl
        def devplug_optimizer(self, device, name, parameters, options):
            return None

    pm = _loaded("renamed", Renamed())
    [failure] = pm.failures
    assert "\n" not in failure.error
    assert failure.error.startswith("its devplug_optimizer takes parameters, which the hook does not have")
    assert "devplug_optimizer takes device, name, params, options" in failure.error
    assert pm.get_plugin("renamed") is None


def test_a_wrapper_that_does_not_yield_is_refused_in_one_line():
    class NotAGenerator:
        @devplug.hookimpl(wrapper=True)
        def devplug_optimizer(self, device, name):
            return None

    [failure] = _loaded("nogen", NotAGenerator()).failures
    assert "\n" not in failure.error
    assert "devplug_optimizer" in failure.error and "not a generator function" in failure.error


class ForcesAnswer:
    """An old-style pluggy wrapper (``hookwrapper=True``) replacing the optimizer hook's answer."""

    def __init__(self, answer):
        self.answer = answer

    @devplug.hookimpl(hookwrapper=True)
    def devplug_optimizer(self, name):
        outcome = yield
        if self.answer is not None:
            outcome.force_result(self.answer)


def _optimizer_through(plugin: object) -> str:
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False,
                              plugin_manager=_loaded("oldwrap", plugin))
    model = trainer.setup(torch.nn.Linear(2, 1))
    try:
        return trainer.optimizer_implementation(trainer.optimizer("sgd", model.parameters(), lr=0.1))
    finally:
        trainer.close()


def test_an_old_style_wrapper_forcing_a_wrong_answer_is_refused_naming_the_plugin():
    with pytest.raises(devplug.PluginError) as caught:
        _optimizer_through(ForcesAnswer(42))
    message = str(caught.value)
    assert message.startswith("devplug_optimizer of plugin 'oldwrap' (registered at run time) returned 42")
    assert "not a devplug.OptimizerChoice" in message


def test_an_old_style_wrapper_that_passes_the_answer_through_changes_nothing():
    assert _optimizer_through(ForcesAnswer(None)).startswith("torch.optim.SGD")


@pytest.mark.parametrize("where", ["before", "after"])
def test_an_old_style_wrapper_that_raises_is_named(where):
    class Raises:
        @devplug.hookimpl(hookwrapper=True)
        def devplug_optimizer(self, name):
            if where == "before":
                raise KeyError("sgd")
            yield
            raise KeyError("sgd")

    with pytest.raises(devplug.PluginError, match=r"^devplug_optimizer of plugin 'oldwrap' \(registered at run "
                                                  r"time\) raised KeyError: 'sgd'$"):
        _optimizer_through(Raises())


def test_a_wrong_answer_is_described_in_one_line_however_long_its_repr():
    class BareOptimizer:
        @devplug.hookimpl
        def devplug_optimizer(self, params, options):
            return torch.optim.SGD(params, **options)

    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False,
                              plugin_manager=_loaded("bare", BareOptimizer()))
    model = trainer.setup(torch.nn.Linear(2, 1))
    with pytest.raises(devplug.PluginError) as caught:
        trainer.optimizer("sgd", model.parameters(), lr=0.1)
    trainer.close()
    assert "\n" not in str(caught.value)
    assert "returned SGD ( Parameter Group 0" in str(caught.value)
    assert "(a torch.optim.sgd.SGD), not a devplug.OptimizerChoice" in str(caught.value)


def test_a_loader_that_cannot_be_iterated_is_refused_when_built_naming_the_plugin():
    class NotALoader:
        @devplug.hookimpl
        def devplug_dataloader(self):
            return devplug.LoaderChoice(loader=5, implementation="broken loader")

    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False,
                              plugin_manager=_loaded("noloader", NotALoader()))
    dataset = torch.utils.data.TensorDataset(torch.zeros(4, 2))
    refusal = (r"^devplug_dataloader of plugin 'noloader' \(registered at run time\) returned a LoaderChoice whose "
               r"loader is 5 \(a int\), which cannot be iterated over batches")
    with pytest.raises(devplug.PluginError, match=refusal):
        trainer.dataloader(dataset, batch_size=2, num_workers=0)
    trainer.close()


@pytest.mark.parametrize("figure", [-5, 1.5, True])
def test_a_memory_figure_that_is_not_a_byte_count_is_refused_naming_the_plugin(figure):
    class OddMemory:
        @devplug.hookimpl
        def devplug_memory_stats(self):
            return devplug.MemoryStats(allocated=10, peak_allocated=figure)

    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False,
                              plugin_manager=_loaded("oddmemory", OddMemory()))
    refusal = (r"^devplug_memory_stats of plugin 'oddmemory' .* returned "
               rf"MemoryStats.peak_allocated = {figure!r}; MemoryStats.peak_allocated must be a number of bytes")
    with pytest.raises(devplug.PluginError, match=refusal):
        trainer.memory_stats()
    trainer.close()


def test_byte_counts_and_unreported_figures_are_taken():
    class Memory:
        @devplug.hookimpl
        def devplug_memory_stats(self):
            return devplug.MemoryStats(allocated=10, peak_allocated=0)

    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False,
                              plugin_manager=_loaded("memory", Memory()))
    assert trainer.memory_stats() == devplug.MemoryStats(allocated=10, peak_allocated=0)
    trainer.close()
