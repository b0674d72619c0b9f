"""Text the report's sections share: a pass^1 cell, a paired interval, the names of the two evaluation modes."""
from __future__ import annotations

from typing import Any


def fmt_cell(cell: dict[str, float] | None) -> str:
    """mean ± std of a pass^1 cell over evaluation seeds ("-" where the model was not evaluated)."""
    return "-" if cell is None else f"{cell['mean']:.3f} ± {cell['std']:.3f}"


# The two evaluation modes, in report order; the sampled mode's temperature is the config's (`mode_name`).
MODE_TITLES = {"greedy": "greedy", "sampled": "sampled"}


def ci_text(cell: dict[str, Any] | None) -> str:
    """A paired difference with its interval, bold where the interval excludes 0, and the up/down task counts."""
    if cell is None:
        return "-"
    text = f"{cell['difference']:+.3f} [{cell['low']:+.3f}, {cell['high']:+.3f}]"
    counts = f" ({cell['better']}↑ {cell['worse']}↓)" if "better" in cell else ""
    return (f"**{text}**" if cell["excludes_zero"] else text) + counts


def mode_name(mode: str, temperature: str) -> str:
    """"greedy", or the sampled mode's name (e.g. "T=1")."""
    return "greedy" if mode == "greedy" else temperature
