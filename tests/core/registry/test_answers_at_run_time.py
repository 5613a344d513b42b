"""Plugin answers checked where the Trainer receives them, at run time: a precision plan that is not the
precision asked for, a ``from_canonical`` that breaks its algorithm's state, a step hook that is slow or
never returns, a plugin written for an older contract given a setting it does not know."""

from __future__ import annotations

import attrs
import pytest
import torch

import devplug
from devplug.core.registry.manager import create_plugin_manager
from devplug.toolkit import autocast_plan


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
