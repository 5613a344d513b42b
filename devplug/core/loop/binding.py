"""`ConfigParser`: a script's command line and config file, bound to devplug's attrs configs.

`TrainerConfig` and `CheckpointPolicy` are attrs classes whose fields carry a type, a default, a validator
and (in the class docstring) a description. ``parser.bind(TrainerConfig, ["device", "precision", ...])``
turns the fields named into flags (``--log-every``) that parse by the field's type, check with the
field's own validator (so a bad value is one ``prog: error: argument --log-every: ...`` line, exit 2, before
any work) and document themselves from the docstring; ``parser.build(TrainerConfig, args, log_dir=...)``
makes the config from the parsed flags. Every parser also reads ``--config FILE``: a TOML or JSON file
of flag values (``log-every = 10``) that the command line overrides.

Why not jsonargparse: the configs are attrs classes whose validators and docstrings are already the
single source of what a value may be and mean; binding them takes one small module over argparse and the
standard library's TOML reader, and adds no dependency to every devplug install.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib
import json
import math
import re
import sys
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import attrs

from devplug.core.checkpoint.policy import CheckpointPolicy
from devplug.core.data.images import printable
from devplug.core.errors import CheckpointError, ConfigError, DevplugError

#: Largest seed: torch seeds are 64-bit, and loaders add the epoch to the seed.
MAX_SEED = 2**63 - 1
_UNSET: Any = object()


def integer(low: int | None = 0, high: int | None = None, what: str | None = None) -> Callable[[str], int]:
    """An argparse ``type`` for a whole number from ``low`` to ``high`` (``None``: unbounded); the error says
    ``must be <what>, got <text>``."""
    if what is None:
        what = ("a positive integer" if low == 1 and high is None else f"an integer >= {low}" if high is None
                else f"an integer from {low} to {high}") if low is not None else "an integer"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its messages
    return parse


def number(low: float | None = None, *, strict: bool = False) -> Callable[[str], float]:
    """An argparse ``type`` for a finite number, at least ``low`` (above it when ``strict``; ``None``: any)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if low is not None and (value < low or (strict and value == low)):
            bound = ("positive" if low == 0 else f"> {low:g}") if strict else f">= {low:g}"
            raise argparse.ArgumentTypeError(f"must be a {bound} number, got {text}")
        return value

    parse.__name__ = "number"
    return parse


@attrs.frozen
class Flag:
    """How one attrs field appears on the command line, where the field's own type, default and docstring
    do not say it: the flag's name, its help, its default, how to parse it, how the value becomes the field's.

    - ``field``: the attrs field (``"log_every"``).
    - ``flag``: the option (default ``--log-every``); its destination in the parsed namespace stays ``field``
      unless ``dest`` says otherwise.
    - ``help``: the text (default: the field's line in the class docstring).
    - ``default``: the flag's default (default: the field's).
    - ``type``: parses the text (default: by the field's type, then its validator).
    - ``choices``, ``metavar``: as argparse takes them.
    - ``boolean``: a ``--x/--no-x`` switch (default: for ``bool`` fields).
    - ``convert``: turns the parsed value into the field's (``lambda n: n or None``: 0 means "none").
    """

    field: str
    flag: str | None = None
    help: str | None = None
    default: Any = _UNSET
    type: Callable[[str], Any] | None = None
    choices: Sequence[Any] | None = None
    metavar: str | None = None
    boolean: bool | None = None
    convert: Callable[[Any], Any] | None = None
    dest: str | None = None


def field_help(cls: type) -> dict[str, str]:
    """Each field's description from ``cls``'s docstring bullets (``- ``name``: text``), in plain words."""
    found: dict[str, str] = {}
    for bullet in re.split(r"\n\s*- ", "\n" + (cls.__doc__ or "")):
        match = re.match(r"((?:``\w+``\s*(?:,|/|and)?\s*)+):\s*(.*)", bullet, flags=re.DOTALL)
        if not match:
            continue
        text = " ".join(match[2].split())
        text = re.sub(r"``([^`]*)``", r"\1", text)
        text = re.sub(r"`([^`]*)`", r"\1", text)
        for name in re.findall(r"``(\w+)``", match[1]):
            found.setdefault(name, text)
    return found


def _base_type(annotation: str) -> str:
    parts = {part.strip() for part in str(annotation).split("|")} - {"None"}
    return parts.pop() if len(parts) == 1 else "str"


def _takes_a_list(action: argparse.Action) -> bool:
    """True for a flag whose value is a list: ``action="append"``, or ``nargs`` of ``*``, ``+`` or a count."""
    return isinstance(action, argparse._AppendAction) or action.nargs in ("*", "+") or isinstance(action.nargs, int)


def _bool_or_text(text: str) -> bool | str:
    """``true``/``on`` → True, ``false``/``off`` → False (any case), other text as it is: a field of
    ``bool | str`` (``channels_last``: True, False or ``"auto"``)."""
    return {"true": True, "on": True, "false": False, "off": False}.get(text.strip().lower(), text)


@attrs.frozen
class RunFolder:
    """Where a run writes (``out``) and what it resumes from: ``resume``, a checkpoint or a folder of them
    (``None``: nothing named), or with ``auto_resume`` the newest intact checkpoint of ``out``, if any."""

    out: Path
    resume: Path | None = None
    auto_resume: bool = False


class ConfigParser(argparse.ArgumentParser):
    """An argument parser for a training script: one-line errors, spelled-out flags, ``--config FILE``, and
    devplug's configs bound to flags.

    A bad flag is one ``prog: error: ... (see --help)`` line and exit status 2. `parse` records which
    destinations were given explicitly (``args.explicit``), on the command line or in the config file, so
    a script can tell a value asked for from a default (a resumed run keeps its own unless asked).
    """

    #: argparse types for a script's own flags (see `integer`, `number`), and the largest seed.
    integer = staticmethod(integer)
    number = staticmethod(number)
    MAX_SEED = MAX_SEED

    def __init__(self, prog: str, *, description: str | None = None, epilog: str | None = None,
                 config_file: bool = True) -> None:
        super().__init__(prog=prog, description=description, epilog=epilog, allow_abbrev=False,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
        self._bound: dict[type, list[Flag]] = {}
        self._runs = "runs"
        if config_file:
            self.add_argument("--config", type=Path, default=None, metavar="FILE",
                              help="a TOML or JSON file of flag values, keys named as the flags without the dashes "
                                   "(log-every = 10); flags given on the command line win")

    def error(self, message: str) -> NoReturn:
        """Print ``message`` on one line and exit with status 2."""
        self.exit(2, f"{self.prog.removesuffix('.py')}: error: {' '.join(message.split())} (see --help)\n")

    def report(self, error: BaseException) -> int:
        """Print ``error`` as one ``prog: error:`` line on stderr (printable, at most 600 characters), as a bad
        input is reported; the exit status, 2. Under a process group of several ranks a rank other than 0 stays
        quiet when rank 0 printed the same line (`devplug.core.distributed.said_once`)."""
        text = printable(" ".join(str(error).split()))
        text = text if len(text) <= 600 else text[:597] + "..."
        line = f"{self.prog.removesuffix('.py')}: error: {text}"
        from devplug.core.distributed.said_once import said_by_rank_zero

        if not said_by_rank_zero(line):  # under several ranks, one line per job: rank 0's, or this rank's own
            print(line, file=sys.stderr)
        return 2

    def run(self, work: Callable[[argparse.Namespace], int], argv: Sequence[str] | None = None) -> int:
        """A script's ``main``: parse ``argv`` (a bad flag exits with status 2), then ``work(args)``; its exit
        status. A `devplug.DevplugError` (bad input: a device, a checkpoint, a folder) is one ``prog: error:``
        line and status 2; Ctrl-C is ``prog: interrupted`` and status 130; a collective that failed because another
        process of the job ended is one line and status 1 (`devplug.core.distributed.peer_loss`). At the end the
        process leaves the process group a launched run joined (``torch.distributed.destroy_process_group``)."""
        args = self.parse(argv)
        try:
            return work(args)
        except DevplugError as exc:
            return self.report(exc)
        except KeyboardInterrupt:
            print(f"{self.prog.removesuffix('.py')}: interrupted", file=sys.stderr)
            return 130
        except Exception as exc:
            from devplug.core.distributed.peer_loss import lost_peer

            line = lost_peer(exc)  # another rank ended: its own output says why, this one's traceback would bury it
            if line is None:
                raise
            print(f"{self.prog.removesuffix('.py')}: error: {line}", file=sys.stderr)
            return 1
        finally:
            _leave_process_group()

    @staticmethod
    def run_as_script(main: Callable[[], int]) -> NoReturn:
        """What ``python script.py`` does: ``main()``, then exit with its status; a file name that is not
        valid UTF-8 prints as ``\\xNN``, never a crash.

        The garbage collector leaves alone what exists when it starts (the modules the script imported: torch
        alone makes about 180,000 tracked objects that live as long as the process) and what exists when ``main``
        returns (the process ends then), instead of sweeping them again in every full collection and once
        more at exit (``gc.freeze``).
        """
        for stream in (sys.stdout, sys.stderr):
            reconfigure = getattr(stream, "reconfigure", None)
            if reconfigure is not None:
                reconfigure(errors="backslashreplace")
        gc.freeze()
        status = main()
        gc.freeze()
        sys.exit(status)

    # ---- binding ---------------------------------------------------------------------------------------------
    def bind_checkpoints(self, group: argparse._ActionsContainer | None = None, *, save_every: int,
                         keep: int = 3) -> None:
        """``--save-every N`` and ``--keep-checkpoints K`` (0 keeps all), bound to `devplug.CheckpointPolicy`'s
        ``every_n_steps`` and ``keep_last``; build the policy with ``build(CheckpointPolicy, args, directory=...)``."""
        self.bind(CheckpointPolicy, [
            Flag("every_n_steps", "--save-every", default=save_every, type=integer(1),
                 help=f"steps between checkpoints; one is also written at the end (default: {save_every})"),
            Flag("keep_last", "--keep-checkpoints", default=keep, type=integer(0), convert=lambda n: n or None,
                 help=f"newest checkpoints to keep, 0 keeps all (default: {keep})"),
        ], group=group)

    def bind(self, cls: type, flags: Iterable[str | Flag], *, group: argparse._ActionsContainer | None = None,
             defaults: Mapping[str, Any] | None = None) -> None:
        """Add a flag for each field of the attrs class ``cls`` named in ``flags`` (a name, or a `Flag` that
        says more), into ``group`` (default: this parser); ``defaults`` overrides fields' defaults."""
        fields = attrs.fields_dict(cls)
        documented = field_help(cls)
        container = group if group is not None else self
        specs = self._bound.setdefault(cls, [])
        for item in flags:
            spec = Flag(item) if isinstance(item, str) else item
            if spec.field not in fields:
                raise ValueError(f"{cls.__name__} has no field {spec.field!r}")
            field = fields[spec.field]
            default = spec.default
            if default is _UNSET:
                default = (defaults or {}).get(spec.field, _UNSET)
            if default is _UNSET:
                default = field.default if not isinstance(field.default, attrs.Factory) else None  # type: ignore[arg-type]
            dest = spec.dest or spec.field
            kind = _base_type(str(field.type))
            boolean = spec.boolean if spec.boolean is not None else kind == "bool"
            text = spec.help or documented.get(spec.field, spec.field.replace("_", " "))
            shown = "on" if default is True else "off" if default is False else default
            text = f"{text} (default: {shown})" if default is not None and "(default" not in text else text
            options: dict[str, Any] = {"dest": dest, "default": default, "help": text.replace("%", "%%")}
            if boolean:
                options["action"] = argparse.BooleanOptionalAction
            else:
                choices = spec.choices if spec.choices is not None else getattr(field.validator, "options", None)
                # argparse checks the choices; a field's validator checks any other value
                options["type"] = spec.type or self._checked(field, kind, validate=choices is None)
                if choices is not None:
                    options["choices"] = tuple(choices)
                if spec.metavar is not None:
                    options["metavar"] = spec.metavar
            container.add_argument(spec.flag or "--" + spec.field.replace("_", "-"), **options)
            specs.append(attrs.evolve(spec, dest=dest))

    @staticmethod
    def _checked(field: attrs.Attribute, kind: str, *, validate: bool = True) -> Callable[[str], Any]:
        base: Callable[[str], Any] = {"int": integer(None), "float": number()}.get(kind, str)
        takes_bool = kind != "bool" and "bool" in {part.strip() for part in str(field.type).split("|")}
        if takes_bool:
            base = _bool_or_text
        if field.name == "seed":
            base = integer(0, MAX_SEED)

        def parse(text: str) -> Any:
            value = base(text)
            if validate and field.validator is not None:
                try:
                    field.validator(None, field, value)
                except (TypeError, ValueError, ConfigError) as exc:  # "log_every must be ..." -> "must be ..."
                    message = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
                    raise argparse.ArgumentTypeError(message.removeprefix(f"{field.name} ")) from None
            return value

        parse.__name__ = kind
        parse.takes_bool = takes_bool  # type: ignore[attr-defined]  # a config file's true/false is a value
        return parse

    def build(self, cls: type, args: argparse.Namespace, **fixed: Any) -> Any:
        """An instance of ``cls`` from its bound flags in ``args`` and the ``fixed`` values (which win);
        an invalid combination raises one `devplug.ConfigError` line."""
        values: dict[str, Any] = {}
        for spec in self._bound.get(cls, []):
            value = getattr(args, spec.dest or spec.field)
            values[spec.field] = spec.convert(value) if spec.convert is not None else value
        values.update(fixed)
        make = getattr(cls, "build", None)
        if callable(make):
            return make(**values)
        try:
            return cls(**values)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"invalid {cls.__name__}: {exc}") from exc

    # ---- the run folder --------------------------------------------------------------------------------------
    def add_run_arguments(self, group: argparse._ActionsContainer | None = None, *, runs: str) -> None:
        """``--out``, ``--resume`` and ``--auto-resume``: where a run writes and what it continues from;
        ``runs`` is the folder of timestamped run folders ``--out`` defaults to (``runs/lm``)."""
        container = group if group is not None else self
        container.add_argument("--out", type=Path, default=None,
                               help=f"run folder (default: {runs}/<timestamp>; with --resume, the resumed run's "
                                    "folder)")
        container.add_argument("--resume", type=Path, default=None, metavar="PATH",
                               help="continue from a checkpoint (a file, or a folder of shards), or from the newest "
                                    "checkpoint of a run folder, at its saved step (give the same model flags as the "
                                    "run that wrote it)")
        container.add_argument("--auto-resume", action="store_true",
                               help="resume from the newest checkpoint in --out if there is one, else start fresh: "
                                    "what a job restarted by torchrun --max-restarts or a scheduler wants")
        self._runs = runs

    def run_folder(self, args: argparse.Namespace, *, now: datetime.datetime | None = None) -> RunFolder:
        """Where the run of ``args`` writes and what it resumes from (see `add_run_arguments`); a missing
        ``--resume`` path or a contradiction raises one `devplug.ConfigError`/`CheckpointError` line now."""
        if args.auto_resume:
            if args.resume is not None:
                raise ConfigError("--auto-resume and --resume contradict each other; give one")
            if args.out is None:
                raise ConfigError("--auto-resume needs --out, the run folder to look for checkpoints in")
        resume = None
        if args.resume is not None:
            resume = Path(args.resume).expanduser()
            if not resume.exists():
                raise CheckpointError(f"checkpoint {str(resume)!r} does not exist")
            if resume.is_dir() and (resume / "checkpoints").is_dir():
                resume = resume / "checkpoints"  # a run folder: its newest intact checkpoint
            one = resume.is_file() or (resume / "trainer.pt").exists() or (resume / ".metadata").exists()
            if not one and not any(resume.glob("step_*.pt")):
                raise CheckpointError(f"no checkpoint (step_*.pt) in {str(resume)!r} to resume from; name a "
                                      "checkpoint, or a run folder that has some")
        out = args.out
        if out is None:
            if resume is not None:
                folder = resume if resume.is_dir() else resume.parent
                out = folder.parent if folder.name == "checkpoints" else folder
            else:
                out = Path(self._runs) / (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")
        return RunFolder(out=Path(out).expanduser(), resume=resume, auto_resume=bool(args.auto_resume))

    # ---- parsing ---------------------------------------------------------------------------------------------
    def parse(self, argv: Sequence[str] | None = None) -> argparse.Namespace:
        """Parse ``argv`` (``None``: ``sys.argv[1:]``) over the ``--config`` file's values; argparse exits with
        status 2 on a bad flag. ``args.explicit`` holds the destinations given (command line or file)."""
        tokens = list(sys.argv[1:] if argv is None else argv)
        by_flag = {flag: action for action in self._actions for flag in action.option_strings}
        explicit = {by_flag[t.split("=", 1)[0]].dest for t in tokens if t.split("=", 1)[0] in by_flag}
        if "config" in explicit:
            early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
            early.add_argument("--config", type=Path)
            known, _rest = early.parse_known_args(tokens)
            explicit |= self._apply_file(known.config, given=explicit)
        args = self.parse_args(tokens)
        args.explicit = explicit - {"config", "help"}
        return args

    def _apply_file(self, path: Path, given: Collection[str] = ()) -> set[str]:
        """Take the file's values as the defaults; the destinations it sets. ``given``: the destinations the command
        line gives, whose flags that append (``action="append"``) take the command line's values alone."""
        values = self._read(path)
        # a key is a flag's long name without the dashes (log-every, or log_every); a --x/--no-x switch is x
        actions = {option.lstrip("-").replace("_", "-"): action for action in self._actions
                   if action.dest not in ("config", "help") for option in action.option_strings
                   if option.startswith("--") and not (isinstance(action, argparse.BooleanOptionalAction)
                                                       and option.startswith("--no-"))}
        defaults: dict[str, Any] = {}
        for key, value in values.items():
            action = actions.get(str(key).replace("_", "-"))
            if action is None:
                self.error(f"config file {str(path)!r}: unknown key {key!r}; keys: {', '.join(sorted(actions))}")
            dest = action.dest
            if isinstance(action, argparse._AppendAction) and dest in given:
                continue  # the command line's values replace the file's (argparse would append them to it)
            if isinstance(action, argparse.BooleanOptionalAction | argparse._StoreTrueAction
                          | argparse._StoreFalseAction):
                if not isinstance(value, bool):
                    self.error(f"config file {str(path)!r}: {key} must be true or false, got {value!r}")
                if not isinstance(action, argparse.BooleanOptionalAction):  # true: the flag given
                    value = action.const if value else action.default
            elif isinstance(value, bool) and getattr(action.type, "takes_bool", False):
                value = _bool_or_text(str(value))
            elif _takes_a_list(action):  # an append flag, or nargs: a list (one value is a list of one)
                items = value if isinstance(value, list) else [value]
                count = action.nargs if isinstance(action.nargs, int) else None
                if (count is not None and len(items) != count) or (action.nargs == "+" and not items):
                    wanted = f"{count} value{'s' if count != 1 else ''}" if count is not None else "values"
                    self.error(f"config file {str(path)!r}: {key} takes {wanted}, got {value!r}")
                value = [self._file_value(path, key, action, item) for item in items]
            else:
                value = self._file_value(path, key, action, value)
            defaults[dest] = value
            action.required = False  # given by the file (the command line may still override it)
        self.set_defaults(**defaults)
        return set(defaults)

    def _file_value(self, path: Path, key: str, action: argparse.Action, value: Any) -> Any:
        """One value of ``key`` in the config file, converted and checked as the flag's own value would be."""
        if isinstance(value, (bool, list, dict)) or value is None:
            self.error(f"config file {str(path)!r}: {key} must be a string or a number, got {value!r}")
        try:
            value = action.type(str(value)) if callable(action.type) else str(value)
        except argparse.ArgumentTypeError as exc:
            self.error(f"config file {str(path)!r}: {key} ({action.option_strings[0]}) {exc}")
        except (TypeError, ValueError):  # a plain type such as int: argparse's own wording
            kind = getattr(action.type, "__name__", repr(action.type))
            self.error(f"config file {str(path)!r}: {key} ({action.option_strings[0]}) invalid {kind} value: {value!r}")
        if action.choices is not None and value not in action.choices:
            self.error(f"config file {str(path)!r}: {key} must be one of "
                       f"{', '.join(map(str, action.choices))}, got {value!r}")
        return value

    def _read(self, path: Path) -> dict[str, Any]:
        try:
            text = Path(path).expanduser().read_text()
        except OSError as exc:
            self.error(f"--config {str(path)!r} cannot be read: {exc.strerror or exc}")
        try:
            if Path(path).suffix.lower() == ".json":
                values = json.loads(text)
            else:
                values = _toml().loads(text)
        except ValueError as exc:  # json.JSONDecodeError and tomllib.TOMLDecodeError are ValueErrors
            kind = "JSON" if Path(path).suffix.lower() == ".json" else "TOML"
            self.error(f"--config {str(path)!r} is not valid {kind}: {exc}")
        if not isinstance(values, dict):
            self.error(f"--config {str(path)!r} must hold a table of flag values, got {type(values).__name__}")
        return values


def _leave_process_group() -> None:
    """Destroy the default process group if this process joined one (the end of a distributed script)."""
    distributed = sys.modules.get("torch.distributed")  # never imported here: a run that joined one imported it
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        distributed.destroy_process_group()


def _toml() -> Any:
    """The TOML reader: the standard library's tomllib (Python 3.11+), else tomli (a dependency on 3.10)."""
    try:
        return importlib.import_module("tomllib")
    except ModuleNotFoundError:  # Python 3.10
        return importlib.import_module("tomli")
