"""hookspecs.py reads in the order a run meets its hooks: one section per stage of the lifecycle."""

from __future__ import annotations

import re

from devplug.core.contract import hookspecs

STAGES = ("Registration", "Building a run", "The step", "Observing a run", "Diagnosis")


def _sections() -> list[tuple[str, list[str]]]:
    sections: list[tuple[str, list[str]]] = []
    for line in open(hookspecs.__file__).read().splitlines():
        if line.startswith("# ---- "):
            sections.append((line.removeprefix("# ---- ").split(":")[0], []))
        elif (match := re.match(r"def (devplug_\w+)\(", line)):
            assert sections, f"{match[1]} comes before the first section"
            sections[-1][1].append(match[1])
    return sections


def test_every_hook_sits_in_one_stage_of_the_lifecycle_in_order():
    sections = _sections()
    assert tuple(title for title, _hooks in sections) == STAGES
    listed = [name for _title, hooks in sections for name in hooks]
    assert listed == [fn.__name__ for fn in hookspecs.HOOKS]  # HOOKS follows the file
    stage = {name: title for title, hooks in sections for name in hooks}
    assert stage["devplug_register_devices"] == "Registration" and stage["devplug_doctor"] == "Diagnosis"
    assert {stage[name] for name in ("devplug_mark_step", "devplug_clip_grad_norm", "devplug_synchronize")} == \
        {"The step"}
    assert {stage[name] for name in ("devplug_optimizer", "devplug_dataloader", "devplug_sharding")} == \
        {"Building a run"}
