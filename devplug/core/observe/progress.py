"""The progress bar's figures: short enough that an 80-column line shows throughput, data wait and MFU."""

from __future__ import annotations

from collections.abc import Mapping

from devplug.core.observe.metrics import MEASURED_NAMES

#: Logged values the bar shows at most (the first ones logged); the loggers get them all.
SHOWN_VALUES = 2

#: The bar's line with a known total: tqdm's default without its steps/s, which the samples/s replace.
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"


def progress_postfix(values: Mapping[str, float]) -> str:
    """``"1.23k/s wait 3% mfu 41% loss 0.312"``: samples/s, data wait and MFU first, then the first logged values.

    Learning rates, FLOPs per sample and samples per dollar stay in the loggers; figures keep three
    significant digits, shares two. With `BAR_FORMAT` a 100 000-step run's line holds the samples/s,
    data wait, MFU and the loss within 80 columns.
    """
    parts: list[str] = []
    if "samples_per_sec" in values:
        parts.append(f"{_short(values['samples_per_sec'])}/s")
    if "data_wait" in values:
        parts.append(f"wait {_percent(values['data_wait'])}")
    if "mfu" in values:
        parts.append(f"mfu {_percent(values['mfu'])}")
    logged = [k for k in values if k not in MEASURED_NAMES and not k.startswith("lr/")]
    parts.extend(f"{name} {values[name]:.3g}" for name in logged[:SHOWN_VALUES])
    return " ".join(parts)


def _short(number: float) -> str:
    """``1234.5`` → ``"1.23k"``, ``12.3`` → ``"12.3"``: three significant digits and an SI suffix."""
    number = float(f"{number:.3g}")  # rounded first: 999.7 is "1k", not "1e+03"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(number) >= scale:
            return f"{number / scale:.3g}{suffix}"
    return f"{number:.3g}"


def _percent(share: float) -> str:
    """``0.4123`` → ``"41%"``, ``0.031`` → ``"3.1%"``, ``2e-6`` → ``"<0.1%"``: two significant digits."""
    if 0 < share < 0.001:
        return "<0.1%"
    text = f"{share * 100:.2g}"
    return f"{share * 100:.0f}%" if "e" in text else f"{text}%"  # 0.997: "100%", not "1e+02%"
