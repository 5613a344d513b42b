"""Plugin answers checked where the Trainer receives them, at run time: a precision plan that is not the
precision asked for, a ``from_canonical`` that breaks its algorithm's state, a step hook that is slow or
never returns, a plugin written for an older contract given a setting it does not know."""

from __future__ import annotations

import logging
import time

import attrs
import pytest
import torch

import devplug
from devplug.core.registry.manager import create_plugin_manager
from devplug.core.registry.watchdog import watchdog
from devplug.toolkit import autocast_plan, forget_logged


def lying_precision(rename: dict[str, tuple[str, str]]):
    """A CPU-typed device whose plugin answers each precision in ``rename`` with another's plan under a chosen name."""

    class Lying:
        DEVPLUG_CONTRACT = "1.5"

        @devplug.hookimpl
        def devplug_register_devices(self):
            return devplug.DeviceSpec(name="liar", description="lies about precision", priority=5,
                                      probe=devplug.Availability.yes, torch_type="cpu")

        @devplug.hookimpl
        def devplug_precision(self, device, precision):
            if precision not in rename:
                return None
            built, named = rename[precision]
            return attrs.evolve(autocast_plan(device, built), name=named)

    return create_plugin_manager(autoload=False, extra_plugins=[("liar", Lying())])


@pytest.mark.parametrize(("asked", "built", "named", "message"), [
    ("bf16-mixed", "16-mixed", "bf16-mixed", "'bf16-mixed' plan whose autocast casts to float16"),
    ("32-true", "16-mixed", "32-true", "'32-true' plan whose autocast casts to float16"),
    ("bf16-mixed", "32-true", "32-true", "answered precision 'bf16-mixed' with a plan named '32-true'"),
    ("auto", "16-mixed", "fp16", "a plan named 'fp16'"),
])
def test_a_precision_plan_that_is_not_what_was_asked_is_refused(asked, built, named, message):
    pm = lying_precision({asked: (built, named)})
    with pytest.raises(devplug.PluginError, match="devplug_precision of plugin 'liar'") as caught:
        devplug.Trainer(device="liar", precision=asked, progress=False, plugin_manager=pm)
    assert message in str(caught.value)


def test_an_honest_plan_is_taken():
    pm = lying_precision({"bf16-mixed": ("bf16-mixed", "bf16-mixed")})
    trainer = devplug.Trainer(device="liar", precision="bf16-mixed", progress=False, plugin_manager=pm)
    with trainer.autocast():
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    trainer.close()


# ---- from_canonical: what it makes of a valid state is checked on every load ----------------------------
def _rotating(device, name, params, options):
    """A vendor Adam whose converter hands each parameter the next one's state (finite, non-negative: only the
    shapes show it)."""

    def rotate(optimizer, state):
        per = state["state"]
        keys = sorted(per)
        return {"state": {k: per[keys[(i + 1) % len(keys)]] for i, k in enumerate(keys)},
                "param_groups": state["param_groups"]}

    return devplug.OptimizerChoice(torch.optim.Adam(params, **options), "vendor.RotatingAdam",
                                   to_canonical=lambda o, s: s, from_canonical=rotate)


class Pick:
    DEVPLUG_CONTRACT = "1.5"

    def __init__(self, build) -> None:
        self.build = build

    @devplug.hookimpl
    def devplug_optimizer(self, device, name, params, options):
        return self.build(device, name, params, options)


def _adam_trainer(build=None):
    plugins = [("pick", Pick(build))] if build is not None else []
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False,
                              plugin_manager=create_plugin_manager(autoload=False, extra_plugins=plugins))
    torch.manual_seed(0)
    model = trainer.setup(torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1)), "net")
    opt = trainer.optimizer("adam", model.parameters(), lr=1e-2)
    return trainer, model, opt


def test_a_from_canonical_that_does_not_fit_the_parameters_is_refused_on_load(tmp_path):
    trainer, model, opt = _adam_trainer()
    for _ in range(2):
        trainer.backward(model(torch.randn(3, 4)).pow(2).mean())
        trainer.step(opt)
    path = trainer.save(tmp_path / "ck.pt")
    other, other_model, other_opt = _adam_trainer(_rotating)
    before = {k: v.clone() for k, v in other_model.state_dict().items()}
    with pytest.raises(devplug.CheckpointError) as caught:
        other.load(path)
    message = str(caught.value)
    assert "vendor.RotatingAdam's from_canonical of plugin 'pick'" in message
    assert "does not fit the parameters: parameter 0: exp_avg has shape (6,), the parameter (6, 4)" in message
    assert other_opt.state_dict()["state"] == {}
    assert all(torch.equal(before[k], v) for k, v in other_model.state_dict().items())


# ---- step hooks: a slow one is named, a stuck one fails the run clearly ---------------------------------
class SlowMarker:
    DEVPLUG_CONTRACT = "1.5"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    @devplug.hookimpl
    def devplug_register_devices(self):
        return devplug.DeviceSpec(name="slowmark", description="marks steps slowly", priority=5,
                                  probe=devplug.Availability.yes, torch_type="cpu")

    @devplug.hookimpl
    def devplug_mark_step(self, device, phase):
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline:  # busy in Python, as a plugin polling its runtime is
            time.sleep(0.01)


def _one_step(seconds: float) -> None:
    watchdog().forget_warnings()
    pm = create_plugin_manager(autoload=False, extra_plugins=[("slowmark", SlowMarker(seconds))])
    trainer = devplug.Trainer(device="slowmark", precision="32-true", progress=False, plugin_manager=pm)
    model = trainer.setup(torch.nn.Linear(2, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    try:
        trainer.backward(model(torch.ones(1, 2)).sum())
        trainer.step(opt)
    finally:
        trainer.close()


def test_a_slow_step_hook_is_named_in_a_warning(monkeypatch, caplog):
    monkeypatch.setenv("DEVPLUG_HOOK_WARN_SECONDS", "0.3")
    with caplog.at_level(logging.WARNING, logger="devplug"):
        _one_step(1.0)
    warned = [r.getMessage() for r in caplog.records if "devplug_mark_step of plugin 'slowmark'" in r.getMessage()]
    assert len(warned) == 1 and "has been running for" in warned[0] and "DEVPLUG_HOOK_TIMEOUT" in warned[0]


def test_a_step_hook_stuck_past_the_hard_limit_fails_the_run_naming_it(monkeypatch):
    monkeypatch.setenv("DEVPLUG_HOOK_WARN_SECONDS", "0.2")
    monkeypatch.setenv("DEVPLUG_HOOK_TIMEOUT", "1")
    started = time.monotonic()
    with pytest.raises(devplug.PluginError, match=r"devplug_mark_step of plugin 'slowmark' .* did not return within "
                                                   r"1 s .*DEVPLUG_HOOK_TIMEOUT"):
        _one_step(60.0)
    assert time.monotonic() - started < 10


def test_fast_step_hooks_are_never_named(monkeypatch, caplog):
    monkeypatch.setenv("DEVPLUG_HOOK_WARN_SECONDS", "0.5")
    with caplog.at_level(logging.WARNING, logger="devplug"):
        for _ in range(3):
            _one_step(0.0)
    assert not [r for r in caplog.records if "devplug_mark_step" in r.getMessage()]


# ---- contract gaps: a setting the plugin's declared contract predates is warned once ---------------------
def _old_mover(contract: str):
    class OldMover:
        DEVPLUG_CONTRACT = contract

        @devplug.hookimpl
        def devplug_register_devices(self):
            return devplug.DeviceSpec(name="oldmove", description="moves with .to only", priority=5,
                                      probe=devplug.Availability.yes, torch_type="cpu")

        @devplug.hookimpl
        def devplug_to_device(self, device, obj):
            return obj.to(device.torch_device)

    return create_plugin_manager(autoload=False, extra_plugins=[("oldmove", OldMover())])


def _gap_warnings(caplog, contract: str, channels_last: bool) -> list[str]:
    forget_logged()
    with caplog.at_level(logging.WARNING, logger="devplug"):
        for _ in range(2):
            devplug.Trainer(device="oldmove", channels_last=channels_last, progress=False,
                            plugin_manager=_old_mover(contract)).close()
    return [r.getMessage() for r in caplog.records if "channels_last=True" in r.getMessage()]


def test_a_contract_1_0_plugin_asked_for_channels_last_is_warned_about_once(caplog):
    warned = _gap_warnings(caplog, "1.0", True)
    assert len(warned) == 1
    assert "plugin 'oldmove'" in warned[0] and "contract 1.0" in warned[0] and "devplug_to_device" in warned[0]


@pytest.mark.parametrize(("contract", "channels_last"), [("1.1", True), ("1.0", False), (">=1.0,<2", True)])
def test_no_warning_where_the_plugin_knows_the_setting_or_it_is_not_asked(caplog, contract, channels_last):
    assert _gap_warnings(caplog, contract, channels_last) == []


# ---- messages ---------------------------------------------------------------------------------------------
def test_a_misspelt_hook_name_is_refused_with_the_closest_real_one():
    class Typo:
        DEVPLUG_CONTRACT = "1.5"

        @devplug.hookimpl
        def devplug_optimiser(self, device, name, params, options):
            return None

    pm = create_plugin_manager(autoload=False, extra_plugins=[("typo", Typo())])
    failures = [str(f) for f in pm.failures]
    assert len(failures) == 1 and "typo" in failures[0]
    assert "devplug_optimiser (did you mean devplug_optimizer?)" in failures[0]
    assert pm.get_plugin("typo") is None


def test_a_device_whose_plugin_is_blocked_is_reported_as_blocked(monkeypatch):
    class Acme:
        DEVPLUG_CONTRACT = "1.5"

        @devplug.hookimpl
        def devplug_register_devices(self):
            return devplug.DeviceSpec(name="acme", description="acme card", priority=5,
                                      probe=devplug.Availability.yes, torch_type="cpu")

    pm = create_plugin_manager(autoload=False, blocked=["acme"], extra_plugins=[("acme", Acme())])
    with pytest.raises(devplug.DeviceUnavailableError, match=r"device 'acme' is blocked: .*DEVPLUG_BLOCK_PLUGINS"):
        devplug.Trainer(device="acme", progress=False, plugin_manager=pm)
