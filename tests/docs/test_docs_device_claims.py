"""What the docs say about contracts and device names matches devplug."""

from __future__ import annotations

import re

from paths import REPO

from devplug import CONTRACT_VERSION


def test_getting_started_json_examples_show_the_contract_devplug_speaks():
    text = (REPO / "docs" / "getting-started.md").read_text()
    shown = set(re.findall(r'"contract": "([0-9.]+)"', text))
    assert shown == {CONTRACT_VERSION}


def test_plugins_doc_does_not_offer_the_torch_type_as_the_device_name():
    text = " ".join((REPO / "docs" / "plugins.md").read_text().split())
    assert "check `device.name` (or `device.torch_device.type`)" not in text
    assert "`device.torch_device.type` is not the same test" in text
