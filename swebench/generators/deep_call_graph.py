"""Generator for `deep_call_graph_traversal`: the bug sits several calls below the function that shows it.

The scenario is a small package of records (`models.py`), a low-level helper module holding the buggy
helper next to correct look-alikes, `call_depth - 3` pass-through hops in their own modules, a
per-record `measure`, aggregations, a detail view of one record (`detail.py`, a second caller of the
helper that bypasses measure and the hops), and the public `api.py`. The issue reports a wrong result of
one public function (the symptom site) as a user sees it: the call, the value, the expected value and the
per-group sums of the same input; it never names a module, an internal function or a record field. The
fix belongs in the helper, `call_depth` calls below the symptom. The hidden tests reach the helper through
other public functions, through the detail view and directly, so a patch at the symptom site, in measure or
in a hop (masking the bug for the aggregations only), or hard-coding the example, does not pass: the
capability is finding the root, not silencing the symptom. Docstrings say what each function is for and hold
for the shipped (buggy) code; the helpers' doctests use inputs the bug does not touch.

Difficulty (metadata.difficulty): call_depth (3-5 calls from the public entry to the helper), n_decoys
(correct sibling helpers in the same module), size ("small": about 100 lines; "large", the default: 300-600
lines of source, with correct everyday modules around the bug, swebench/generators/filler.py),
n_files, source_lines.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from swebench.generators.common import Case, Draft, Outcome, evaluate, generate_with_retries
from swebench.generators.filler import SIZES, extend_module, pad_package, source_lines
from swebench.generators.helpers import HELPERS, HelperTemplate, draw_input
from swebench.scenario import Scenario

CAPABILITY = "deep_call_graph_traversal"
DEFAULT_SIZE = "large"


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


def build(rng: random.Random, seed: int, call_depth: int | None = None, n_decoys: int | None = None,
          size: str = DEFAULT_SIZE) -> Draft:
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

    # the low-level module: the helper plus correct look-alike siblings, each with a doctest that holds
    siblings = [h for h in HELPERS if h.key != helper.key]
    rng.shuffle(siblings)
    sibling_defs = []
    for sibling in siblings[:decoys]:
        sx, sy = rng.choice(sibling.fields)
        sibling_defs.append((sibling, rng.choice(sibling.names), sx, sy, draw_input(sibling, rng, trigger=False)))
    helper_example = draw_input(helper, rng, trigger=False)
    padding_rng = random.Random(f"{seed}:padding")
    extra_low_pieces = 2 if size == "large" else 0

    def low_module(fixed: bool) -> str:
        parts = [helper.source(helper_name, x, y, fixed, helper_example)]
        parts += [s.source(name, sx, sy, True, example) for s, name, sx, sy, example in sibling_defs]
        rng_order = list(range(len(parts)))
        random.Random(seed).shuffle(rng_order)
        body = "\n\n".join(parts[i] for i in rng_order)
        text = f'"""Formulas shared by the {domain.items} reports."""\nimport math\n\n\n{body}'
        return extend_module(text, random.Random(f"{seed}:low"), record.lower(), extra_low_pieces)

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
        f'    """Value of one {record.lower()} as used by the aggregations."""\n'
        f"    return {next_call}\n")
    # a second caller of the helper that bypasses measure and the hops: the detail view of one record
    detail = f"describe_{record.lower()}"
    files[f"{pkg}/detail.py"] = (
        f'"""The detail view of a single {record.lower()}."""\nfrom {pkg}.{low} import {helper_name}\n\n\n'
        f"def {detail}(record):\n"
        f'    """\'<{key}>: <value>\' for one {record.lower()}, computed straight from its two counts."""\n'
        f"    return f'{{record.{key}}}: {{{helper_name}(record.{x}, record.{y})}}'\n")
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
        f"from {pkg}.detail import {detail}\n"
        f"from {pkg}.models import {record}\n\n"
        f"__all__ = ['{record}', 'grand_total', 'totals_by_{key}', '{top}', '{report}', '{flagged}', "
        f"'{listing}', '{count}', '{detail}']\n\n\n"
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
    buggy[f"{pkg}/{low}.py"], low_pieces = low_module(False)
    fixed[f"{pkg}/{low}.py"], _ = low_module(True)
    padding, padding_cases, _ = pad_package(buggy, pkg, record.lower(), size, padding_rng, used=set(low_pieces))
    buggy.update(padding)
    fixed.update(padding)

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
    target_records = records(rng.randint(3, 5), rng.randint(1, 2))
    target_args = [target_records] + ([threshold] if target_func == flagged else [])
    cases = [case(f"{target_func}_matches_the_documented_rule", "target", target_func, target_args)]
    for func in (f"totals_by_{key}", "grand_total"):
        cases.append(case(f"{func}_on_mixed_records", "hidden", func, [records(rng.randint(3, 5), rng.randint(1, 2))]))
    # hidden tests that a fix above the helper cannot satisfy: the detail view (another caller of the helper,
    # outside measure and the hops) and the helper itself, both on inputs that trigger the bug
    a, b = draw_input(helper, rng, trigger=True)
    cases.append(case(f"{detail}_of_one_record", "hidden", detail, [f"{record}({rng.choice(domain.keys)!r}, {a}, {b})"]))
    a, b = draw_input(helper, rng, trigger=True)
    cases.append(Case(f"{helper_name}_directly", "hidden", helper_name, [str(a), str(b)],
                      {f"{pkg}.{low}": [helper_name]}))
    for func in (top, report, f"totals_by_{key}", "grand_total", listing, count):
        cases.append(case(f"{func}_on_plain_records", "regression", func, [records(rng.randint(2, 5), 0)]))
    cases.append(case(f"{flagged}_on_plain_records", "regression", flagged, [records(4, 0), threshold]))
    cases.append(case(f"{top}_of_no_records", "regression", top, ["[]"]))
    cases.append(case(f"{count}_skips_records_without_{key}", "regression", count,
                      [f"[{record}('', 1, 2), {record}({domain.keys[0]!r}, 2, 2)]"]))
    a, b = draw_input(helper, rng, trigger=False)
    cases.append(case(f"{detail}_of_a_plain_record", "regression", detail,
                      [f"{record}({rng.choice(domain.keys)!r}, {a}, {b})"]))
    for sibling, name, _, _, _ in sibling_defs[:2]:
        a, b = draw_input(sibling, rng, trigger=False)
        cases.append(Case(f"{name}_formula", "regression", name, [str(a), str(b)], {f"{pkg}.{low}": [name]}))
    if rng.random() < 0.5:  # a direct unit test of the helper on inputs the bug does not touch
        a, b = draw_input(helper, rng, trigger=False)
        cases.append(Case(f"{helper_name}_formula", "regression", helper_name, [str(a), str(b)],
                          {f"{pkg}.{low}": [helper_name]}))
    cases += padding_cases
    totals_case = case("totals", "hidden", f"totals_by_{key}", [target_records])

    def problem(draft: Draft, target: Case, before: Outcome, after: Outcome) -> str:
        """The symptom through the public API only: the call, what it gives, what was expected, and the
        per-group totals on the same input (never a module, an internal function or a field)."""
        (totals_before,), (totals_after,) = evaluate(draft.buggy, [totals_case]), evaluate(draft.fixed, [totals_case])
        got = f"returns {before.value!r}" if before.ok else f"raises {before.value}"
        call_args = ", ".join([domain.items] + target.args[1:])
        sums = "totals_by_" + key
        if totals_before.ok:
            off = sorted(k for k in totals_after.value if totals_before.value.get(k) != totals_after.value[k])
            by_hand = "; ".join(f"{k!r} should come to {totals_after.value[k]!r}, not "
                                f"{totals_before.value.get(k)!r}" for k in off)
            detail_text = f"Worked through by hand on the same input: {by_hand}. The rest agree."
        else:
            detail_text = (f"`{sums}` raises {totals_before.value} on the same input; worked through by hand it "
                           f"should give {totals_after.value!r}.")
        return (f"`{target.func}` gives a wrong answer for some {domain.items}\n\n"
                f"On the {domain.items} below, `{target.func}` {got}; it should be {after.value!r}.\n\n"
                f"```python\nfrom {api} import {record}, {sums}, {target.func}\n\n"
                f"{domain.items} = {target_records}\n"
                f"print({target.func}({call_args}))\n"
                f"print({sums}({domain.items}))\n```\n\n"
                f"{detail_text} Most inputs I tried give correct results, so it seems to depend on the "
                f"particular figures in the {domain.items}.\n")

    return Draft(
        capability=CAPABILITY, seed=seed, package=pkg, buggy=buggy, fixed=fixed, cases=cases,
        test_path=f"tests/test_{pkg}_api.py", hidden_path=f"tests/test_hidden_{pkg}.py",
        entry=(f"{pkg}/api.py", target_func), problem=problem,
        difficulty={"call_depth": depth, "n_decoys": decoys, "n_files": len(buggy) + 1, "helper": helper.key,
                    "size": size, "source_lines": source_lines(buggy)},
        test_docstring=f"Tests of the {pkg} public API.",
    )


def generate(seed: int, call_depth: int | None = None, n_decoys: int | None = None, size: str = DEFAULT_SIZE) -> Scenario:
    """The scenario of `seed` (deterministic); `size` "small" (about 100 lines) or "large" (300-600 lines of
    source: correct helper modules around the bug)."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
    return generate_with_retries(lambda rng: build(rng, seed, call_depth, n_decoys, size), seed)
