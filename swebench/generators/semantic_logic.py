"""Generator for `semantic_logic_precision`: one precise edit in logic that looks almost right.

Each template is a small package whose core module has one subtle logic bug (an inclusive bound that must
be exclusive, an operator-precedence slip, a missing reset, the wrong base for a percentage, `str.rstrip`
taking a suffix for a set of characters, `reverse=True` reversing a tie-break with the main order, ...) next
to look-alike code that is correct. The issue is a user's report through the public API: the failing call,
what it returns, what it should return and the expected behaviour in the user's words; it never names the
module, the buggy function or an internal name (tests/test_swebench_scenario_quality.py checks this).
Docstrings say what the code is for and hold for the shipped (buggy) code: the rule the fix restores is in
the issue and in the correct look-alike code, not in a docstring that contradicts the body. Hidden tests
exercise the same rule on other inputs, so a patch that special-cases the example fails; regression tests
pin the neighbouring boundaries and branches, so an over-broad edit fails too.

Difficulty (metadata.difficulty): template, n_look_alikes (correct code with the same shape as the bug),
size ("small": the template alone, 25-50 lines; "large", the default: 300-600 lines of source, with correct
helpers appended to the core module and everyday modules around it, swebench/generators/filler.py),
n_files, source_lines.
"""
from __future__ import annotations

import random
import textwrap
from dataclasses import dataclass
from typing import Callable

from swebench.generators.common import Case, Draft, Outcome, generate_with_retries
from swebench.generators.filler import SIZES, extend_module, pad_package, source_lines
from swebench.scenario import Scenario

CAPABILITY = "semantic_logic_precision"
DEFAULT_SIZE = "large"
BUG = "@@BUG@@"


def _code(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def _versions(template: str, buggy: str, fixed: str) -> tuple[str, str]:
    """The template rendered with the buggy and with the fixed text (an empty text drops the line)."""
    out = []
    for replacement in (buggy, fixed):
        lines = []
        for line in template.splitlines(keepends=True):
            if BUG in line:
                if not replacement:
                    continue
                line = line.replace(BUG, replacement)
            lines.append(line)
        out.append("".join(lines))
    return out[0], out[1]


@dataclass
class Template:
    key: str
    build: Callable[[random.Random, int], Draft]
    noun: str  # what the package handles, for the names of the padding code


def _pad(draft: Draft, size: str, noun: str) -> Draft:
    """The draft with the size's padding: import-free helpers appended to the core module (around the bug) and
    correct modules of everyday helpers, up to the size's line count (swebench/generators/filler.py),
    with two regression cases over them."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
    core = draft.entry[0]
    if size == "large":
        draft.buggy[core], added = extend_module(draft.buggy[core], random.Random(f"{draft.seed}:core"), noun, 3)
        draft.fixed[core], _ = extend_module(draft.fixed[core], random.Random(f"{draft.seed}:core"), noun, 3)
        padding, cases, _ = pad_package(draft.buggy, draft.package, noun, size, random.Random(f"{draft.seed}:padding"),
                                        used=set(added))
        draft.buggy.update(padding)
        draft.fixed.update(padding)
        draft.cases += cases
    draft.difficulty.update(size=size, n_files=len(draft.buggy) + 2, source_lines=source_lines(draft.buggy))
    return draft


def _problem(rule: str, module: str, names: list[str]) -> Callable[[Draft, Case, Outcome, Outcome], str]:
    def problem(draft: Draft, target: Case, before: Outcome, after: Outcome) -> str:
        got = f"returns {before.value!r}" if before.ok else f"raises {before.value}"
        return (f"Wrong result from `{target.func}`\n\n"
                f"```python\nfrom {module} import {', '.join(names)}\n\n{target.call}\n```\n\n"
                f"This {got}, but it should return {after.value!r}.\n\n{rule}\n")
    return problem


def _draft(seed: int, pkg: str, core: str, buggy_core: str, fixed_core: str, support: dict[str, str],
           cases: list[Case], entry: str, rule: str, names: list[str], look_alikes: int, key: str) -> Draft:
    exported = ", ".join(sorted(names))
    init = (f'"""{pkg}: {key.replace("_", " ")} rules."""\nfrom {pkg}.{core} import {exported}\n\n'
            f"__all__ = {sorted(names)!r}\n")
    files = {f"{pkg}/__init__.py": init, **support}
    buggy = {**files, f"{pkg}/{core}.py": buggy_core}
    fixed = {**files, f"{pkg}/{core}.py": fixed_core}
    return Draft(capability=CAPABILITY, seed=seed, package=pkg, buggy=buggy, fixed=fixed, cases=cases,
                 test_path=f"tests/test_{core}.py", hidden_path=f"tests/test_hidden_{core}.py",
                 entry=(f"{pkg}/{core}.py", entry), problem=_problem(rule, pkg, names),
                 difficulty={"template": key, "n_look_alikes": look_alikes, "n_files": len(buggy) + 1},
                 test_docstring=f"Tests of {pkg}.{core}.")


MONEY = _code('''
    """Formatting of amounts kept in cents."""


    def cents_to_text(cents):
        """'12.05' for 1205 cents; negative amounts get a leading '-'."""
        sign = "-" if cents < 0 else ""
        cents = abs(cents)
        return f"{sign}{cents // 100}.{cents % 100:02d}"
    ''')


# --------------------------------------------------------------------------------------------------
# Templates
# --------------------------------------------------------------------------------------------------
def tiered_tariff(rng: random.Random, seed: int) -> Draft:
    pkg, cls, unit = rng.choice((("parkinglot", "ParkingTariff", "hours"), ("waterworks", "WaterTariff", "volume"),
                                 ("courier", "WeightTariff", "kilos"), ("cowork", "DeskTariff", "days")))
    template = _code(f'''
        """Tiered tariffs: each unit is charged at the rate of the tier the quantity falls in."""
        from {pkg}.money import cents_to_text


        class {cls}:
            """Rates in cents per unit for quantities split at increasing breaks (one rate more than breaks)."""

            def __init__(self, breaks, rates):
                if len(rates) != len(breaks) + 1:
                    raise ValueError("need exactly one rate more than breaks")
                if list(breaks) != sorted(breaks):
                    raise ValueError("breaks must be increasing")
                self.breaks = tuple(breaks)
                self.rates = tuple(rates)

            def tier_of(self, {unit}):
                """0-based index of the tier that holds `{unit}`."""
                for index, limit in enumerate(self.breaks):
                    if {unit} {BUG} limit:
                        return index
                return len(self.breaks)

            def rate_for(self, {unit}):
                return self.rates[self.tier_of({unit})]

            def price(self, {unit}):
                """Price in cents: every unit at the rate of the quantity's tier."""
                return {unit} * self.rate_for({unit})

            def price_text(self, {unit}):
                return cents_to_text(self.price({unit}))

            def in_top_tier(self, {unit}):
                return {unit} >= self.breaks[-1]

            def in_first_tier(self, {unit}):
                return {unit} < self.breaks[0]
        ''')
    buggy, fixed = _versions(template, "<=", "<")
    b1 = rng.randint(3, 12)
    b2 = b1 + rng.randint(5, 20)
    r0 = rng.randint(300, 900)
    rates = (r0, r0 - rng.randint(20, 100), r0 - rng.randint(120, 250))
    table = f"{cls}(({b1}, {b2}), {rates})"
    c1 = b1 + rng.randint(2, 6)
    c2 = c1 + rng.randint(4, 10)
    other = f"{cls}(({c1}, {c2}), {(rates[0] + 50, rates[1] + 40, rates[2] + 30)})"
    imp = {f"{pkg}.tariffs": [cls]}
    cases = [
        Case("price_at_the_first_break", "target", "price", [str(b1)], imp, table),
        Case("rate_at_the_second_break", "hidden", "rate_for", [str(c2)], imp, other),
        Case("price_text_at_a_break", "hidden", "price_text", [str(c1)], imp, other),
        Case("price_below_the_first_break", "regression", "price", [str(b1 - 1)], imp, table),
        Case("price_between_breaks", "regression", "price", [str(rng.randint(b1 + 1, b2 - 1))], imp, table),
        Case("price_above_the_second_break", "regression", "price", [str(b2 + rng.randint(1, 9))], imp, table),
        Case("top_tier_starts_at_the_second_break", "regression", "in_top_tier", [str(b2)], imp, table),
        Case("first_tier_ends_before_the_first_break", "regression", "in_first_tier", [str(b1)], imp, table),
        Case("tier_of_zero", "regression", "tier_of", ["0"], imp, table),
        Case("price_text_between_breaks", "regression", "price_text", [str(b1 + 1)], imp, table),
    ]
    rule = (f"{b1} is the first break, and from the break on each one should cost {rates[1]}, so I expect "
            f"{b1} * {rates[1]} = {b1 * rates[1]}. Quantities just above the break are charged that way already.")
    return _draft(seed, pkg, "tariffs", buggy, fixed, {f"{pkg}/money.py": MONEY}, cases, "price", rule, [cls], 2,
                  "tiered_tariff")


def half_open_bookings(rng: random.Random, seed: int) -> Draft:
    pkg, cls, what = rng.choice((("roomboard", "RoomBoard", "room"), ("berthplan", "BerthPlan", "berth"),
                                 ("kilnsched", "KilnSchedule", "kiln"), ("studiobook", "StudioDiary", "studio")))
    template = _code(f'''
        """Bookings of one {what}: (start, end, who), times in hours."""


        def _overlaps(existing, start, end):
            """Whether the existing entry collides with the slot from start to end."""
            return existing[0] < end and start {BUG} existing[1]


        class {cls}:
            """The bookings of one {what}; `book` turns down a booking that collides with another."""

            def __init__(self):
                self.bookings = []

            @classmethod
            def from_list(cls, bookings):
                board = cls()
                for start, end, who in bookings:
                    if not board.book(start, end, who):
                        raise ValueError(f"overlapping booking {{who}}")
                return board

            def conflicts(self, start, end):
                """Names on the bookings that [start, end) would overlap."""
                return [b[2] for b in self.bookings if _overlaps(b, start, end)]

            def book(self, start, end, who):
                """Add a booking; False (and nothing added) when it would overlap another."""
                if end <= start:
                    raise ValueError("a booking must end after it starts")
                if self.conflicts(start, end):
                    return False
                self.bookings.append((start, end, who))
                return True

            def free_at(self, moment):
                return not any(start <= moment < end for start, end, _ in self.bookings)

            def busy_hours(self):
                return sum(end - start for start, end, _ in self.bookings)
        ''')
    buggy, fixed = _versions(template, "<=", "<")
    s1 = rng.randint(6, 10)
    e1 = s1 + rng.randint(1, 3)
    s2 = e1 + rng.randint(2, 4)
    e2 = s2 + rng.randint(1, 3)
    board = f"{cls}.from_list([({s1}, {e1}, 'ana'), ({s2}, {e2}, 'ben')])"
    imp = {f"{pkg}.bookings": [cls]}
    cases = [
        Case("booking_right_after_another", "target", "book", [str(e1), str(e1 + 1), "'cy'"], imp, board),
        Case("conflicts_of_a_slot_starting_at_an_end", "hidden", "conflicts", [str(e2), str(e2 + 2)], imp, board),
        Case("booking_that_ends_where_the_next_starts", "regression", "book", [str(s2 - 1), str(s2), "'dan'"], imp,
             board),
        Case("booking_inside_another", "regression", "book", [str(s1), str(e1), "'eve'"], imp, board),
        Case("conflicts_of_an_overlapping_slot", "regression", "conflicts", [str(s1 - 1), str(s2 + 1)], imp, board),
        Case("free_at_the_end_of_a_booking", "regression", "free_at", [str(e1)], imp, board),
        Case("free_at_the_start_of_a_booking", "regression", "free_at", [str(s2)], imp, board),
        Case("busy_hours", "regression", "busy_hours", [], imp, board),
    ]
    rule = (f"The earlier booking is over at {e1}, so the {what} is free from {e1} on: a booking that starts "
            "exactly when another one ends should be accepted.")
    return _draft(seed, pkg, "bookings", buggy, fixed, {}, cases, "book", rule, [cls], 1, "half_open_bookings")


def leap_years(rng: random.Random, seed: int) -> Draft:
    pkg = rng.choice(("almanac", "payrollcal", "ephemeris", "duedates"))
    template = _code(f'''
        """Gregorian calendar arithmetic."""

        DAYS_IN_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


        def is_leap(year):
            """Whether `year` has a 29th of February."""
            return {BUG}


        def days_in_month(year, month):
            if not 1 <= month <= 12:
                raise ValueError(f"no month {{month}}")
            if month == 2 and is_leap(year):
                return 29
            return DAYS_IN_MONTH[month - 1]


        def day_of_year(year, month, day):
            """1 for January 1st."""
            if not 1 <= day <= days_in_month(year, month):
                raise ValueError(f"no day {{day}} in {{year}}-{{month:02d}}")
            return sum(days_in_month(year, m) for m in range(1, month)) + day


        def days_in_year(year):
            return 366 if is_leap(year) else 365


        def is_century(year):
            return year % 100 == 0
        ''')
    buggy, fixed = _versions(template, "year % 4 == 0 and year % 100 != 0",
                             "year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)")
    quad = rng.choice((1600, 2000, 2400))
    other_quad = rng.choice([y for y in (1200, 1600, 2000, 2400, 2800) if y != quad])
    century = rng.choice((1700, 1800, 1900, 2100))
    leap = rng.choice((1996, 2004, 2012, 2024, 2028))
    plain = rng.choice((1999, 2019, 2023, 2025))
    imp = {f"{pkg}.calendar": ["days_in_month", "day_of_year", "days_in_year", "is_century"]}
    cases = [
        Case("february_of_a_fourth_century", "target", "days_in_month", [str(quad), "2"], imp),
        Case("day_of_year_at_the_end_of_a_fourth_century", "hidden", "day_of_year", [str(other_quad), "12", "31"], imp),
        Case("length_of_a_fourth_century_year", "hidden", "days_in_year", [str(quad + 400)], imp),
        Case("february_of_a_plain_century", "regression", "days_in_month", [str(century), "2"], imp),
        Case("february_of_a_leap_year", "regression", "days_in_month", [str(leap), "2"], imp),
        Case("february_of_a_common_year", "regression", "days_in_month", [str(plain), "2"], imp),
        Case("day_of_year_in_march_of_a_leap_year", "regression", "day_of_year", [str(leap), "3", "1"], imp),
        Case("length_of_a_plain_century_year", "regression", "days_in_year", [str(century)], imp),
        Case("april_has_thirty_days", "regression", "days_in_month", [str(plain), "4"], imp),
        Case("centuries", "regression", "is_century", [str(century)], imp),
    ]
    rule = f"{quad} was a leap year, so February {quad} has 29 days."
    return _draft(seed, pkg, "calendar", buggy, fixed, {}, cases, "days_in_month", rule, ["days_in_month"], 1,
                  "leap_years")


def precedence_eligibility(rng: random.Random, seed: int) -> Draft:
    pkg, cls = rng.choice((("loyaltyclub", "LoyaltyPolicy"), ("gymfees", "MembershipPolicy"),
                           ("bookclub", "DiscountPolicy"), ("ferrypass", "FarePolicy")))
    min_years = rng.randint(2, 5)
    template = _code(f'''
        """Who gets the loyalty discount, and how much it is."""
        from {pkg}.money import cents_to_text

        MIN_YEARS = {min_years}


        class {cls}:
            """A percentage off for members, depending on their years of membership and on whether they
            were referred."""

            def __init__(self, percent):
                if not 0 <= percent <= 100:
                    raise ValueError("percent must be within 0..100")
                self.percent = percent

            def eligible(self, member, years, referred):
                return {BUG}

            def discount(self, amount, member, years, referred):
                """Discount in cents on `amount` cents (rounded down)."""
                if not self.eligible(member, years, referred):
                    return 0
                return amount * self.percent // 100

            def charge(self, amount, member, years, referred):
                return amount - self.discount(amount, member, years, referred)

            def charge_text(self, amount, member, years, referred):
                return cents_to_text(self.charge(amount, member, years, referred))

            def is_veteran(self, member, years):
                return member and years >= 2 * MIN_YEARS
        ''')
    buggy, fixed = _versions(template, "member and years >= MIN_YEARS or referred",
                             "member and (years >= MIN_YEARS or referred)")
    percent = rng.choice((5, 10, 15, 20))
    policy = f"{cls}({percent})"
    amount = rng.randint(20, 400) * 10
    imp = {f"{pkg}.discounts": [cls]}
    young = rng.randint(0, min_years - 1)
    cases = [
        Case("referred_non_member_pays_full_price", "target", "charge", [str(amount), "False", str(young), "True"],
             imp, policy),
        Case("referred_non_member_gets_no_discount", "hidden", "discount",
             [str(amount + 70), "False", str(min_years + 1), "True"], imp, policy),
        Case("long_standing_member", "regression", "charge", [str(amount), "True", str(min_years), "False"], imp,
             policy),
        Case("referred_new_member", "regression", "charge", [str(amount), "True", str(young), "True"], imp, policy),
        Case("new_member_without_referral", "regression", "charge", [str(amount), "True", str(young), "False"], imp,
             policy),
        Case("non_member", "regression", "discount", [str(amount), "False", str(min_years + 3), "False"], imp, policy),
        Case("charge_text_of_a_member", "regression", "charge_text", [str(amount + 5), "True", str(min_years), "True"],
             imp, policy),
        Case("veteran_member", "regression", "is_veteran", ["True", str(2 * min_years)], imp, policy),
    ]
    rule = (f"Someone who is not a member should pay the full amount ({amount}), referred or not; only members "
            "are given the reduction.")
    return _draft(seed, pkg, "discounts", buggy, fixed, {f"{pkg}/money.py": MONEY}, cases, "charge", rule, [cls], 1,
                  "precedence_eligibility")


def sliding_window(rng: random.Random, seed: int) -> Draft:
    pkg, cls = rng.choice((("apigate", "RateLimiter"), ("doorbell", "RingThrottle"), ("smsrelay", "SendBudget"),
                           ("loginguard", "AttemptWindow")))
    template = _code(f'''
        """A sliding-window limit on events (timestamps in seconds)."""


        class {cls}:
            """At most `limit` events in any `window` seconds."""

            def __init__(self, limit, window):
                if limit < 1 or window <= 0:
                    raise ValueError("limit must be >= 1 and window > 0")
                self.limit = limit
                self.window = window

            def recent(self, timestamps, now):
                return [t for t in timestamps if now - self.window {BUG} t <= now]

            def allows(self, timestamps, now):
                return len(self.recent(timestamps, now)) < self.limit

            def remaining(self, timestamps, now):
                return max(0, self.limit - len(self.recent(timestamps, now)))

            def expired(self, timestamps, now):
                return [t for t in timestamps if t <= now - self.window]
        ''')
    buggy, fixed = _versions(template, "<=", "<")
    window = rng.choice((10, 30, 60, 120))
    limit = rng.randint(2, 4)
    limiter = f"{cls}({limit}, {window})"
    now = rng.randint(500, 900)
    inside = sorted(rng.sample(range(now - window + 1, now), limit - 1))
    edge = now - window
    imp = {f"{pkg}.limits": [cls]}
    cases = [
        Case("event_exactly_one_window_old_has_left", "target", "allows", [str(inside + [edge]), str(now)], imp,
             limiter),
        Case("remaining_after_an_event_one_window_old", "hidden", "remaining", [str([edge, now - 1]), str(now)], imp,
             limiter),
        Case("recent_events", "regression", "recent", [str([edge - 5] + inside), str(now)], imp, limiter),
        Case("full_window_refuses", "regression", "allows", [str(inside + [now]), str(now)], imp, limiter),
        Case("future_events_do_not_count", "regression", "remaining", [str([now + 1] + inside), str(now)], imp,
             limiter),
        Case("expired_includes_the_boundary", "regression", "expired", [str([edge, edge + 1, now]), str(now)], imp,
             limiter),
        Case("empty_history_allows", "regression", "allows", ["[]", str(now)], imp, limiter),
    ]
    rule = (f"An event from exactly {window} seconds before `now` should have left the window, so with only "
            f"{limit - 1} event{'s' if limit > 2 else ''} inside it another one should be allowed.")
    return _draft(seed, pkg, "limits", buggy, fixed, {}, cases, "allows", rule, [cls], 2, "sliding_window")


def discount_then_tax(rng: random.Random, seed: int) -> Draft:
    pkg, cls = rng.choice((("tillroll", "Invoice"), ("quotekit", "Quote"), ("canteen", "Receipt"),
                           ("hardwarepos", "Bill")))
    template = _code(f'''
        """Invoice lines in cents, each with a discount and a tax percentage."""
        from {pkg}.money import cents_to_text


        def line_total(price, quantity, discount_percent, tax_percent):
            """Total of one line in cents (each step rounded down)."""
            subtotal = price * quantity
            discounted = subtotal - subtotal * discount_percent // 100
            tax = {BUG} * tax_percent // 100
            return discounted + tax


        def tax_only(price, quantity, tax_percent):
            subtotal = price * quantity
            return subtotal * tax_percent // 100


        class {cls}:
            def __init__(self, tax_percent):
                self.tax_percent = tax_percent
                self.lines = []

            @classmethod
            def of(cls, tax_percent, lines):
                invoice = cls(tax_percent)
                for price, quantity, discount in lines:
                    invoice.add(price, quantity, discount)
                return invoice

            def add(self, price, quantity, discount_percent=0):
                self.lines.append((price, quantity, discount_percent))
                return self

            def total(self):
                return sum(line_total(p, q, d, self.tax_percent) for p, q, d in self.lines)

            def total_text(self):
                return cents_to_text(self.total())
        ''')
    buggy, fixed = _versions(template, "subtotal", "discounted")
    tax = rng.choice((7, 10, 19, 21, 25))
    imp = {f"{pkg}.invoice": ["line_total", "tax_only", cls]}
    price, qty, disc = rng.randint(300, 2000), rng.randint(1, 5), rng.choice((10, 15, 20, 25, 30))
    lines = [(rng.randint(100, 900), rng.randint(1, 4), rng.choice((0, 10, 20))) for _ in range(3)]
    cases = [
        Case("discounted_line", "target", "line_total", [str(price), str(qty), str(disc), str(tax)], imp),
        Case("invoice_total_with_discounts", "hidden", "total", [], imp, f"{cls}.of({tax}, {lines + [(999, 2, 50)]})"),
        Case("line_without_discount", "regression", "line_total", [str(price), str(qty), "0", str(tax)], imp),
        Case("line_without_tax", "regression", "line_total", [str(price), str(qty), str(disc), "0"], imp),
        Case("tax_only", "regression", "tax_only", [str(price), str(qty), str(tax)], imp),
        Case("invoice_total_without_discounts", "regression", "total", [], imp,
             f"{cls}.of({tax}, {[(p, q, 0) for p, q, _ in lines]})"),
        Case("total_text_untaxed", "regression", "total_text", [], imp, f"{cls}.of(0, {lines})"),
    ]
    rule = (f"The {disc}% reduction should come off first and the {tax}% be charged on the remainder (each step "
            "rounded down to a cent).")
    return _draft(seed, pkg, "invoice", buggy, fixed, {f"{pkg}/money.py": MONEY}, cases, "line_total", rule,
                  ["line_total"], 1, "discount_then_tax")


def running_reset(rng: random.Random, seed: int) -> Draft:
    pkg, noun = rng.choice((("ledgerlite", "account"), ("meterlog", "meter"), ("scorebook", "player"),
                            ("stocktake", "shelf")))
    template = _code(f'''
        """Running totals over entries sorted by {noun}."""


        def running_totals(entries):
            """[({noun}, running total)] for [({noun}, amount)] entries sorted by {noun}."""
            out = []
            current = None
            running = 0
            for key, amount in entries:
                if key != current:
                    current = key
                    {BUG}
                running += amount
                out.append((key, running))
            return out


        def closing_balances(entries):
            """{{{noun}: last running total}}."""
            return dict(running_totals(entries))


        def grand_total(entries):
            total = 0
            for _, amount in entries:
                total += amount
            return total


        def count_by_key(entries):
            counts = {{}}
            for key, _ in entries:
                counts[key] = counts.get(key, 0) + 1
            return counts
        ''')
    buggy, fixed = _versions(template, "", "running = 0")
    names = rng.sample(("ash", "bay", "elm", "fir", "oak", "yew"), 3)

    def entries(keys: list[str]) -> str:
        out = []
        for key in keys:
            out += [(key, rng.randint(1, 50)) for _ in range(rng.randint(1, 3))]
        return str(out)

    imp = {f"{pkg}.totals": ["running_totals", "closing_balances", "grand_total", "count_by_key"]}
    cases = [
        Case("totals_restart_for_each_key", "target", "running_totals", [entries(names[:2])], imp),
        Case("closing_balances_of_several_keys", "hidden", "closing_balances", [entries(names)], imp),
        Case("running_totals_of_one_key", "regression", "running_totals", [entries(names[:1])], imp),
        Case("closing_balance_of_one_key", "regression", "closing_balances", [entries(names[1:2])], imp),
        Case("running_totals_of_nothing", "regression", "running_totals", ["[]"], imp),
        Case("grand_total", "regression", "grand_total", [entries(names)], imp),
        Case("count_by_key", "regression", "count_by_key", [entries(names)], imp),
    ]
    rule = (f"Each {noun} should be summed up on its own, starting from zero at its first entry; here the second "
            f"{noun} carries on from the first one's sum.")
    return _draft(seed, pkg, "totals", buggy, fixed, {}, cases, "running_totals", rule, ["running_totals"], 1,
                  "running_reset")


def even_median(rng: random.Random, seed: int) -> Draft:
    pkg = rng.choice(("labstats", "surveykit", "racetimes", "pollster"))
    template = _code('''
        """Summary statistics of a list of numbers."""


        def median(values):
            """The middle of the sorted values."""
            ordered = sorted(values)
            n = len(ordered)
            if n == 0:
                raise ValueError("median of no values")
            half = n // 2
            if n % 2:
                return ordered[half]
            @@BUG@@


        def mean(values):
            if not values:
                raise ValueError("mean of no values")
            return sum(values) / len(values)


        def spread(values):
            return max(values) - min(values)


        def summary(values):
            return {"median": median(values), "mean": round(mean(values), 3), "spread": spread(values)}
        ''')
    buggy, fixed = _versions(template, "return ordered[half]", "return (ordered[half - 1] + ordered[half]) / 2")

    def values(n: int) -> list[int]:
        return rng.sample(range(1, 99), n)

    imp = {f"{pkg}.stats": ["median", "mean", "spread", "summary"]}
    cases = [
        Case("median_of_an_even_count", "target", "median", [str(values(rng.choice((4, 6))))], imp),
        Case("summary_of_an_even_count", "hidden", "summary", [str(values(rng.choice((2, 8))))], imp),
        Case("median_of_an_odd_count", "regression", "median", [str(values(rng.choice((3, 5, 7))))], imp),
        Case("median_of_one_value", "regression", "median", [str(values(1))], imp),
        Case("summary_of_an_odd_count", "regression", "summary", [str(values(5))], imp),
        Case("mean", "regression", "mean", [str(values(4))], imp),
        Case("spread", "regression", "spread", [str(values(6))], imp),
    ]
    rule = "For an even number of values the median is the average of the two middle ones."
    return _draft(seed, pkg, "stats", buggy, fixed, {}, cases, "median", rule, ["median"], 0, "even_median")


# Stems whose last letter is one of the suffix's characters (str.rstrip eats into them) and stems whose last
# letter is not, per suffix.
SUFFIX_STEMS = {
    ".csv": (("metrics", "orders", "invoices", "sales", "clicks", "refunds"),
             ("inventory", "payroll", "ledger", "stock_2024", "budget")),
    ".json": (("sessions", "regions", "campaign", "portfolio", "accounts", "returns"),
              ("inventory", "payroll", "ledger", "batch_7", "budget")),
    ".tsv": (("shipments", "events", "budget", "transfers", "visits", "receipt"),
             ("inventory", "payroll", "ledger", "batch_7", "roster")),
}


def suffix_strip(rng: random.Random, seed: int) -> Draft:
    """str.rstrip(suffix) strips characters, not a suffix: right for most names, wrong for a stem that ends in
    one of the suffix's letters."""
    pkg = rng.choice(("exportkit", "datashelf", "ingestor", "lakeindex"))
    suffix = rng.choice(sorted(SUFFIX_STEMS))
    eaten, kept = SUFFIX_STEMS[suffix]
    folder = rng.choice(("exports", "incoming/2024-06", "share/reports", "dumps"))
    template = _code(f'''
        """Data sets found in an export folder: one file each, named after the data set."""

        SUFFIX = "{suffix}"
        TEMP_PREFIX = "~"


        def _file_name(path):
            return path.replace("\\\\", "/").rsplit("/", 1)[-1]


        def is_dataset(path):
            """Whether `path` is a finished data-set file (not a temporary copy being written)."""
            base = _file_name(path)
            return base.endswith(SUFFIX) and not base.startswith(TEMP_PREFIX)


        def dataset_name(path):
            """The data set a file holds, from its file name."""
            base = _file_name(path)
            return {BUG}


        def without_temp_marker(stem):
            return stem.removeprefix(TEMP_PREFIX)


        def dataset_names(paths):
            """Names of the data sets among `paths`, sorted, each once."""
            return sorted({{dataset_name(path) for path in paths if is_dataset(path)}})
        ''')
    buggy, fixed = _versions(template, "base.rstrip(SUFFIX)", "base.removesuffix(SUFFIX)")
    bad = rng.sample(eaten, 3)
    good = rng.sample(kept, 3)
    imp = {f"{pkg}.datasets": ["dataset_name", "dataset_names", "is_dataset", "without_temp_marker"]}
    listing = [f"{folder}/{bad[1]}{suffix}", f"{folder}/{good[0]}{suffix}", f"{folder}/~{good[1]}{suffix}",
               f"{folder}/{good[2]}.txt"]
    rng.shuffle(listing)
    cases = [
        Case("name_of_a_file_in_a_folder", "target", "dataset_name", [repr(f"{folder}/{bad[0]}{suffix}")], imp),
        Case("names_of_a_folder", "hidden", "dataset_names", [repr(listing)], imp),
        Case("name_of_a_bare_file", "hidden", "dataset_name", [repr(f"{bad[2]}{suffix}")], imp),
        Case("name_of_another_file", "regression", "dataset_name", [repr(f"{folder}/{good[0]}{suffix}")], imp),
        Case("name_of_a_windows_path", "regression", "dataset_name", [repr(f"C:\\{good[1]}{suffix}")], imp),
        Case("names_without_temporary_files", "regression", "dataset_names",
             [repr([f"{good[0]}{suffix}", f"~{good[0]}{suffix}", f"{good[2]}{suffix}", f"{good[1]}.bak"])], imp),
        Case("a_temporary_file_is_no_dataset", "regression", "is_dataset", [repr(f"~{good[2]}{suffix}")], imp),
        Case("another_ending_is_no_dataset", "regression", "is_dataset", [repr(f"{folder}/{good[0]}.txt")], imp),
        Case("temp_marker_removed", "regression", "without_temp_marker", [repr(f"~{good[1]}")], imp),
    ]
    rule = (f"That file holds the `{bad[0]}` set, so I expect `{bad[0]}`: whatever comes before `{suffix}`, "
            f"unchanged. Other files in the folder, such as `{good[0]}{suffix}`, are handled correctly.")
    return _draft(seed, pkg, "datasets", buggy, fixed, {}, cases, "dataset_name", rule, ["dataset_name"], 1,
                  "suffix_strip")


def tiebreak_ranking(rng: random.Random, seed: int) -> Draft:
    """Best first with ties in alphabetical order: `reverse=True` on a (points, name) key reverses the
    tie-break too."""
    pkg, cls, who = rng.choice((("fivesleague", "Standings", "team"), ("chessladder", "Ladder", "player"),
                                ("quiznight", "Scoreboard", "team"), ("dartsclub", "Ranking", "player")))
    template = _code(f'''
        """Scores per {who} and the ranking they make."""


        class {cls}:
            """The score of each {who}, the highest first in the ranking."""

            def __init__(self):
                self.scores = {{}}

            @classmethod
            def from_results(cls, results):
                board = cls()
                for who, score in results:
                    board.add(who, score)
                return board

            def add(self, who, score):
                if score < 0:
                    raise ValueError("a score cannot be negative")
                self.scores[who] = self.scores.get(who, 0) + score

            def table(self):
                """[(who, score)], highest score first."""
                return sorted(self.scores.items(), key={BUG})

            def leaders(self, n):
                return [who for who, _ in self.table()[:n]]

            def position(self, who):
                return [entry for entry, _ in self.table()].index(who) + 1

            def names(self):
                return sorted(self.scores)
        ''')
    buggy, fixed = _versions(template, "lambda item: (item[1], item[0]), reverse=True",
                             "lambda item: (-item[1], item[0])")
    names = rng.sample(("alder", "birch", "cedar", "dune", "ember", "flint", "grove", "heath", "iris", "juniper"), 6)

    def results(tied: bool) -> str:
        points = rng.sample(range(3, 30), 5)
        rows = list(zip(sorted(names[:5]), points))
        if tied:  # two names level on points, the alphabetically later one listed first in the results
            first, second = sorted(rng.sample(names[:5], 2))
            level = dict(rows)[first]
            rows = [(n, level if n == second else p) for n, p in rows]
            rows.sort(key=lambda row: row[0] != second)
        return f"{cls}.from_results({rows!r})"

    top = rng.randint(10, 20)
    tie_at_the_cut = f"{cls}.from_results({[(names[0], top + 5), (names[3], top), (names[1], top), (names[2], 2)]!r})"
    imp = {f"{pkg}.standings": [cls]}
    cases = [
        Case("leaders_with_two_level", "target", "leaders", ["5"], imp, results(True)),
        Case("table_with_two_level", "hidden", "table", [], imp, results(True)),
        Case("leaders_with_a_tie_at_the_cut", "hidden", "leaders", ["2"], imp, tie_at_the_cut),
        Case("position_of_a_level_name", "hidden", "position", [repr(sorted((names[1], names[3]))[0])], imp,
             tie_at_the_cut),
        Case("table_without_ties", "regression", "table", [], imp, results(False)),
        Case("leaders_without_ties", "regression", "leaders", ["3"], imp, results(False)),
        Case("position_of_the_leader", "regression", "position", [repr(names[0])], imp, tie_at_the_cut),
        Case("names_in_alphabetical_order", "regression", "names", [], imp, results(True)),
        Case("points_add_up", "regression", "table", [], imp,
             f"{cls}.from_results({[(names[4], 3), (names[5], 7), (names[4], 6)]!r})"),
    ]
    rule = (f"{who.capitalize()}s level on points should come in alphabetical order, the way the club publishes "
            "them; the order by points itself is right.")
    return _draft(seed, pkg, "standings", buggy, fixed, {}, cases, "leaders", rule, [cls], 1, "tiebreak_ranking")


TEMPLATES: tuple[Template, ...] = (
    Template("tiered_tariff", tiered_tariff, "tariff"),
    Template("half_open_bookings", half_open_bookings, "booking"),
    Template("leap_years", leap_years, "date"),
    Template("precedence_eligibility", precedence_eligibility, "member"),
    Template("sliding_window", sliding_window, "event"),
    Template("discount_then_tax", discount_then_tax, "invoice"),
    Template("running_reset", running_reset, "entry"),
    Template("even_median", even_median, "sample"),
    Template("suffix_strip", suffix_strip, "file"),
    Template("tiebreak_ranking", tiebreak_ranking, "score"),
)


def generate(seed: int, template: str | None = None, size: str = DEFAULT_SIZE) -> Scenario:
    """The scenario of `seed` (deterministic); `template` picks one template by key; `size` "small" (the
    template alone, 25-50 lines) or "large" (300-600 lines of source: correct code around the bug)."""
    if template is not None and template not in {t.key for t in TEMPLATES}:
        raise ValueError(f"unknown template {template!r}; known: {', '.join(t.key for t in TEMPLATES)}")
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")

    def build(rng: random.Random) -> Draft:
        chosen = next(t for t in TEMPLATES if t.key == template) if template else rng.choice(TEMPLATES)
        return _pad(chosen.build(rng, seed), size, chosen.noun)

    return generate_with_retries(build, seed)
