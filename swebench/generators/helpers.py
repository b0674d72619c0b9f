"""Small numeric helpers with one realistic bug each: the low-level functions the deep-call-graph scenarios
hide several calls below the public API (and, correct, the decoy siblings next to them).

Each `HelperTemplate` has a buggy and a fixed body over two integer parameters, plain-Python mirrors of
both (`buggy_fn`, `fixed_fn`) used to draw inputs that do or do not trigger the bug, and the rule a user
would state in the issue.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class HelperTemplate:
    key: str
    names: tuple[str, ...]  # candidate function names
    fields: tuple[tuple[str, str], ...]  # candidate (x, y) parameter / record field names
    doc: str  # docstring, with {x} {y}: what the function is for, true of the buggy and the fixed body alike
    buggy: str  # body lines (4-space indented), with {x} {y}
    fixed: str
    buggy_fn: Callable[[int, int], Any]
    fixed_fn: Callable[[int, int], Any]
    draw: Callable[[random.Random], tuple[int, int]]  # any plausible input (the caller filters)
    rule: str  # the intended behaviour in a user's words, with {x} {y} {example}
    example: Callable[[Callable[[int, int], Any]], str]  # a worked example from fixed_fn

    def source(self, name: str, x: str, y: str, fixed: bool, example: tuple[int, int] | None = None) -> str:
        """The function; `example` (an input the bug does not touch) adds a doctest that holds for both
        versions, so the docstring documents the code as shipped."""
        body = (self.fixed if fixed else self.buggy).format(x=x, y=y)
        doc = self.doc.format(x=x, y=y)
        if example is not None:
            if self.triggers(*example):
                raise ValueError(f"helper {self.key}: the doctest input {example} triggers the bug")
            doc += f"\n\n    >>> {name}{example}\n    {self.fixed_fn(*example)!r}\n    "
        return f'def {name}({x}, {y}):\n    """{doc}"""\n{body}\n'

    def triggers(self, x: int, y: int) -> bool:
        return _outcome(self.buggy_fn, x, y) != _outcome(self.fixed_fn, x, y)


def _outcome(fn: Callable[[int, int], Any], x: int, y: int) -> tuple[bool, Any]:
    try:
        value = fn(x, y)
    except ZeroDivisionError:
        return False, "ZeroDivisionError"
    return True, (type(value).__name__, value)


def _half_up(x: int, y: int) -> int:
    return math.floor(x / y + 0.5)


HELPERS: tuple[HelperTemplate, ...] = (
    HelperTemplate(
        key="floor_band",
        names=("band_index", "bucket_of", "slot_for"),
        fields=(("offset", "band_width"), ("drift", "bin_size"), ("delta", "step")),
        doc="Band number of {x} for bands {y} wide.",
        buggy="    return int({x} / {y})",
        fixed="    return math.floor({x} / {y})",
        buggy_fn=lambda x, y: int(x / y),
        fixed_fn=lambda x, y: math.floor(x / y),
        draw=lambda rng: (rng.randint(-40, 40), rng.choice((2, 4, 5, 10))),
        rule="Bands are {y} wide and band 0 starts at zero, so a negative {x} belongs to a band below "
             "zero: {example}.",
        example=lambda f: f"a value of -3 with a width of 10 is in band {f(-3, 10)}",
    ),
    HelperTemplate(
        key="half_up",
        names=("whole_units", "billable_blocks", "units_for"),
        fields=(("minutes", "block"), ("amount", "unit"), ("volume", "portion")),
        doc="{x} counted in whole {y}s (rounded).",
        buggy="    return round({x} / {y})",
        fixed="    return math.floor({x} / {y} + 0.5)",
        buggy_fn=lambda x, y: round(x / y),
        fixed_fn=_half_up,
        draw=lambda rng: (rng.randint(1, 60), rng.choice((2, 4, 10))),
        rule="Counts are rounded to whole units with halves always rounded up: {example}.",
        example=lambda f: f"25 split into units of 10 counts as {f(25, 10)}, and 45 as {f(45, 10)}",
    ),
    HelperTemplate(
        key="ceil_div",
        names=("crates_needed", "trips_needed", "batches_for"),
        fields=(("items", "capacity"), ("parcels", "per_trip"), ("samples", "batch_size")),
        doc="Count of {y}-sized containers for {x}.",
        buggy="    return {x} // {y}",
        fixed="    return -(-{x} // {y})",
        buggy_fn=lambda x, y: x // y,
        fixed_fn=lambda x, y: -(-x // y),
        draw=lambda rng: (rng.randint(1, 40), rng.choice((2, 3, 4, 5, 6))),
        rule="A partly filled container still has to be counted: {example}.",
        example=lambda f: f"7 with a capacity of 3 needs {f(7, 3)}",
    ),
    HelperTemplate(
        key="inclusive_limit",
        names=("within_limit", "is_allowed", "fits_under"),
        fields=(("load", "limit"), ("weight", "max_weight"), ("level", "ceiling")),
        doc="Whether {x} is within {y}.",
        buggy="    return {x} < {y}",
        fixed="    return {x} <= {y}",
        buggy_fn=lambda x, y: x < y,
        fixed_fn=lambda x, y: x <= y,
        draw=lambda rng: (lambda y: (rng.choice((y, y - rng.randint(1, 5), y + rng.randint(1, 5))), y))(
            rng.randint(5, 30)),
        rule="A value exactly at its limit is still within the limit: {example}.",
        example=lambda f: f"a value of 10 with a limit of 10 counts as within ({f(10, 10)})",
    ),
    HelperTemplate(
        key="abs_deviation",
        names=("deviation", "gap_from_target", "distance_to_plan"),
        fields=(("reading", "target"), ("measured", "expected"), ("actual", "planned")),
        doc="Deviation of {x} from {y}.",
        buggy="    return {x} - {y}",
        fixed="    return abs({x} - {y})",
        buggy_fn=lambda x, y: x - y,
        fixed_fn=lambda x, y: abs(x - y),
        draw=lambda rng: (rng.randint(0, 40), rng.randint(0, 40)),
        rule="Being below the target is as far off as being above it: {example}.",
        example=lambda f: f"7 against a target of 10 is off by {f(7, 10)}",
    ),
    HelperTemplate(
        key="zero_guard",
        names=("usage_ratio", "share_of", "completion"),
        fields=(("used", "capacity"), ("done", "planned"), ("hits", "attempts")),
        doc="{x} as a share of {y}, to 4 places.",
        buggy="    if not {x}:\n        return 0.0\n    return round({x} / {y}, 4)",
        fixed="    if not {y}:\n        return 0.0\n    return round({x} / {y}, 4)",
        buggy_fn=lambda x, y: 0.0 if not x else round(x / y, 4),
        fixed_fn=lambda x, y: 0.0 if not y else round(x / y, 4),
        draw=lambda rng: (rng.randint(0, 20), rng.choice((0, 0, 2, 4, 5, 8, 10))),
        rule="An entry whose total is zero must count as 0.0 instead of stopping the whole computation: "
             "{example}.",
        example=lambda f: f"3 out of 0 counts as {f(3, 0)}",
    ),
)

HELPERS_BY_KEY = {h.key: h for h in HELPERS}


def draw_input(template: HelperTemplate, rng: random.Random, trigger: bool, tries: int = 200) -> tuple[int, int]:
    """An input that triggers the bug (or not), drawn from the template's distribution."""
    for _ in range(tries):
        x, y = template.draw(rng)
        if template.triggers(x, y) == trigger:
            return x, y
    raise RuntimeError(f"helper {template.key}: no {'triggering' if trigger else 'normal'} input in {tries} draws")
