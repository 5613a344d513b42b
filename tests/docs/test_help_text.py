"""The --help of the examples and of the devplug command says each option's default once."""

from __future__ import annotations

import argparse
import re

import pytest

from devplug.cli import build_parser as devplug_parser


def _option_helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    helps = {}
    for action in parser._actions:  # argparse keeps no public list of an option's help text
        if action.option_strings and action.help and action.help is not argparse.SUPPRESS:
            text = action.help
            if "%(" in text:
                text = text % {"default": action.default, "prog": parser.prog}
            helps[action.option_strings[-1]] = text
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                helps.update(_option_helps(sub))
    return helps


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from dcgan.cli import build_parser as dcgan_parser
    from lm.cli import build_parser as lm_parser

    return {"dcgan": dcgan_parser(), "lm": lm_parser(), "devplug": devplug_parser()}


@pytest.mark.parametrize("program", ["dcgan", "lm", "devplug"])
def test_each_option_names_its_default_once(program):
    helps = _option_helps(_parsers()[program])
    assert helps
    twice = {}
    for flag, text in helps.items():
        defaults = re.findall(r"\bdefault: ([^;)]*)", text)  # a flag may name two defaults, of two things
        if len(defaults) != len(set(defaults)):
            twice[flag] = text
    assert not twice, f"{program} --help names a default twice: {twice}"


@pytest.mark.parametrize("program", ["dcgan", "lm"])
def test_the_examples_help_names_every_exit_status_a_run_ends_with(program):
    epilog = _parsers()[program].epilog or ""
    statuses = epilog[epilog.index("Exit status"):]
    for status in ("0 done", "2 bad input", "130 interrupted", "143 SIGTERM", "138 SIGUSR1"):
        assert status in statuses, f"{program} --help leaves out exit status {status!r}: {statuses!r}"
