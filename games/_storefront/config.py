"""The config every storefront game extends (`StorefrontGameConfig`) and the target surface a game draws from
(`resolve_surface`, `surface_kind_weights`). See games/_storefront/__init__.py."""
from __future__ import annotations

import dataclasses
import functools
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.storefront.config import StorefrontConfig, surface_fields
from benchmarks.storefront.db import IdFormat
from common.io import load_yaml_mapping
from common.paths import REPO_ROOT
from common.validation import InputError, check_int
from games._storefront.instances import USER_KIND

SHORT_IDS = IdFormat(order_digits=3, item_digits=3, product_digits=3, user_digits=3, payment_digits=3,
                     short_emails=True)
MAX_EPISODE_REQUESTS = 4
SURFACE_FILE_KEY = "file"  # in a `storefront` mapping: the storefront YAML its other keys override
ALONE_EMAIL_AUTH_RATE = 0.75  # share of customers who identify by email in a game run alone


@functools.lru_cache(maxsize=16)
def _read_surface_file(path: str, mtime_ns: int) -> tuple[tuple[str, Any], ...]:
    """The YAML mapping at `path` (cached per modification time: a game config is built per episode)."""
    return tuple(load_yaml_mapping(path).items())


def _surface_file_fields(owner: str, value: Any) -> dict[str, Any]:
    """The StorefrontConfig fields in the storefront YAML `value` (relative to the working directory, else
    to the repository root)."""
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise InputError(f"{owner}.storefront: {SURFACE_FILE_KEY} must be a path to a storefront YAML, got {value!r}; "
                         f"e.g. configs/storefront/cpu_demo.yaml")
    path = Path(value)
    if not path.is_absolute() and not path.exists() and (REPO_ROOT / path).exists():
        path = REPO_ROOT / path
    if not path.is_file():
        raise InputError(f"{owner}.storefront: no storefront YAML at {str(value)!r} (looked in the working directory "
                         f"and in {REPO_ROOT}); pass an existing file, e.g. configs/storefront/cpu_demo.yaml")
    try:
        # Nested values are shared with the cache: StorefrontConfig copies them, nothing here changes them.
        return dict(_read_surface_file(str(path.resolve()), path.stat().st_mtime_ns))
    except InputError as err:
        raise InputError(f"{owner}.storefront: {err}") from None


def resolve_surface(owner: str, value: Any) -> tuple[dict[str, Any], StorefrontConfig]:
    """(JSON-ready fields, StorefrontConfig) of a `storefront` setting: a YAML path, or a mapping of
    StorefrontConfig fields with an optional `file` key naming the YAML they override. Raises InputError
    naming the fix."""
    if isinstance(value, dict):
        fields = dict(value)
        file = fields.pop(SURFACE_FILE_KEY, None)
        fields = {**(_surface_file_fields(owner, file) if file is not None else {}), **fields}
    elif isinstance(value, (str, os.PathLike)):
        fields = _surface_file_fields(owner, value)
    else:
        raise InputError(f"{owner}.storefront must be a path to a storefront YAML or a mapping of StorefrontConfig "
                         f"fields, got {value!r}; e.g. storefront=configs/storefront/cpu_demo.yaml")
    known = {f.name for f in dataclasses.fields(StorefrontConfig)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise InputError(f"{owner}.storefront: {', '.join(map(str, unknown))} not StorefrontConfig fields; fields: "
                         f"{', '.join(sorted(known))} (and {SURFACE_FILE_KEY}: a YAML the others override)")
    try:
        config = StorefrontConfig(**fields)
    except ValueError as err:
        raise InputError(f"{owner}.storefront: {err}") from None
    return surface_fields(config), config


def surface_kind_weights(owner: str, surface: StorefrontConfig, applicable: tuple[str, ...],
                         chosen: tuple[str, ...] | None, field_name: str) -> dict[str, float]:
    """{kind: weight} a game draws from `surface`: the target's weights of the kinds in `applicable` (where
    the game's capability applies) that the target draws, so the game's mix is the target's renormalised.

    `chosen` (the game's kinds field, when the config sets it) departs from that on purpose: its kinds the
    target draws keep the target's weights and the others get their mean weight (1 when none is drawn).
    A game kind the customer speaks of as a target kind ('return_to_gift_card') takes that kind's weight.
    Raises InputError when the target draws none of the applicable kinds."""
    def weight(kind: str) -> float:
        return surface.kind_weights.get(USER_KIND.get(kind, kind), 0.0)

    if chosen is None:
        weights = {kind: weight(kind) for kind in applicable if weight(kind) > 0}
        if not weights:
            raise InputError(f"{owner}: the target storefront draws none of the request kinds this game trains "
                             f"({', '.join(applicable)}; its kind_weights are {surface.kind_weights}); give the "
                             f"storefront a positive weight for one of them, or pass {field_name}=[...] to train "
                             f"kinds the target does not use")
        return weights
    drawn = [weight(kind) for kind in chosen if weight(kind) > 0]
    fill = sum(drawn) / len(drawn) if drawn else 1.0
    return {kind: weight(kind) or fill for kind in chosen}


def draw_kind(rng: random.Random, weights: dict[str, float]) -> str:
    """One request kind at its weight."""
    return rng.choices(tuple(weights), weights=tuple(weights.values()))[0]


@dataclass
class StorefrontGameConfig:
    """Episode settings shared by the four games (each game's config adds its difficulty knobs)."""

    max_steps: int = 8  # assistant turns before the episode is cut off
    max_errors: int = 3  # malformed outputs tolerated; one more ends the episode
    identity_in_opening: bool = False  # True: the customer says who they are up front (one turn shorter)
    # True: ids and emails as in configs/storefront/cpu_demo.yaml (3-digit ids, emails like mia9@x.io), so a
    # game trains the skill on the same id format as a CPU-demo target. With a `storefront` the ids are its
    # own (short_ids=True then checks that they are short).
    short_ids: bool = False
    # The target's surface (see the module docstring): a storefront YAML such as configs/storefront/cpu_demo.yaml,
    # or a mapping of StorefrontConfig fields (optionally with `file`: the YAML they override). Resolved in
    # place to every field, JSON-ready. None: the game's own defaults (the game run alone).
    storefront: str | dict[str, Any] | None = None
    # Requests per episode, each one decision of the game's skill, brought up one at a time: the opening
    # holds the first, the customer's acknowledgement of a closed request brings the next, so each reads as
    # the target's one-request opening. One (the target's shape) by default: a constant policy then wins
    # every episode its constant answer fits, which validate_game's class-prior rule bounds by the largest
    # decision class's share + 0.05 (pipeline/probes.py); more requests stay a knob, never the way honesty is kept.
    requests_per_episode: int = 1

    def __post_init__(self) -> None:
        owner = type(self).__name__
        check_int(self.max_steps, f"{owner}.max_steps", 1, 64)
        check_int(self.max_errors, f"{owner}.max_errors", 0, 64)
        check_int(self.requests_per_episode, f"{owner}.requests_per_episode", 1, MAX_EPISODE_REQUESTS)
        for name in ("identity_in_opening", "short_ids"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"{owner}.{name} must be True or False, got {getattr(self, name)!r}")
        # The target's StorefrontConfig (None without a surface); not a field, so summaries show `storefront`.
        self.surface: StorefrontConfig | None = None
        if self.storefront is not None:
            self.storefront, self.surface = resolve_surface(owner, self.storefront)
            if self.short_ids and self.surface.ids != SHORT_IDS:
                raise InputError(f"{owner}: short_ids=True but the storefront's ids are not short "
                                 f"({self.surface.ids}); drop short_ids (a storefront sets the ids) or give it "
                                 f"3-digit ids and short_emails")

    @property
    def ids(self) -> IdFormat:
        """How the game's database makes ids (the surface's, else `short_ids`)."""
        if self.surface is not None:
            return self.surface.ids
        return SHORT_IDS if self.short_ids else IdFormat()

    def email_share(self, email_auth_rate: float | None) -> float:
        """A game's `email_auth_rate` when set, else the surface's, else ALONE_EMAIL_AUTH_RATE."""
        if email_auth_rate is not None:
            return email_auth_rate
        return ALONE_EMAIL_AUTH_RATE if self.surface is None else self.surface.email_auth_rate

    @property
    def asks_confirmation(self) -> bool:
        """Whether the expert asks before each write, and a write without the customer's yes right before it
        breaks the policy: always, as in the target, unless the surface's policy has no such rule (without a
        surface too: a game that paid writes without a yes would pay a blanket "shall I cancel, return or
        exchange?")."""
        return self.surface is None or self.surface.require_confirmation

    def surface_rates(self, **rates: Any) -> StorefrontConfig:
        """The surface with some of its rates replaced by the game's (its knob sets the capability's need)."""
        if self.surface is None:
            raise RuntimeError(f"{type(self).__name__}: surface_rates() needs a storefront")
        return dataclasses.replace(self.surface, **rates)

    def check_room(self, oracle_turns: int, what: str) -> None:
        """Raise InputError when `max_steps` leaves the oracle no room for `oracle_turns` turns."""
        if self.max_steps < oracle_turns:
            raise InputError(f"{type(self).__name__}.max_steps={self.max_steps} is too small: {what} needs "
                             f"{oracle_turns} turns; pass max_steps={oracle_turns} or more")
