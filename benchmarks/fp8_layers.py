"""fp8 against bf16, layer by layer, at the LM example's shapes: where does torchao's float8 training gain or lose?

The LM example at width 2048 (8 layers, context 1024, batch 8) trained at less than half bf16's tokens/s in
fp8-mixed on an H200. This script takes the model apart to the layers fp8 converts and times, on ``--device``,
one forward+backward of

- ``square``: one ``Linear(width, width)`` (the attention projection's shape) on ``--tokens`` rows (batch x
  context: 8 x 1024 = 8192 in the LM run);
- ``mlp``: the MLP's ``Linear(width, 4·width)``, GELU, ``Linear(4·width, width)`` pair;

each as ``bf16`` (``nn.Linear`` under bfloat16 autocast, fp32 weights, as the LM trains), ``bf16 (A/A)`` (the
same again: the noise floor), ``fp8 tensorwise`` and ``fp8 rowwise`` (torchao ``Float8Linear`` through
devplug's own conversion, ``devplug.toolkit.float8_conversion``, under the same autocast), ``fp8 tensorwise
+gather`` (with torchao's FSDP fp8 all-gather weight wrapper, which the CUDA plugin used to put on every run:
what the wrapper costs where nothing gathers), and with ``--compile`` (the default) each of bf16 and the fp8
recipes ``torch.compile``d. Variants run interleaved in rounds (``_timing.interleaved_samples``), each timed call
``--iters`` forward+backward passes between device synchronisations; the table gives the median ms per pass,
the achieved TFLOP/s (3 GEMMs of 2·M·K·N FLOPs per linear) and each variant's time paired with bf16 eager in
the same round; a verdict line per fp8 variant against the bf16 of the same mode (eager or compiled), within
the A/A floor (at least 2 %) being noise.

Then, for the diagnosis:

- a ``torch.profiler`` table of one eager fp8 tensorwise forward+backward of the ``mlp`` pair: the top
  ``--top`` kernels by device time on a GPU (the casts, amax reductions and scaled matmuls fp8 adds), CPU ops
  by self time on a CPU;
- for each compiled fp8 variant, what dynamo did: graph breaks (with their reasons), recompiles, frames and
  graphs compiled, from ``torch._dynamo.utils.counters`` and the ``recompiles`` log. A graph break through
  torchao's tensor subclass shows here.

- ``host``: the LM example's network at ``--host-layers`` layers (8, as the LM run) but tiny (width 64, context
  32, batch 2), eager, one training step (forward, backward, fused AdamW) in bf16, bf16 again (A/A) and fp8
  tensorwise (every linear layer but the tied head): ms per step (at this size all host time: Python and
  kernel launches), the aten operators per step (``torch.profiler``) and the calls of torchao's
  ``Float8TrainingTensor.__torch_dispatch__``. Eager fp8 runs about three times bf16's operators: where a GPU
  step is short, the host bounds it (``--host-layers 0`` skips this).

Without fp8 matrix units (a CPU, a GPU older than compute capability 8.9) ``--emulate`` runs torchao's emulation
(the fp8 path in higher precision: the counts and the profile's op list hold, the times do not).

Run: python benchmarks/fp8_layers.py [--device cuda] [--tokens 8192] [--width 2048] [--rounds 7] [--iters 20]
     [--recipes tensorwise,rowwise] [--shapes square,mlp] [--no-compile] [--top 15]
     python benchmarks/fp8_layers.py --device cpu --emulate --tokens 256 --width 64 --rounds 3   # tries it here
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import logging
import statistics
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from _timing import interleaved_samples, paired_ratio

from devplug.toolkit import float8_conversion

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
if str(EXAMPLES) not in sys.path:  # the LM example's package, lm, is the folder examples/lm/
    sys.path.insert(0, str(EXAMPLES))
from lm.models import LanguageModel, ModelSpec  # noqa: E402
from lm.train import next_byte_loss  # noqa: E402

BF16, AA = "bf16 eager", "bf16 eager (A/A)"
RECIPES = ("tensorwise", "rowwise")
SHAPES = ("square", "mlp")


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The flags; a bad one is one line and exit status 2."""
    parser = argparse.ArgumentParser(prog="fp8_layers.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None,
                        help="device to time on (default: cuda; without one the script says so and exits 0)")
    parser.add_argument("--tokens", type=int, default=8192, help="rows per pass: batch x context (default: 8192)")
    parser.add_argument("--width", type=int, default=2048, help="the model width; the MLP is 4x it (default: 2048)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default: 7)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per variant first (default: 2)")
    parser.add_argument("--iters", type=int, default=20, help="forward+backward passes per timed call (default: 20)")
    parser.add_argument("--recipes", default=",".join(RECIPES), help="fp8 recipes, comma-separated (default: both)")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="shapes, comma-separated (default: both)")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the torch.compile'd variants and count graph breaks (default: on)")
    parser.add_argument("--emulate", action="store_true",
                        help="torchao's fp8 emulation (higher precision: any device, no speed-up)")
    parser.add_argument("--step", action="store_true",
                        help="a fused AdamW step in every pass too (what a weight wrapper costs the optimizer)")
    parser.add_argument("--top", type=int, default=15, help="rows of the profiler table (default: 15)")
    parser.add_argument("--host-layers", type=int, default=8,
                        help="layers of the tiny LM network whose host cost per step is measured; 0 skips it "
                             "(default: 8, as the LM run)")
    args = parser.parse_args(argv)
    args.device_given = args.device is not None
    args.device = args.device or "cuda"
    args.recipes = [r for r in args.recipes.split(",") if r]
    args.shapes = [s for s in args.shapes.split(",") if s]
    for name, given, known in (("recipe", args.recipes, RECIPES), ("shape", args.shapes, SHAPES)):
        for item in given:
            if item not in known:
                parser.error(f"unknown {name} {item!r}; choose from {', '.join(known)}")
    for flag in ("tokens", "width", "rounds", "iters", "top"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be at least 1")
    if args.width % 16 or args.tokens % 16:
        parser.error("--width and --tokens must be multiples of 16 (fp8 matrix multiplies need it)")
    return args


def fp8_problem(device: torch.device, emulate: bool) -> str | None:
    """Why real fp8 matmuls cannot run on ``device`` (``None``: they can, or ``emulate`` asks for none)."""
    if emulate:
        return None
    if device.type != "cuda":
        return f"{device.type} has no fp8 matrix units: pass --emulate to run torchao's emulation"
    capability = torch.cuda.get_device_capability(device)
    if capability < (8, 9):
        return (f"this GPU (compute capability {capability[0]}.{capability[1]}) has no fp8 matrix units (8.9 and "
                "newer have them): pass --emulate")
    return None


def make_layers(shape: str, width: int) -> torch.nn.Module:
    """The fp32 layers of ``shape``, seeded, so every variant starts from the same weights."""
    torch.manual_seed(0)
    if shape == "square":
        return torch.nn.Sequential(torch.nn.Linear(width, width))
    return torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))


def flops_per_pass(shape: str, tokens: int, width: int) -> float:
    """Forward+backward FLOPs of ``shape``: 3 GEMMs of 2·M·K·N per linear layer."""
    weights = width * width if shape == "square" else 2 * width * 4 * width
    return 6.0 * tokens * weights


class Pass:
    """One forward+backward of a module on a fixed input, under bfloat16 autocast; with ``step``, also a fused
    AdamW step over the module's parameters (where a weight wrapper's cost in the optimizer shows)."""

    def __init__(self, module: torch.nn.Module, x: torch.Tensor, device: torch.device, step: bool = False) -> None:
        self.module, self.x, self.device = module, x, device
        self.optimizer = torch.optim.AdamW(module.parameters(), lr=1e-6, fused=True) if step else None
        self.grad: torch.Tensor | None = None

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bfloat16 autocast on the device, as the LM's forward runs."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def __call__(self) -> None:
        with self.autocast():
            out = self.module(self.x)
        if self.grad is None:  # the first call (a compiled module's compile) makes the output gradient
            self.grad = torch.ones_like(out)
        out.backward(self.grad)
        self.x.grad = None
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        else:
            for p in self.module.parameters():
                p.grad = None


def convert(module: torch.nn.Module, recipe: str, emulate: bool, gather: bool = False) -> torch.nn.Module:
    """``module`` with every linear layer swapped for torchao's ``Float8Linear`` (devplug's conversion)."""
    made = float8_conversion(recipe=recipe, emulate=emulate, fp8_all_gather=gather, small_layers=True)(module)
    return made or module


def build(shape: str, args: argparse.Namespace, device: torch.device) -> dict[str, Pass]:
    """Every variant of ``shape``: name → its forward+backward."""
    base = make_layers(shape, args.width).to(device)
    x = torch.randn(args.tokens, args.width, device=device).requires_grad_(True)
    modules: dict[str, torch.nn.Module] = {BF16: copy.deepcopy(base), AA: copy.deepcopy(base)}
    for recipe in args.recipes:
        modules[f"fp8 {recipe} eager"] = convert(copy.deepcopy(base), recipe, args.emulate)
    if "tensorwise" in args.recipes:
        modules["fp8 tensorwise+gather eager"] = convert(copy.deepcopy(base), "tensorwise", args.emulate, gather=True)
    if args.compile:
        modules["bf16 compiled"] = torch.compile(copy.deepcopy(base))
        for recipe in args.recipes:
            modules[f"fp8 {recipe} compiled"] = torch.compile(convert(copy.deepcopy(base), recipe, args.emulate))
    return {name: Pass(module, x, device, args.step) for name, module in modules.items()}


class DynamoWatch:
    """Graph breaks, recompiles, frames and graphs of the compiles that happen inside ``watch()``."""

    ARTIFACTS = ("recompiles",)

    def __init__(self) -> None:
        self.recompiles: list[str] = []

    @contextlib.contextmanager
    def watch(self) -> Iterator[dict[str, Any]]:
        """Count what dynamo does inside; the yielded dict is filled on exit."""
        from torch._dynamo.utils import counters

        counters.clear()
        self.recompiles = []
        found: dict[str, Any] = {}
        watched = self._listen()
        try:
            yield found
        finally:
            for logger, handler, propagate in watched:
                logger.removeHandler(handler)
                logger.propagate = propagate
            torch._logging.set_logs()
            breaks = dict(counters["graph_break"])
            found.update(graph_breaks=sum(breaks.values()), reasons=breaks, recompiles=len(self.recompiles),
                         frames=counters["frames"]["total"], graphs=counters["stats"]["unique_graphs"],
                         recompile_reasons=list(self.recompiles))

    def _listen(self) -> list[tuple[logging.Logger, logging.Handler, bool]]:
        """Route the ``recompiles`` log to this object only (not to stderr)."""
        torch._logging.set_logs(recompiles=True)
        seen = self.recompiles

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                seen.append(" ".join(record.getMessage().split()))

        watched = []
        for name in list(logging.root.manager.loggerDict):
            if name.startswith("torch") and name.endswith("__recompiles"):
                logger = logging.getLogger(name)
                handler = Keep()
                watched.append((logger, handler, logger.propagate))
                logger.addHandler(handler)
                logger.propagate = False
        return watched


def synchronizer(device: torch.device) -> Callable[[], None]:
    """Waits for the device's queued work (nothing to wait for on a CPU)."""
    if device.type == "cpu":
        return lambda: None
    module = torch.get_device_module(device.type)
    return lambda: module.synchronize(device)


def timed(passes: Mapping[str, Callable[[], None]], iters: int,
          sync: Callable[[], None]) -> dict[str, Callable[[], None]]:
    """Each variant as a timed call: ``iters`` passes (or steps), then a device synchronisation."""

    def block(run: Callable[[], None]) -> Callable[[], None]:
        def call() -> None:
            for _ in range(iters):
                run()
            sync()

        return call

    return {name: block(run) for name, run in passes.items()}


def time_shape(shape: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Time every variant of ``shape``; print its table and verdicts; the compile counts."""
    sync = synchronizer(device)
    passes = build(shape, args, device)
    counts: dict[str, dict[str, Any]] = {}
    watch = DynamoWatch()
    for name, run in passes.items():  # compile here, one variant at a time, so each one's counts are its own
        if "compiled" in name:
            with watch.watch() as found:  # the compile: graph breaks, frames, graphs
                run()
                sync()
            with watch.watch() as again:  # the calls after it, as a training loop's next steps
                for _ in range(2):
                    run()
                sync()
            counts[name] = dict(found, recompiles=again["recompiles"], recompile_reasons=again["recompile_reasons"],
                                graph_breaks=found["graph_breaks"] + again["graph_breaks"])
    sync()
    samples = interleaved_samples(timed(passes, args.iters, sync), rounds=args.rounds, warmup=args.warmup)
    per_pass = {name: statistics.median(times) / args.iters for name, times in samples.items()}
    flops = flops_per_pass(shape, args.tokens, args.width)
    aa = [a / b for a, b in zip(samples[AA], samples[BF16], strict=True)]
    floor = max(0.02, max(abs(r - 1) for r in aa))
    w = args.width
    layers = f"Linear({w}, {w})" if shape == "square" else f"Linear({w}, {4 * w}), GELU, Linear({4 * w}, {w})"
    what = "forward+backward+AdamW step" if args.step else "forward+backward"
    print(f"\n{shape}: {layers} on {args.tokens} tokens, {what}, {args.rounds} rounds x {args.iters} passes")
    print(f"{'variant':<30} {'ms/pass':>10} {'TFLOP/s':>10} {'time / bf16 eager':>18}")
    for name in passes:
        ratio = paired_ratio(samples, name, BF16)
        print(f"{name:<30} {per_pass[name] * 1e3:>10.3f} {flops / per_pass[name] / 1e12:>10.3g} {ratio:>18.3f}")
    print(f"A/A floor: bf16 eager (A/A)/bf16 eager per round {min(aa):.3f}-{max(aa):.3f} -> floor "
          f"{floor * 100:.1f}%")
    for name in passes:
        if not name.startswith("fp8"):
            continue
        against = "bf16 compiled" if "compiled" in name else BF16
        ratio = paired_ratio(samples, name, against)
        verdict = "faster" if ratio < 1 - floor else ("slower" if ratio > 1 + floor else "within noise")
        print(f"{shape}: {name} {ratio:.2f}x the time of {against} -> {verdict}")
    for name, found in counts.items():
        reasons = "; ".join(f"{why} ({n})" for why, n in found["reasons"].items()) or "none"
        print(f"{shape}: {name}: graph breaks {found['graph_breaks']}, recompiles after the first call "
              f"{found['recompiles']}, frames {found['frames']}, graphs {found['graphs']}; break reasons: {reasons}")
        for why in found["recompile_reasons"][:3]:
            print(f"  recompile: {why[:300]}")
    return {"per_pass_s": per_pass, "floor": floor, "counts": counts}


def profile(args: argparse.Namespace, device: torch.device) -> None:
    """The profiler table of one eager fp8 forward+backward of the MLP pair (after a warm-up pass)."""
    recipe = "tensorwise" if "tensorwise" in args.recipes else args.recipes[0]
    shape = "mlp" if "mlp" in args.shapes else args.shapes[0]
    module = convert(make_layers(shape, args.width).to(device), recipe, args.emulate)
    x = torch.randn(args.tokens, args.width, device=device).requires_grad_(True)
    run, sync = Pass(module, x, device, args.step), synchronizer(device)
    run()
    sync()
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with torch_profile(activities=activities) as prof:
        run()
        sync()
    by = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    what = "kernels and ops by self device time" if device.type == "cuda" else "CPU ops by self CPU time"
    print(f"\nprofile: fp8 {recipe} eager, {shape}, one forward+backward on {args.tokens} tokens: top {args.top} "
          f"{what}")
    print(prof.key_averages().table(sort_by=by, row_limit=args.top, max_name_column_width=60))


class LMStep:
    """One eager training step of the LM example's network (next-byte loss under bfloat16 autocast, backward,
    fused AdamW) on a fixed batch of tokens."""

    def __init__(self, model: torch.nn.Module, tokens: torch.Tensor, device: torch.device) -> None:
        self.model, self.tokens, self.device = model, tokens, device
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)

    def __call__(self) -> None:
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            loss = next_byte_loss(self.model, self.tokens)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def host(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The tiny LM network's eager step in bf16 and fp8: ms, aten operators and subclass dispatches per step."""
    from torchao.float8 import float8_training_tensor  # type: ignore[import-untyped]  # torchao ships no py.typed

    spec = ModelSpec(width=64, layers=args.host_layers, heads=2, context=32)
    tokens = torch.randint(0, 256, (2, spec.context + 1), generator=torch.Generator().manual_seed(0)).to(device)
    fp8 = float8_conversion(recipe="tensorwise", emulate=args.emulate, small_layers=True, skip=("head",))
    steps: dict[str, LMStep] = {}
    for name in (BF16, AA, "fp8 tensorwise eager"):
        torch.manual_seed(0)
        model = LanguageModel(spec).to(device)
        steps[name] = LMStep(fp8(model) or model if name.startswith("fp8") else model, tokens, device)
    sync = synchronizer(device)
    subclass = float8_training_tensor.Float8TrainingTensor
    dispatch = subclass.__dict__["__torch_dispatch__"].__func__
    calls = [0]

    def counted(cls: Any, *rest: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return dispatch(cls, *rest, **kwargs)

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    operators, dispatches = {}, {}
    subclass.__torch_dispatch__ = classmethod(counted)
    try:
        for name, step in steps.items():
            step()  # warm-up: the optimizer's state, the allocator
            sync()
            before = calls[0]
            with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
                step()
                sync()
            operators[name] = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
            dispatches[name] = calls[0] - before
    finally:
        subclass.__torch_dispatch__ = classmethod(dispatch)
    samples = interleaved_samples(timed(steps, args.iters, sync), rounds=args.rounds, warmup=args.warmup)
    per_step = {name: statistics.median(times) / args.iters for name, times in samples.items()}
    print(f"\nhost: the LM network, {spec.layers} layers at width {spec.width}, context {spec.context}, batch 2 "
          f"(tiny: the step is host time), eager, forward+backward+AdamW; {args.rounds} rounds x {args.iters} steps")
    print(f"{'variant':<30} {'ms/step':>10} {'time / bf16':>12} {'aten ops/step':>14} {'fp8 dispatches/step':>20}")
    for name in steps:
        print(f"{name:<30} {per_step[name] * 1e3:>10.3f} {paired_ratio(samples, name, BF16):>12.3f} "
              f"{operators[name]:>14,} {dispatches[name]:>20,}")
    return {"per_step_s": per_step, "operators": operators, "dispatches": dispatches}


def main(argv: list[str] | None = None) -> int:
    """Time, profile and count; the exit status."""
    args = parse(argv)
    try:
        device = torch.device(args.device)
    except RuntimeError as exc:
        print(f"fp8_layers: error: --device {args.device!r}: {exc}", file=sys.stderr)
        return 2
    if device.type != "cpu":
        module = getattr(torch, device.type, None)
        if module is None or not module.is_available():
            if not args.device_given:
                print(f"fp8_layers: no {device.type} device here: nothing timed (on a CPU: --device cpu --emulate "
                      "--tokens 256 --width 64)")
                return 0
            print(f"fp8_layers: error: --device {args.device}: not available here", file=sys.stderr)
            return 2
    problem = fp8_problem(device, args.emulate)
    if problem is not None:
        print(f"fp8_layers: error: {problem}", file=sys.stderr)
        return 2
    try:
        import torchao  # type: ignore[import-untyped]  # torchao ships no py.typed
    except ImportError:
        print("fp8_layers: error: torchao is not installed: pip install 'devplug[fp8]'", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        name += f", compute capability {major}.{minor}"
    print(f"fp8_layers: {name}; torch {torch.__version__}, torchao {torchao.__version__}; "
          f"{'emulated fp8' if args.emulate else 'fp8 matrix multiplies'}; bf16 autocast, fp32 weights; "
          f"tokens {args.tokens}, width {args.width}")
    # the variants of a shape compile the same frame (nn.Sequential's forward), each a cache entry of its own
    for limit in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, max(64, getattr(torch._dynamo.config, limit)))
    for shape in args.shapes:
        time_shape(shape, args, device)
    profile(args, device)
    if args.host_layers > 0:
        host(args, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
