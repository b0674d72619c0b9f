"""Generator for `deep_call_graph_traversal`: the bug sits several calls below the function that shows it.

The scenario is a small package of records (`models.py`), a low-level helper module holding the buggy
helper next to correct look-alikes, `call_depth - 3` pass-through hops in their own modules, a
per-record `measure`, aggregations, and the public `api.py`. The issue reports a wrong result of one
public function (the symptom site); the fix belongs in the helper, `call_depth` calls below it. The hidden
tests reach the same helper through *other* public functions, so patching the symptom site (or
hard-coding the example) does not pass.

Difficulty (metadata.difficulty): call_depth (3-5 calls from the public entry to the helper), n_decoys
(correct sibling helpers in the same module), n_files.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from pipeline.swebench.generators.common import Case, Draft, Outcome, generate_with_retries
from pipeline.swebench.generators.helpers import HELPERS, HelperTemplate, draw_input
from pipeline.swebench.scenario import Scenario

CAPABILITY = "deep_call_graph_traversal"


@dataclass(frozen=True)
class Domain:
    package: str
    record: str  # record class name
    key: str  # record field that groups records
    keys: tuple[str, ...]  # key values
    items: str  # plural noun for the records (function names)
    what: str  # what the package does, for docstrings


DOMAINS = (
    Domain("greenhouse", "Reading", "zone", ("north", "south", "east", "west", "atrium"), "readings",
           "Greenhouse climate readings per zone."),
    Domain("freightyard", "Consignment", "dock", ("d1", "d2", "d3", "d4", "d5"), "consignments",
           "Consignments handled at the freight yard's docks."),
    Domain("clinicq", "Visit", "ward", ("amber", "birch", "cedar", "delta"), "visits",
           "Clinic visits grouped by ward."),
    Domain("tidewatch", "Sample", "station", ("pier", "buoy", "inlet", "reef", "shoal"), "samples",
           "Tide-gauge samples per station."),
    Domain("printfarm", "Job", "printer", ("alpha", "bravo", "charlie", "delta"), "jobs",
           "Print jobs queued on a farm of printers."),
    Domain("orchardlog", "Harvest", "row", ("r1", "r2", "r3", "r4", "r5", "r6"), "harvests",
           "Orchard harvest records per row."),
    Domain("busdepot", "Trip", "route", ("r10", "r22", "r31", "r47"), "trips",
           "Bus trips per route at the depot."),
    Domain("labbench", "Assay", "bench", ("b1", "b2", "b3", "b4"), "assays",
           "Laboratory assays per bench."),
)

LOW_MODULES = ("units", "calc", "formulas", "metrics")
HOP_MODULES = ("extract", "resolve", "adapters", "fieldmap")


def _hop_source(kind: str, name: str, next_call: str, next_import: str, record: str, x: str, y: str,
                key: str) -> str:
    """A per-record pass-through function in its own module; `next_call` uses `record`."""
    head = f'"""Per-record plumbing between the aggregations and the formulas."""\n{next_import}\n\n\n'
    if kind == "checked":
        return head + (f"def {name}(record):\n"
                       f'    """Reject records whose {y} is negative before computing their value."""\n'
                       f"    if record.{y} < 0:\n"
                       f"        raise ValueError(f'negative {y} in {{record!r}}')\n"
                       f"    return {next_call}\n")
    if kind == "cached":
        return head + ("_CACHE = {}\n\n\n"
                       f"def {name}(record):\n"
                       f'    """Value of one record, memoised on its fields."""\n'
                       f"    key = (record.{key}, record.{x}, record.{y})\n"
                       "    if key not in _CACHE:\n"
                       f"        _CACHE[key] = {next_call}\n"
                       "    return _CACHE[key]\n")
    return head + (f"def {name}(record):\n"
                   f'    """Value of one record (the formulas take plain numbers)."""\n'
                   f"    value = {next_call}\n"
                   "    return value\n")


def build(rng: random.Random, seed: int, call_depth: int | None = None, n_decoys: int | None = None) -> Draft:
    domain = rng.choice(DOMAINS)
    helper: HelperTemplate = rng.choice(HELPERS)
    depth = call_depth if call_depth is not None else rng.choice((3, 4, 5))
    if not 3 <= depth <= 5:
        raise ValueError(f"call_depth must be 3, 4 or 5, got {depth}")
    decoys = n_decoys if n_decoys is not None else rng.randint(1, 3)
    pkg, record, key = domain.package, domain.record, domain.key
    x, y = rng.choice(helper.fields)
    helper_name = rng.choice(helper.names)
    low = rng.choice(LOW_MODULES)

    # the low-level module: the helper plus correct look-alike siblings
    siblings = [h for h in HELPERS if h.key != helper.key]
    rng.shuffle(siblings)
    sibling_defs = []
    for sibling in siblings[:decoys]:
        sx, sy = rng.choice(sibling.fields)
        sibling_defs.append((sibling, rng.choice(sibling.names), sx, sy))

    def low_module(fixed: bool) -> str:
        parts = [helper.source(helper_name, x, y, fixed)]
        parts += [s.source(name, sx, sy, True) for s, name, sx, sy in sibling_defs]
        rng_order = list(range(len(parts)))
        random.Random(seed).shuffle(rng_order)
        body = "\n\n".join(parts[i] for i in rng_order)
        return f'"""Formulas shared by the {domain.items} reports."""\nimport math\n\n\n{body}'

    # pass-through hops between measure and the helper
    hop_kinds = rng.sample(("checked", "cached", "plain"), depth - 3)
    hop_modules = rng.sample(HOP_MODULES, depth - 3)
    hop_names = [f"{kind}_value" if kind != "plain" else "record_value" for kind in hop_kinds]
    files: dict[str, str] = {}
    next_import = f"from {pkg}.{low} import {helper_name}"
    next_call = f"{helper_name}(record.{x}, record.{y})"
    for kind, module, name in reversed(list(zip(hop_kinds, hop_modules, hop_names))):
        files[f"{pkg}/{module}.py"] = _hop_source(kind, name, next_call, next_import, record, x, y, key)
        next_import = f"from {pkg}.{module} import {name}"
        next_call = f"{name}(record)"

    files[f"{pkg}/__init__.py"] = f'"""{domain.what}"""\n'
    files[f"{pkg}/models.py"] = (
        f'"""Record types of {pkg}."""\nfrom dataclasses import dataclass\n\n\n'
        f"@dataclass(frozen=True)\nclass {record}:\n"
        f'    """One record: its {key} and two counts."""\n\n'
        f"    {key}: str\n    {x}: int\n    {y}: int\n")
    files[f"{pkg}/measure.py"] = (
        f'"""The value of one {record.lower()}."""\n{next_import}\n\n\n'
        f"def measure(record):\n"
        f'    """Value of one {record.lower()} as used by every report."""\n'
        f"    return {next_call}\n")
    files[f"{pkg}/aggregate.py"] = (
        f'"""Aggregations over {domain.items}."""\nfrom {pkg}.measure import measure\n\n\n'
        f"def usable(records):\n"
        f'    """Records that name a {key}."""\n'
        f"    return [r for r in records if r.{key}]\n\n\n"
        f"def totals_by_{key}(records):\n"
        f'    """Sum of the measured values per {key}."""\n'
        f"    totals = {{}}\n"
        f"    for record in usable(records):\n"
        f"        totals[record.{key}] = totals.get(record.{key}, 0) + measure(record)\n"
        f"    return {{k: round(v, 4) for k, v in totals.items()}}\n\n\n"
        f"def grand_total(records):\n"
        f'    """Sum of the measured values of all usable records."""\n'
        f"    return round(sum(measure(r) for r in usable(records)), 4)\n")
    top, report, flagged = f"top_{key}", f"{key}_report", f"{key}s_at_or_above"
    listing, count = f"{key}s", f"count_{domain.items}"
    files[f"{pkg}/api.py"] = (
        f'"""Public functions of {pkg}."""\n'
        f"from {pkg}.aggregate import grand_total, totals_by_{key}, usable\n"
        f"from {pkg}.models import {record}\n\n"
        f"__all__ = ['{record}', 'grand_total', 'totals_by_{key}', '{top}', '{report}', '{flagged}', "
        f"'{listing}', '{count}']\n\n\n"
        f"def {top}(records):\n"
        f'    """The {key} with the largest total (ties: the first name in alphabetical order)."""\n'
        f"    totals = totals_by_{key}(records)\n"
        f"    if not totals:\n"
        f"        return None\n"
        f"    return min(totals, key=lambda k: (-totals[k], k))\n\n\n"
        f"def {report}(records):\n"
        f'    """One line per {key}, alphabetical: \'<{key}>: <total>\'."""\n'
        f"    totals = totals_by_{key}(records)\n"
        f"    return '\\n'.join(f'{{k}}: {{totals[k]}}' for k in sorted(totals))\n\n\n"
        f"def {flagged}(records, threshold):\n"
        f'    """{key.capitalize()}s whose total is at least `threshold`, alphabetical."""\n'
        f"    totals = totals_by_{key}(records)\n"
        f"    return sorted(k for k, v in totals.items() if v >= threshold)\n\n\n"
        f"def {listing}(records):\n"
        f'    """The distinct {key}s, alphabetical."""\n'
        f"    return sorted({{r.{key} for r in usable(records)}})\n\n\n"
        f"def {count}(records):\n"
        f'    """How many records name a {key}."""\n'
        f"    return len(usable(records))\n")

    buggy = dict(files)
    fixed = dict(files)
    buggy[f"{pkg}/{low}.py"] = low_module(False)
    fixed[f"{pkg}/{low}.py"] = low_module(True)

    # ---- cases -----------------------------------------------------------------------------------
    api = f"{pkg}.api"

    def records(n: int, n_trigger: int) -> str:
        flags = [True] * n_trigger + [False] * (n - n_trigger)
        rng.shuffle(flags)
        keys = rng.sample(domain.keys, min(len(domain.keys), rng.randint(2, 3)))
        parts = []
        for flag in flags:
            a, b = draw_input(helper, rng, trigger=flag)
            parts.append(f"{record}({rng.choice(keys)!r}, {a}, {b})")
        return "[" + ", ".join(parts) + "]"

    def case(name: str, kind: str, func: str, args: list[str]) -> Case:
        return Case(name, kind, func, args, {api: [func, record]})

    target_func = rng.choice((top, report, flagged))
    threshold = str(rng.randint(0, 6))
    target_args = [records(rng.randint(3, 5), rng.randint(1, 2))] + ([threshold] if target_func == flagged else [])
    cases = [case(f"{target_func}_matches_the_documented_rule", "target", target_func, target_args)]
    for func in (f"totals_by_{key}", "grand_total"):
        cases.append(case(f"{func}_on_mixed_records", "hidden", func, [records(rng.randint(3, 5), rng.randint(1, 2))]))
    for func in (top, report, f"totals_by_{key}", "grand_total", listing, count):
        cases.append(case(f"{func}_on_plain_records", "regression", func, [records(rng.randint(2, 5), 0)]))
    cases.append(case(f"{flagged}_on_plain_records", "regression", flagged, [records(4, 0), threshold]))
    cases.append(case(f"{top}_of_no_records", "regression", top, ["[]"]))
    cases.append(case(f"{count}_skips_records_without_{key}", "regression", count,
                      [f"[{record}('', 1, 2), {record}({domain.keys[0]!r}, 2, 2)]"]))
    for sibling, name, _, _ in sibling_defs[:2]:
        a, b = draw_input(sibling, rng, trigger=False)
        cases.append(Case(f"{name}_formula", "regression", name, [str(a), str(b)], {f"{pkg}.{low}": [name]}))
    if rng.random() < 0.5:  # a direct unit test of the helper on inputs the bug does not touch
        a, b = draw_input(helper, rng, trigger=False)
        cases.append(Case(f"{helper_name}_formula", "regression", helper_name, [str(a), str(b)],
                          {f"{pkg}.{low}": [helper_name]}))
    example = helper.example(helper.fixed_fn)

    def problem(draft: Draft, target: Case, before: Outcome, after: Outcome) -> str:
        got = f"returns {before.value!r}" if before.ok else f"raises {before.value}"
        rule = helper.rule.format(x=x, y=y, example=example)
        return (f"`{target.func}` gives a wrong answer\n\n"
                f"With the {domain.items} below, `{target.func}` {got}; I expected {after.value!r}.\n\n"
                f"```python\nfrom {api} import {target.func}, {record}\n\n{target.call}\n```\n\n"
                f"{rule} This is about the `{x}` and `{y}` fields of each {record}.\n")

    return Draft(
        capability=CAPABILITY, seed=seed, package=pkg, buggy=buggy, fixed=fixed, cases=cases,
        test_path=f"tests/test_{pkg}_api.py", hidden_path=f"tests/test_hidden_{pkg}.py",
        entry=(f"{pkg}/api.py", target_func), problem=problem,
        difficulty={"call_depth": depth, "n_decoys": decoys, "n_files": len(buggy) + 1, "helper": helper.key},
        test_docstring=f"Tests of the {pkg} public API.",
    )


def generate(seed: int, call_depth: int | None = None, n_decoys: int | None = None) -> Scenario:
    """The scenario of `seed` (deterministic)."""
    return generate_with_retries(lambda rng: build(rng, seed, call_depth, n_decoys), seed)
