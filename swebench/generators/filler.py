"""Correct, realistic code around the bug: the size knob of both generators.

A real repository is mostly code that works. `pad_package` adds seeded modules of everyday helpers
(parsing, formatting, paging, a settings object, an event history, a registry, ...) named after the
package's domain, until the package's source files reach a drawn number of lines (300-600 for "large", the
range the reference asks for; nothing for "small"). `extend_module` appends a few import-free helpers to an
existing module (the one holding the bug, so it is not the only code there). Every piece is correct and its
docstring says what the code does; some pieces give a regression case (a call whose value the generator
computes and the tests pin), so the padding is part of the tested package, not dead text.
"""
from __future__ import annotations

import ast
import random
import textwrap
from dataclasses import dataclass
from typing import Callable

from swebench.generators.common import Case

SIZES = ("small", "large")
LARGE_LINES = (320, 560)  # drawn target for "large"; the package never passes MAX_LINES
MAX_LINES = 600


@dataclass(frozen=True)
class Piece:
    key: str
    imports: tuple[str, ...]  # import lines the piece needs
    source: Callable[[str, str], str]  # (noun, Noun) -> top-level code
    sample: Callable[[str, str, random.Random], tuple[str, list[str], str | None]] | None = None
    # (noun, Noun, rng) -> (function or method, argument sources, receiver source or None)


def _code(text: str) -> str:
    return textwrap.dedent(text).strip("\n") + "\n"


def _words(rng: random.Random) -> list[str]:
    return rng.sample(["North Wing", "east  dock", "Bay 7", "main hall", "Annex B", "old store"], 3)


PIECES: tuple[Piece, ...] = (
    Piece("parse_row", (), lambda n, N: _code(f'''
        def parse_{n}_row(line, sep=","):
            """Fields of one exported {n} line, stripped; an empty field becomes None."""
            fields = [part.strip() for part in line.rstrip("\\n").split(sep)]
            return [field or None for field in fields]
        '''), lambda n, N, rng: (f"parse_{n}_row", [repr(f"{rng.randint(1, 99)}, {n} ,,x{rng.randint(1, 9)}")], None)),
    Piece("format_table", (), lambda n, N: _code('''
        def format_table(rows, headers):
            """Rows as plain text: a header line, a rule, then one line per row; columns padded to fit."""
            table = [[str(cell) for cell in headers]] + [[str(cell) for cell in row] for row in rows]
            widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
            lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in table]
            lines.insert(1, "  ".join("-" * width for width in widths))
            return "\\n".join(lines)
        '''), lambda n, N, rng: ("format_table", [repr([[n, rng.randint(1, 900)], ["other", rng.randint(1, 9)]]),
                                                  repr(["name", "count"])], None)),
    Piece("settings", ("from dataclasses import dataclass",), lambda n, N: _code(f'''
        @dataclass(frozen=True)
        class {N}Settings:
            """Options of the {n} reports, read from a plain dict (unknown keys are refused)."""

            currency: str = "EUR"
            page_size: int = 20
            show_empty: bool = False

            @classmethod
            def from_dict(cls, data):
                unknown = sorted(set(data) - {{"currency", "page_size", "show_empty"}})
                if unknown:
                    raise ValueError(f"unknown settings: {{', '.join(unknown)}}")
                settings = cls(**data)
                if settings.page_size < 1:
                    raise ValueError("page_size must be at least 1")
                return settings

            def as_dict(self):
                return {{"currency": self.currency, "page_size": self.page_size, "show_empty": self.show_empty}}
        '''), lambda n, N, rng: ("as_dict", [], f"{N}Settings.from_dict({{'page_size': {rng.randint(5, 50)}}})")),
    Piece("group_by", (), lambda n, N: _code(f'''
        def group_{n}s(items, key):
            """{{key(item): [the items with that key, in input order]}}."""
            groups = {{}}
            for item in items:
                groups.setdefault(key(item), []).append(item)
            return groups
        '''), lambda n, N, rng: (f"group_{n}s", [repr(rng.sample(range(1, 40), 5)), "lambda item: item % 3"], None)),
    Piece("paginate", (), lambda n, N: _code('''
        def paginate(items, page, per_page):
            """The items on 1-based `page` with `per_page` items a page (an empty list past the end)."""
            if page < 1 or per_page < 1:
                raise ValueError("page and per_page start at 1")
            start = (page - 1) * per_page
            return list(items[start:start + per_page])


        def page_count(total, per_page):
            """How many pages `total` items fill (at least one, for the empty first page)."""
            return max(1, -(-total // per_page))
        '''), lambda n, N, rng: ("paginate", [repr(list(range(rng.randint(5, 12)))), "2", "3"], None)),
    Piece("normalize_label", (), lambda n, N: _code('''
        def normalize_label(text):
            """A free-text label with runs of whitespace collapsed, the ends stripped, lower case."""
            return " ".join(text.split()).lower()
        '''), lambda n, N, rng: ("normalize_label", [repr("  " + _words(rng)[0] + "  ")], None)),
    Piece("moving_average", (), lambda n, N: _code('''
        def moving_average(values, window):
            """Mean of every run of `window` consecutive values, rounded to 3 places ([] for fewer values)."""
            if window < 1:
                raise ValueError("window must be at least 1")
            out = []
            for start in range(len(values) - window + 1):
                chunk = values[start:start + window]
                out.append(round(sum(chunk) / window, 3))
            return out
        '''), lambda n, N, rng: ("moving_average", [repr(rng.sample(range(1, 60), 6)), "3"], None)),
    Piece("clamp", (), lambda n, N: _code('''
        def clamp(value, low, high):
            """`value` held within [low, high]."""
            if low > high:
                raise ValueError("low must not exceed high")
            return max(low, min(value, high))
        '''), lambda n, N, rng: ("clamp", [str(rng.randint(-20, 120)), "0", "100"], None)),
    Piece("history", (), lambda n, N: _code(f'''
        class {N}History:
            """An append-only log of (timestamp, message) pairs in timestamp order."""

            def __init__(self):
                self.entries = []

            def record(self, timestamp, message):
                """Add an entry; one older than the last entry is refused."""
                if self.entries and timestamp < self.entries[-1][0]:
                    raise ValueError("entries must be recorded in timestamp order")
                self.entries.append((timestamp, message))
                return self

            def since(self, timestamp):
                """Messages recorded at or after `timestamp`."""
                return [message for stamp, message in self.entries if stamp >= timestamp]

            def latest(self, count=1):
                """The last `count` messages, oldest first."""
                return [message for _, message in self.entries[-count:]] if count > 0 else []
        '''), lambda n, N, rng: ("since", [str(5)], f"{N}History().record(1, 'opened').record(5, 'checked')"
                                                   f".record({rng.randint(6, 30)}, 'closed')")),
    Piece("percent_text", (), lambda n, N: _code('''
        def percent_text(part, whole, places=1):
            """`part` as a percentage of `whole`, e.g. '12.5%'; '-' when `whole` is zero."""
            if not whole:
                return "-"
            return f"{100 * part / whole:.{places}f}%"
        '''), lambda n, N, rng: ("percent_text", [str(rng.randint(1, 30)), str(rng.randint(31, 90))], None)),
    Piece("chunked", (), lambda n, N: _code('''
        def chunked(items, size):
            """Consecutive lists of `size` items; the last one may be shorter."""
            if size < 1:
                raise ValueError("size must be at least 1")
            return [list(items[i:i + size]) for i in range(0, len(items), size)]
        '''), lambda n, N, rng: ("chunked", [repr(list(range(rng.randint(4, 9)))), "3"], None)),
    Piece("merge_counts", (), lambda n, N: _code('''
        def merge_counts(*counters):
            """Key-wise sums of several {key: count} dicts; keys whose sum is zero are dropped."""
            merged = {}
            for counter in counters:
                for key, count in counter.items():
                    merged[key] = merged.get(key, 0) + count
            return {key: count for key, count in merged.items() if count}
        '''), lambda n, N, rng: ("merge_counts", [repr({"a": rng.randint(1, 5), "b": 2}), repr({"b": -2, "c": 1})],
                                 None)),
    Piece("reference_code", ("import re",), lambda n, N: _code(f'''
        _{n.upper()}_CODE = re.compile(r"[A-Z]{{2,4}}-[0-9]{{3,6}}")


        def is_valid_{n}_code(code):
            """True for reference codes such as 'AB-1234': 2-4 capitals, a dash, 3-6 digits."""
            return bool(_{n.upper()}_CODE.fullmatch(code.strip()))
        '''), lambda n, N, rng: (f"is_valid_{n}_code", [repr(rng.choice(("AB-1234", "ab-1234", "XYZ-12", "QRST-99")))],
                                 None)),
    Piece("csv_line", (), lambda n, N: _code('''
        def to_csv_line(fields, sep=","):
            """One CSV line; a field holding `sep`, a quote or a newline is quoted (quotes doubled)."""
            out = []
            for field in fields:
                text = "" if field is None else str(field)
                if sep in text or '"' in text or "\\n" in text:
                    text = '"' + text.replace('"', '""') + '"'
                out.append(text)
            return sep.join(out)
        '''), lambda n, N, rng: ("to_csv_line", [repr([n, None, f"a,{rng.randint(1, 9)}", 'say "hi"'])], None)),
    Piece("retry_delays", (), lambda n, N: _code('''
        def retry_delays(base, factor, attempts, cap=None):
            """Waits before each retry: base, base * factor, ... (each at most `cap` when given)."""
            delays = []
            delay = base
            for _ in range(attempts):
                delays.append(delay if cap is None else min(delay, cap))
                delay *= factor
            return delays
        '''), lambda n, N, rng: ("retry_delays", [str(rng.randint(1, 3)), "2", str(rng.randint(3, 6)), "20"], None)),
    Piece("histogram", (), lambda n, N: _code('''
        def histogram(values, width):
            """{bucket start: count} for buckets [start, start + width); empty buckets are left out."""
            if width <= 0:
                raise ValueError("width must be positive")
            counts = {}
            for value in values:
                start = (value // width) * width
                counts[start] = counts.get(start, 0) + 1
            return dict(sorted(counts.items()))
        '''), lambda n, N, rng: ("histogram", [repr(rng.sample(range(0, 50), 7)), "10"], None)),
    Piece("unique_in_order", (), lambda n, N: _code('''
        def unique_in_order(items):
            """The items without repeats, each where it first occurs."""
            seen = set()
            out = []
            for item in items:
                if item not in seen:
                    seen.add(item)
                    out.append(item)
            return out
        '''), lambda n, N, rng: ("unique_in_order", [repr([rng.randint(1, 4) for _ in range(8)])], None)),
    Piece("parse_duration", ("import re",), lambda n, N: _code('''
        _DURATION = re.compile(r"(?:([0-9]+)h)?\\s*(?:([0-9]+)m)?")


        def parse_duration(text):
            """Minutes in a duration written like '1h30m', '45m' or '2h'."""
            match = _DURATION.fullmatch(text.strip())
            if not match or not any(match.groups()):
                raise ValueError(f"not a duration: {text!r}")
            hours, minutes = (int(part or 0) for part in match.groups())
            return hours * 60 + minutes
        '''), lambda n, N, rng: ("parse_duration", [repr(f"{rng.randint(1, 5)}h{rng.randint(0, 59)}m")], None)),
    Piece("slugify", ("import re",), lambda n, N: _code('''
        def slugify(text):
            """Lower-case runs of letters and digits joined by '-': 'North Wing 2' gives 'north-wing-2'."""
            return "-".join(re.findall(r"[a-z0-9]+", text.lower()))
        '''), lambda n, N, rng: ("slugify", [repr(_words(rng)[1])], None)),
    Piece("registry", (), lambda n, N: _code(f'''
        class {N}Registry:
            """Named entries, each registered once; names are matched without regard to case."""

            def __init__(self):
                self._entries = {{}}

            def register(self, name, item):
                key = name.casefold()
                if key in self._entries:
                    raise KeyError(f"{{name!r}} is already registered")
                self._entries[key] = item
                return item

            def find(self, name, default=None):
                return self._entries.get(name.casefold(), default)

            def names(self):
                """The registered names, case-folded and sorted."""
                return sorted(self._entries)

            def __len__(self):
                return len(self._entries)
        ''')),
    Piece("weighted_mean", (), lambda n, N: _code('''
        def weighted_mean(pairs):
            """Mean of (value, weight) pairs weighted by weight, to 4 places; None when the weights sum to 0."""
            total_weight = sum(weight for _, weight in pairs)
            if not total_weight:
                return None
            return round(sum(value * weight for value, weight in pairs) / total_weight, 4)
        '''), lambda n, N, rng: ("weighted_mean", [repr([(rng.randint(1, 20), rng.randint(1, 4)) for _ in range(3)])],
                                 None)),
    Piece("iso_day", (), lambda n, N: _code('''
        def parse_iso_day(text):
            """(year, month, day) of an ISO date such as '2024-03-01' (the day is checked against 1..31 only)."""
            parts = text.strip().split("-")
            if len(parts) != 3 or not all(part.isdigit() for part in parts):
                raise ValueError(f"not an ISO date: {text!r}")
            year, month, day = (int(part) for part in parts)
            if not 1 <= month <= 12 or not 1 <= day <= 31:
                raise ValueError(f"not an ISO date: {text!r}")
            return year, month, day
        '''), lambda n, N, rng: ("parse_iso_day", [repr(f"20{rng.randint(10, 29)}-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}")],
                                 None)),
    Piece("top_n", (), lambda n, N: _code('''
        def top_n(scores, n):
            """The `n` names with the highest scores, highest first (ties in alphabetical order)."""
            return [name for name, _ in sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:n]]
        '''), lambda n, N, rng: ("top_n", [repr({"ash": rng.randint(1, 9), "elm": 5, "oak": 5, "fir": 1}), "2"], None)),
    Piece("parse_amount", (), lambda n, N: _code('''
        def parse_amount(text):
            """Cents in an amount such as '12.50', '-3' or '1,204.07' (thousands separators allowed)."""
            cleaned = text.strip().replace(",", "")
            negative = cleaned.startswith("-")
            whole, _, frac = cleaned.lstrip("-").partition(".")
            if not whole.isdigit() or (frac and (not frac.isdigit() or len(frac) > 2)):
                raise ValueError(f"not an amount: {text!r}")
            cents = int(whole) * 100 + int(frac.ljust(2, "0"))
            return -cents if negative else cents
        '''), lambda n, N, rng: ("parse_amount", [repr(rng.choice(("1,204.07", "-3", "12.5", "0.99")))], None)),
    Piece("lru_cache", ("from collections import OrderedDict",), lambda n, N: _code(f'''
        class {N}Cache:
            """A least-recently-used cache of at most `capacity` entries."""

            def __init__(self, capacity):
                if capacity < 1:
                    raise ValueError("capacity must be at least 1")
                self.capacity = capacity
                self._data = OrderedDict()
                self.hits = 0
                self.misses = 0

            def lookup(self, key, default=None):
                """The cached value (and mark it as recently used), or `default`."""
                if key in self._data:
                    self._data.move_to_end(key)
                    self.hits += 1
                    return self._data[key]
                self.misses += 1
                return default

            def put(self, key, value):
                """Store a value; the least recently used entry goes when the cache is full."""
                self._data[key] = value
                self._data.move_to_end(key)
                while len(self._data) > self.capacity:
                    self._data.popitem(last=False)
                return self

            def keys(self):
                """Cached keys, least recently used first."""
                return list(self._data)
        '''), lambda n, N, rng: ("keys", [], f"{N}Cache(2).put('a', 1).put('b', 2).put('c', {rng.randint(3, 9)})")),
    Piece("query", (), lambda n, N: _code(f'''
        _OPERATORS = {{
            "eq": lambda lhs, rhs: lhs == rhs,
            "ne": lambda lhs, rhs: lhs != rhs,
            "lt": lambda lhs, rhs: lhs < rhs,
            "le": lambda lhs, rhs: lhs <= rhs,
            "gt": lambda lhs, rhs: lhs > rhs,
            "ge": lambda lhs, rhs: lhs >= rhs,
        }}


        class {N}Query:
            """Filters over {n} rows given as dicts; every condition must hold (missing fields never match)."""

            def __init__(self):
                self.conditions = []

            def filter_by(self, field, operator, value):
                if operator not in _OPERATORS:
                    raise ValueError(f"unknown operator {{operator!r}}; use one of {{', '.join(_OPERATORS)}}")
                self.conditions.append((field, operator, value))
                return self

            def matches(self, row):
                return all(field in row and _OPERATORS[operator](row[field], value)
                           for field, operator, value in self.conditions)

            def run(self, rows):
                """The matching rows, in input order."""
                return [row for row in rows if self.matches(row)]
        '''), lambda n, N, rng: ("run", [repr([{"size": v} for v in rng.sample(range(1, 30), 5)] + [{}])],
                                 f"{N}Query().filter_by('size', 'ge', 10).filter_by('size', 'lt', 20)")),
    Piece("unit_converter", (), lambda n, N: _code('''
        _FACTORS = {"g": 1, "kg": 1000, "t": 1_000_000, "ml": 1, "l": 1000}
        _KINDS = {"g": "mass", "kg": "mass", "t": "mass", "ml": "volume", "l": "volume"}


        def convert(amount, source, target):
            """`amount` in unit `source` expressed in unit `target` (mass: g, kg, t; volume: ml, l)."""
            for unit_name in (source, target):
                if unit_name not in _FACTORS:
                    raise ValueError(f"unknown unit {unit_name!r}")
            if _KINDS[source] != _KINDS[target]:
                raise ValueError(f"cannot convert {source} to {target}")
            return amount * _FACTORS[source] / _FACTORS[target]
        '''), lambda n, N, rng: ("convert", [str(rng.randint(1, 9) * 250), "'g'", "'kg'"], None)),
    Piece("summarize", (), lambda n, N: _code('''
        def summarize(values):
            """Count, minimum, maximum and mean (3 places) of a list of numbers; only the count when empty."""
            if not values:
                return {"count": 0}
            return {"count": len(values), "min": min(values), "max": max(values),
                    "mean": round(sum(values) / len(values), 3)}
        '''), lambda n, N, rng: ("summarize", [repr(rng.sample(range(1, 99), 5))], None)),
    Piece("diff_dicts", (), lambda n, N: _code('''
        def diff_dicts(old, new):
            """What changed between two dicts: added and removed keys (sorted), and changed keys with
            their (old, new) values."""
            added = sorted(set(new) - set(old))
            removed = sorted(set(old) - set(new))
            changed = {key: (old[key], new[key]) for key in sorted(set(old) & set(new)) if old[key] != new[key]}
            return {"added": added, "removed": removed, "changed": changed}
        '''), lambda n, N, rng: ("diff_dicts", [repr({"a": 1, "b": 2, "c": 3}), repr({"b": 2, "c": rng.randint(4, 9),
                                                                                        "d": 0})], None)),
    Piece("inventory", (), lambda n, N: _code(f'''
        class {N}Stock:
            """Quantities on hand per item code; stock never goes below zero."""

            def __init__(self, reorder_level=0):
                self.reorder_level = reorder_level
                self.on_hand_by_code = {{}}

            def receive(self, code, quantity):
                if quantity <= 0:
                    raise ValueError("a delivery must hold at least one unit")
                self.on_hand_by_code[code] = self.on_hand_by_code.get(code, 0) + quantity
                return self

            def issue(self, code, quantity):
                """Take `quantity` units out; refused (ValueError) when fewer are on hand."""
                on_hand = self.on_hand_by_code.get(code, 0)
                if quantity > on_hand:
                    raise ValueError(f"only {{on_hand}} of {{code}} on hand")
                self.on_hand_by_code[code] = on_hand - quantity
                return self

            def to_reorder(self):
                """Codes at or below the reorder level, sorted."""
                return sorted(code for code, quantity in self.on_hand_by_code.items() if quantity <= self.reorder_level)
        '''), lambda n, N, rng: ("to_reorder", [], f"{N}Stock(3).receive('A1', 5).receive('B2', {rng.randint(1, 3)})"
                                                     ".receive('C3', 9).issue('A1', 2)")),
    Piece("key_values", (), lambda n, N: _code('''
        def parse_key_values(text, sep=";"):
            """{key: value} from text such as 'a=1; b=two'; values stay strings, a repeated key is refused."""
            out = {}
            for part in text.split(sep):
                if not part.strip():
                    continue
                key, eq, value = part.partition("=")
                if not eq or not key.strip():
                    raise ValueError(f"not a key=value pair: {part.strip()!r}")
                if key.strip() in out:
                    raise ValueError(f"repeated key {key.strip()!r}")
                out[key.strip()] = value.strip()
            return out
        '''), lambda n, N, rng: ("parse_key_values", [repr(f"mode=fast; retries={rng.randint(1, 5)};")], None)),
    Piece("merge_ranges", (), lambda n, N: _code('''
        def merge_ranges(ranges):
            """Overlapping or touching (start, end) ranges merged into one, sorted by start."""
            merged = []
            for start, end in sorted(ranges):
                if merged and start <= merged[-1][1]:
                    merged[-1] = (merged[-1][0], max(merged[-1][1], end))
                else:
                    merged.append((start, end))
            return merged
        '''), lambda n, N, rng: ("merge_ranges", [repr([(1, 3), (rng.randint(2, 5), 7), (9, 12), (12, 14)])], None)),
    Piece("ordinal", (), lambda n, N: _code('''
        def ordinal(position):
            """'1st', '2nd', '3rd', '4th', ..., '11th', '12th', '13th', '21st', ..."""
            if 10 <= position % 100 <= 20:
                suffix = "th"
            else:
                suffix = {1: "st", 2: "nd", 3: "rd"}.get(position % 10, "th")
            return f"{position}{suffix}"
        '''), lambda n, N, rng: ("ordinal", [str(rng.choice((1, 2, 3, 11, 12, 22, 101, 113)))], None)),
    Piece("wrap_text", (), lambda n, N: _code('''
        def wrap_words(text, width):
            """Lines of at most `width` characters, broken between words (a longer word gets its own line)."""
            lines, current = [], ""
            for word in text.split():
                if current and len(current) + 1 + len(word) > width:
                    lines.append(current)
                    current = word
                else:
                    current = f"{current} {word}" if current else word
            if current:
                lines.append(current)
            return lines
        '''), lambda n, N, rng: ("wrap_words", [repr("the quick brown fox jumps over the lazy dog"),
                                               str(rng.randint(8, 15))], None)),
)

# module -> (docstring, piece keys): a module holds only pieces its docstring describes
MODULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "parsing": ("Reading {n} data from exported text.",
                ("parse_row", "key_values", "parse_duration", "iso_day", "parse_amount")),
    "formatting": ("Text output of {n} data.",
                   ("format_table", "percent_text", "csv_line", "ordinal", "wrap_text", "normalize_label", "slugify")),
    "listing": ("Helpers for lists and dicts of {n} data.",
                ("group_by", "paginate", "chunked", "unique_in_order", "merge_counts", "top_n", "merge_ranges",
                 "diff_dicts")),
    "numeric": ("Small numeric helpers.",
                ("clamp", "moving_average", "histogram", "weighted_mean", "summarize", "retry_delays")),
    "validation": ("Checks on {n} data.", ("reference_code",)),
    "conversions": ("Unit conversions.", ("unit_converter",)),
    "settings": ("Report settings.", ("settings",)),
    "history": ("What happened to a {n}, in order.", ("history",)),
    "registry": ("Lookup of named {n} sources.", ("registry",)),
    "caching": ("Caches in front of slow {n} lookups.", ("lru_cache",)),
    "queries": ("Filtering {n} rows.", ("query",)),
    "stock": ("Stock kept for {n} work.", ("inventory",)),
}
CORE_MODULES = ("numeric", "listing")  # pieces that may join an existing module (import-free, generic)
PIECES_BY_KEY = {piece.key: piece for piece in PIECES}


def _defined(source: str) -> set[str]:
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def source_lines(files: dict[str, str], tests: set[str] | frozenset[str] = frozenset()) -> int:
    """Lines of the package's Python source files (test files left out)."""
    return sum(len(text.splitlines()) for path, text in files.items() if path.endswith(".py") and path not in tests)


def _module_text(doc: str, pieces: list[Piece], noun: str, cap: str) -> str:
    imports = sorted({line for piece in pieces for line in piece.imports})
    head = f'"""{doc}"""\n' + ("\n".join(imports) + "\n" if imports else "")
    return head + "\n\n" + "\n\n".join(piece.source(noun, cap) for piece in pieces)


def _case(piece: Piece, module: str, noun: str, cap: str, rng: random.Random, index: int) -> Case | None:
    if piece.sample is None:
        return None
    func, args, receiver = piece.sample(noun, cap, rng)
    imported = receiver.split("(")[0].split(".")[0] if receiver else func
    return Case(f"{module.rsplit('.', 1)[-1]}_{func}_{index}", "regression", func, args, {module: [imported]},
                receiver)


def extend_module(source: str, rng: random.Random, noun: str, count: int) -> tuple[str, list[str]]:
    """`source` with `count` import-free generic helpers (numeric, list helpers) appended (names that clash
    with its own are skipped); returns (new source, keys of the pieces added)."""
    cap = noun[:1].upper() + noun[1:]
    taken = _defined(source)
    options = [PIECES_BY_KEY[key] for module in CORE_MODULES for key in MODULES[module][1]
               if not PIECES_BY_KEY[key].imports]
    rng.shuffle(options)
    added, parts = [], []
    for piece in options:
        if len(added) >= count:
            break
        text = piece.source(noun, cap)
        if _defined(text) & taken:
            continue
        taken |= _defined(text)
        parts.append(text)
        added.append(piece.key)
    if not parts:
        return source, []
    return source.rstrip("\n") + "\n\n\n" + "\n\n".join(parts), added


def pad_package(files: dict[str, str], pkg: str, noun: str, size: str, rng: random.Random,
                used: set[str] | None = None, n_cases: int = 2) -> tuple[dict[str, str], list[Case], int]:
    """New modules for `files` (the package's source files, buggy version) so that the package reaches the
    size's line count; returns ({path: text} of the new modules, regression cases over them, target lines).
    `used`: piece keys already in the package (not repeated)."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
    if size == "small":
        return {}, [], 0
    target = rng.randint(*LARGE_LINES)
    cap = noun[:1].upper() + noun[1:]
    taken_modules = {path.rsplit("/", 1)[-1][:-3] for path in files}
    modules = [m for m in MODULES if m not in taken_modules]
    rng.shuffle(modules)
    lines = source_lines(files)
    new: dict[str, str] = {}
    cases: list[Case] = []
    for name in modules:
        if lines >= target:
            break
        doc, keys = MODULES[name]
        pieces = [PIECES_BY_KEY[k] for k in keys if k not in (used or set())]
        rng.shuffle(pieces)
        chosen: list[Piece] = []
        for candidate in pieces[:rng.randint(2, 5)]:
            text = _module_text(doc.format(n=noun), chosen + [candidate], noun, cap)
            if lines + len(text.splitlines()) <= MAX_LINES:
                chosen.append(candidate)
        if not chosen:
            continue
        text = _module_text(doc.format(n=noun), chosen, noun, cap)
        new[f"{pkg}/{name}.py"] = text
        lines += len(text.splitlines())
        for piece in chosen:
            if len(cases) < n_cases:
                case = _case(piece, f"{pkg}.{name}", noun, cap, rng, len(cases))
                if case is not None:
                    cases.append(case)
    return new, cases, target
