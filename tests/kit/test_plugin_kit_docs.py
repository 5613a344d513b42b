"""The device-neutral plugin examples in docs/plugins.md run as written."""

from __future__ import annotations

import re
import types

import pytest
import torch
from paths import REPO

import devplug
from devplug.core.contract import hookspecs
from devplug.core.registry.devices import DeviceHooks, DeviceRegistry
from devplug.core.registry.manager import create_plugin_manager

GUIDE = REPO / "docs" / "plugins.md"


def snippet(marker: str) -> types.ModuleType:
    """The python block of docs/plugins.md containing ``marker``, executed as a plugin module."""
    blocks = [b for b in re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S) if marker in b]
    assert len(blocks) == 1, f"expected one python block with {marker!r} in docs/plugins.md"
    source = blocks[0] if "import devplug" in blocks[0] else "import devplug\n" + blocks[0]
    module = types.ModuleType(f"doc_snippet_{abs(hash(marker))}")
    exec(compile(source, str(GUIDE), "exec"), module.__dict__)
    return module


def hooks_for(device_name: str, plugin: types.ModuleType) -> DeviceHooks:
    """Hooks routed for ``device_name`` (resolved or not: routing needs only the record) with ``plugin``."""
    registry = DeviceRegistry(create_plugin_manager(autoload=False, extra_plugins=[("docplugin", plugin)]))
    entry = registry.devices[device_name]
    return DeviceHooks(registry, devplug.Device(spec=entry.spec, index=None, plugin_name=entry.plugin_name))


def test_the_cuda_optimizer_policy_applies_to_cuda_only():
    policy = snippet("@devplug.hookimpl(tryfirst=True)")
    params = [torch.nn.Parameter(torch.zeros(3))]
    on_cuda = hooks_for("cuda", policy)(hookspecs.devplug_optimizer, name="adamw", params=params, options={"lr": 0.1})
    assert on_cuda.implementation == "torch.optim.AdamW(fused=True) [my-policy]"
    on_cpu = hooks_for("cpu", policy)(hookspecs.devplug_optimizer, name="adamw", params=params, options={"lr": 0.1})
    assert "[my-policy]" not in on_cpu.implementation  # returned None: the cpu plugin decided as before


def test_the_profiler_wrapper_wraps_step_marking_and_shows_in_a_trace():
    wrapper = snippet('record_function(f"mark_step:{phase.value}")')
    pm = create_plugin_manager(autoload=False, extra_plugins=[("profiler", wrapper)])
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, plugin_manager=pm)
    model = trainer.setup(torch.nn.Linear(2, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        trainer.backward(model(torch.ones(1, 2)).sum())
        trainer.step(opt)
    names = {event.name for event in prof.events()}
    assert {"mark_step:backward", "mark_step:optimizer_step"} <= names


def test_the_auditing_wrapper_adjusts_what_the_device_plugin_built():
    audit = snippet('" [audited]"')
    pm = create_plugin_manager(autoload=False, extra_plugins=[("audit", audit)])
    trainer = devplug.Trainer(device="cpu", progress=False, plugin_manager=pm)
    opt = trainer.optimizer("adam", trainer.setup(torch.nn.Linear(2, 1)).parameters(), lr=1e-3)
    assert trainer.optimizer_implementation(opt).endswith(" [audited]")


@pytest.mark.parametrize("hook", ["devplug_optimizer", "devplug_mark_step"])
def test_cli_marks_the_snippets_hooks_with_their_pluggy_options(hook):
    from devplug.cli import plugin_infos

    module = snippet("@devplug.hookimpl(tryfirst=True)" if hook == "devplug_optimizer" else "nvtx.range_push")
    [info] = [i for i in plugin_infos(create_plugin_manager(autoload=False, extra_plugins=[("doc", module)]))
              if i.name == "doc"]
    assert info.kind == "device-neutral" and info.contract == devplug.CONTRACT_VERSION
    assert info.hooks == ((f"{hook} [tryfirst]",) if hook == "devplug_optimizer" else (f"{hook} [wrapper]",))


# ---- the rules and versions docs/plugins.md states ------------------------------------------------------
def test_the_documented_contract_messages_are_the_real_ones():
    from devplug.core.contract.versions import contract_problem

    page = GUIDE.read_text()
    for declared in re.findall(r"was skipped: it (?:needs|declares) hook contract '([\d.]+)'", page):
        assert f"was skipped: {contract_problem(declared)}" in page, f"the message for contract {declared!r}"


def test_the_release_table_pairs_this_release_with_its_contract():
    major_minor = ".".join(devplug.__version__.split(".")[:2])
    row = next(line for line in GUIDE.read_text().splitlines() if line.startswith(f"| {major_minor}.x |"))
    assert row.split("|")[2].strip() == devplug.CONTRACT_VERSION


def test_the_template_and_the_guide_quote_the_current_contract_and_one_pin():
    from devplug import docgen

    texts = [GUIDE.read_text()] + [path.read_text() for path in docgen.template_files()]
    pins = {pin for text in texts for pin in re.findall(r"devplug>=[\d.]+,<\d+", text)}
    assert pins == {docgen.release_pin()}
    contracts = {c for text in texts for c in re.findall(r'DEVPLUG_CONTRACT = "([\d.]+)"(?!\s*# written for)', text)}
    assert contracts == {devplug.CONTRACT_VERSION}
    assert 'license = "Apache-2.0"' in (docgen.TEMPLATE / "pyproject.toml").read_text()  # SPDX: no warning


def test_a_torch_optim_subclass_is_portable_when_it_keeps_torchs_layout_else_needs_converters():
    """As the guide says: a subclass with torch's state is canonical; one with state of its own needs converters."""
    import attrs

    from devplug.core.optim.canonical import export_state

    class Clipped(torch.optim.AdamW):
        pass

    class Counting(torch.optim.AdamW):
        def step(self, closure=None):
            loss = super().step(closure)
            for group in self.param_groups:
                for p in group["params"]:
                    self.state[p]["calls"] = self.state[p].get("calls", 0) + 1
            return loss

    for cls, layout in ((Clipped, "canonical"), (Counting, "native")):
        params = [torch.nn.Parameter(torch.ones(2))]
        optimizer = cls(params, lr=0.1)
        params[0].grad = torch.ones(2)
        optimizer.step()
        choice = devplug.OptimizerChoice(optimizer, cls.__name__, algorithm="adamw")
        assert export_state(choice)["layout"] == layout, cls
    identity = attrs.evolve(choice, to_canonical=lambda opt, state: {**state, "state": {
        k: {n: v for n, v in s.items() if n != "calls"} for k, s in state["state"].items()}},
        from_canonical=lambda opt, state: state)
    assert export_state(identity)["layout"] == "canonical"


def test_a_16_mixed_plan_without_a_scaler_is_what_the_guide_forbids():
    """The built-in plans follow the rule: 16-mixed carries a scaler, bf16-mixed and 32-true do not."""
    from devplug.toolkit import autocast_plan

    device = devplug.Trainer(device="cpu", progress=False).device
    assert autocast_plan(device, "16-mixed").scaler is not None
    assert autocast_plan(device, "bf16-mixed").scaler is None
    assert autocast_plan(device, "32-true").scaler is None


def test_the_template_readme_describes_every_hook_it_implements():
    from devplug import docgen

    readme = (docgen.TEMPLATE / "README.md").read_text()
    rows = set(re.findall(r"^\| `(devplug_\w+)` \|", readme, re.M))
    assert rows == set(docgen.template_hooks()) == {fn.__name__ for fn in hookspecs.HOOKS}
