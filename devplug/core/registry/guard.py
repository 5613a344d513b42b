"""Hook answers checked where the core receives them, and plugin failures named.

Every hook implementation a plugin registers is wrapped once, at registration, by `guard_hookimpl`:

- an answer that does not fit the return annotation of the hook's spec (a bare optimizer instead of an
  ``OptimizerChoice``, a tuple instead of a ``PrecisionPlan``) raises one `PluginError`
  naming the plugin, its distribution, the hook and the expected record;
- an exception raised inside the hook (wrapper or not) is re-raised as a `PluginError` with the
  same naming and the original chained; devplug's own errors (``PrecisionError`` for a setting the
  device cannot run, ``OptimizerError``, ...) are part of the contract and pass through unchanged;
- an answer of the right type whose value breaks a rule of its hook (a module moved into a copy, a negative
  peak FLOP/s) raises a `PluginError` with the same naming, and an ``OptimizerChoice`` is given the
  name of the plugin that built it (`devplug.core.registry.answers`);
- a ``wrapper=True`` implementation that swallows the inner answer (``yield`` without ``return``) is
  reported as such instead of surfacing later as "no plugin can build ...";
- an old-style ``hookwrapper=True`` implementation is held to the same: what it raises is named, and a
  result it forces (``outcome.force_result``) is checked like any other answer.
"""

from __future__ import annotations

import functools
import itertools
import sys
import types
import typing
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import pluggy

from devplug.core.errors import DevplugError, PluginError
from devplug.core.registry.answers import ANSWER_CHECKS, CHECKED_ARGUMENT, AnswerCheck

if TYPE_CHECKING:
    from pluggy._hooks import HookSpec  # pluggy names it in annotations without exporting it


@functools.cache
def expected_types(spec_function: Callable[..., Any]) -> tuple[type, ...]:
    """Runtime classes an answer of ``spec_function``'s hook may be (``None`` excluded); ``()``: unchecked."""
    annotation = typing.get_type_hints(spec_function).get("return", Any)
    members = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    classes = []
    for member in members:
        origin = typing.get_origin(member) or member
        if origin is Any:
            return ()
        if isinstance(origin, type) and origin is not type(None):
            classes.append(origin)
    return tuple(classes)


def describe_types(classes: tuple[type, ...], optional: bool) -> str:
    """``"an OptimizerChoice or None"``: the expected answer in words."""
    names = [_article(_FRIENDLY_NAMES.get(n, n)) for n in map(_type_name, classes)] + (["None"] if optional else [])
    return " or ".join(names)


_FRIENDLY_NAMES = {"contextlib.AbstractContextManager": "context manager", "collections.abc.Iterable": "list of them"}


def _type_name(cls: type) -> str:
    if cls.__module__.startswith("devplug."):
        return f"devplug.{cls.__qualname__}"
    if cls.__module__ in ("builtins", "collections.abc", "contextlib"):
        return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def _article(name: str) -> str:
    return ("an " if name[:1].lower() in "aeiou" else "a ") + name


def _describe_value(value: Any) -> str:
    text = " ".join(repr(value).split())  # one line: an optimizer's or a tensor's repr spans several
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} (a {type(value).__module__}.{type(value).__qualname__})"


class HookLabel:
    """Who answered: ``devplug_optimizer of plugin 'acme' (devplug-acme 1.2.0)``, the prefix of every error."""

    def __init__(self, hook: str, plugin_name: str, distribution: str) -> None:
        self.hook, self.plugin_name, self.distribution = hook, plugin_name, distribution

    def __str__(self) -> str:
        return f"{self.hook} of plugin {self.plugin_name!r} ({self.distribution})"

    def raised(self, exc: BaseException) -> PluginError:
        """The PluginError for an exception raised inside the hook."""
        if isinstance(exc, SystemExit):
            return PluginError(f"{self} called sys.exit({exc.code!r})")
        return PluginError(f"{self} raised {type(exc).__name__}: {exc}")

    def wrong_answer(self, value: Any, classes: tuple[type, ...], optional: bool) -> PluginError:
        """The PluginError for an answer of the wrong type."""
        return PluginError(
            f"{self} returned {_describe_value(value)}, not {describe_types(classes, False)}; the contract expects "
            f"{describe_types(classes, optional)} (see docs/hooks.md#{self.hook}); report this to the maintainers "
            f"of {self.distribution}"
        )


#: Numbers each guarded hook call (a C-level counter: no Python call is added to the call).
_CALLS = itertools.count()


def guard_hookimpl(impl: pluggy.HookImpl, spec: HookSpec | None, distribution: str) -> None:
    """Replace ``impl.function`` by a checked call (idempotent)."""
    if getattr(impl.function, "__devplug_guarded__", False):
        return
    label = HookLabel(spec.name if spec is not None else impl.function.__name__, impl.plugin_name, distribution)
    classes = expected_types(spec.function) if spec is not None else ()
    firstresult = bool(spec is not None and spec.opts.get("firstresult"))
    function = impl.function
    argnames = tuple(impl.argnames)
    check = _bound_check(ANSWER_CHECKS.get(label.hook), label, argnames)
    only = _checked_position(label, argnames)
    guarded: Any  # a function (the mark below is an attribute set on it)
    if impl.hookwrapper:
        guarded = _guard_old_style_wrapper(function, label, classes, firstresult, check, only)
    elif impl.wrapper:
        guarded = _guard_wrapper(function, label, classes, firstresult, check, only)
    else:
        guarded = _guard_call(function, label, classes, check, only)
    guarded.__devplug_guarded__ = True  # a mark for the idempotence check above
    impl.function = guarded  # type: ignore[misc]  # pluggy calls impl.function; argnames stay the original's


BoundCheck = Callable[[tuple[Any, ...], Any], Any]


def _bound_check(check: AnswerCheck | None, label: HookLabel, argnames: tuple[str, ...]) -> BoundCheck | None:
    """The hook's value check called with the positional arguments pluggy passes (``None``: no check)."""
    if check is None:
        return None
    return lambda args, answer: check(label, dict(zip(argnames, args, strict=False)), answer)


def _checked_position(label: HookLabel, argnames: tuple[str, ...]) -> tuple[int, type]:
    """Where the one argument the hook's check is about sits among ``argnames``, and its class; ``(-1, object)``:
    every call is checked.

    A check about one kind of argument only (`CHECKED_ARGUMENT`: a module given to ``devplug_to_device``)
    runs only for that kind, so the batches moved at every step pay one ``isinstance``, and no mapping of
    the arguments is built for them.
    """
    only = CHECKED_ARGUMENT.get(label.hook)
    if only is None or only[0] not in argnames:
        return -1, object
    return argnames.index(only[0]), only[1]


def _guard_call(function: Callable[..., Any], label: HookLabel, classes: tuple[type, ...],
                check: BoundCheck | None, only: tuple[int, type] = (-1, object)) -> Callable[..., Any]:
    position, kind = only

    def guarded(*args: Any) -> Any:
        call = next(_CALLS)  # noqa: F841 - read from the stack by the watchdog: which call of the hook this is
        try:
            result = function(*args)
        except DevplugError:
            raise
        except (Exception, SystemExit) as exc:  # a plugin that calls sys.exit() must not end the user's run
            raise label.raised(exc) from exc
        if result is not None and classes and not isinstance(result, classes):
            raise label.wrong_answer(result, classes, True)
        if result is not None and check is not None and (position < 0 or isinstance(args[position], kind)):
            result = check(args, result)
        return result

    return guarded


def _guard_wrapper(
    function: Callable[..., Any], label: HookLabel, classes: tuple[type, ...], firstresult: bool,
    check: BoundCheck | None, only: tuple[int, type] = (-1, object),
) -> Callable[..., Generator[Any, Any, Any]]:
    position, kind = only

    def guarded(*args: Any) -> Generator[Any, Any, Any]:
        call = next(_CALLS)  # noqa: F841 - read from the stack by the watchdog: which call of the hook this is
        generator, request = _started(function, args, label, "a wrapper that did not yield; write `return (yield)`")
        try:
            inner = yield request
        except BaseException as thrown:
            return _finish(label, functools.partial(generator.throw, thrown), passthrough=thrown)
        result = _finish(label, functools.partial(generator.send, inner), passthrough=None)
        if result is None and inner is not None and (firstresult or isinstance(inner, list)):
            raise PluginError(
                f"{label} is a wrapper that dropped the answer of the other implementations (it returned None); "
                "write `return (yield)` or `result = yield ... return result`"
            )
        if result is not None and firstresult and classes and not isinstance(result, classes):
            raise label.wrong_answer(result, classes, True)
        if result is not None and firstresult and check is not None and (
                position < 0 or isinstance(args[position], kind)):
            result = check(args, result)
        return result

    return guarded


def _guard_old_style_wrapper(
    function: Callable[..., Any], label: HookLabel, classes: tuple[type, ...], firstresult: bool,
    check: BoundCheck | None, only: tuple[int, type] = (-1, object),
) -> Callable[..., Generator[Any, Any, None]]:
    """An old-style ``hookwrapper=True`` implementation, checked: pluggy sends it the outcome (a ``pluggy.Result``)
    of the inner implementations, which it may replace (``force_result``); errors are put on that outcome
    (``force_exception``), as pluggy reports a raise from an old-style wrapper's teardown with a warning."""
    position, kind = only

    def guarded(*args: Any) -> Generator[Any, Any, None]:
        call = next(_CALLS)  # noqa: F841 - read from the stack by the watchdog: which call of the hook this is
        generator, _ = _started(function, args, label, "a hookwrapper that did not yield; write `outcome = yield`")
        outcome: pluggy.Result[Any] = yield
        try:
            generator.send(outcome)
        except StopIteration:
            pass
        except DevplugError as exc:
            outcome.force_exception(exc)
            return
        except Exception as exc:
            outcome.force_exception(label.raised(exc))
            return
        else:
            generator.close()
            outcome.force_exception(PluginError(f"{label} is a hookwrapper that yielded more than once; yield exactly "
                                                "once"))
            return
        if not firstresult or outcome.exception is not None:
            return
        result = outcome.get_result()
        if result is None:
            return
        if classes and not isinstance(result, classes):
            outcome.force_exception(label.wrong_answer(result, classes, True))
        elif check is not None and (position < 0 or isinstance(args[position], kind)):
            try:
                outcome.force_result(check(args, result))
            except DevplugError as exc:
                outcome.force_exception(exc)

    return guarded


def _started(function: Callable[..., Any], args: tuple[Any, ...], label: HookLabel,
             no_yield: str) -> tuple[Generator[Any, Any, Any], Any]:
    """A wrapper implementation run to its ``yield``: the generator and what it yielded. Not yielding is a
    `PluginError` saying ``no_yield``; what it raises before is named as the plugin's."""
    generator = function(*args)
    try:
        return generator, next(generator)
    except StopIteration:
        raise PluginError(f"{label} is {no_yield}") from None
    except DevplugError:
        raise
    except Exception as exc:
        raise label.raised(exc) from exc


def _finish(label: HookLabel, resume: Callable[[], Any], passthrough: BaseException | None) -> Any:
    """Run a wrapper past its ``yield``; its return value, or its own exception named."""
    try:
        resume()
    except StopIteration as stop:
        return stop.value
    except BaseException as exc:
        if exc is passthrough or isinstance(exc, DevplugError) or not isinstance(exc, Exception):
            raise
        raise label.raised(exc) from exc
    raise PluginError(f"{label} is a wrapper that yielded more than once; yield exactly once")


#: The code of every guarded call (a plain hook's and a wrapper's), to find a running hook on a thread's stack.
_GUARD_CODES = frozenset(
    const for outer in (_guard_call, _guard_wrapper, _guard_old_style_wrapper) for const in outer.__code__.co_consts
    if isinstance(const, types.CodeType) and const.co_name == "guarded"
)


def running_hook_frame(thread_id: int | None) -> tuple[HookLabel, int] | None:
    """The hook implementation thread ``thread_id`` is running now (the innermost guarded one) and an id of
    that call (the same while the same call runs), or ``None``."""
    frame = sys._current_frames().get(thread_id) if thread_id is not None else None
    while frame is not None:
        if frame.f_code in _GUARD_CODES:
            local = frame.f_locals
            label = local.get("label")
            if isinstance(label, HookLabel):
                return label, int(local.get("call", -1))
        frame = frame.f_back
    return None


def running_hook(thread_id: int | None) -> HookLabel | None:
    """The hook implementation thread ``thread_id`` is running now (the innermost guarded one), or ``None``.

    Read from the thread's stack, so a call that never returns can be named without any cost to calls
    that do.
    """
    frame = sys._current_frames().get(thread_id) if thread_id is not None else None
    while frame is not None:
        if frame.f_code in _GUARD_CODES:
            label = frame.f_locals.get("label")
            if isinstance(label, HookLabel):
                return label
        frame = frame.f_back
    return None
