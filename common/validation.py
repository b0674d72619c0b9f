"""The one way to check input: `InputError`, the error of every bad configuration value, flag or input file,
and the checks configs and CLIs share.

Config dataclasses check their fields in `__post_init__` with `need(...)` and the `check_*` helpers, so a bad
value from YAML, a `--key value` flag or Python raises the same InputError, its message naming the field and
the fix; a CLI's `@cli_entry` (common/cli.py) turns it into `error: ...` and exit status 2 before any work
starts. InputError is a ValueError: code that builds a config and catches ValueError keeps working, and a
config is refused the same way whether a CLI or a program built it.

File checks (an output that can be written, a model folder) live in common/io.py; they raise InputError too.
"""
from __future__ import annotations

import math
import os
from typing import Any


class InputError(ValueError):
    """Bad configuration or input (a config value, a flag, a file). CLIs print it and exit 2; nothing is
    written."""


def need(condition: bool, message: str) -> None:
    """InputError(`message`) unless `condition`: a config's `__post_init__` check, its message giving the fix."""
    if not condition:
        raise InputError(message)


def check_url(url: str | None, flag: str) -> str:
    """`url` if it is an http(s) URL with a host, else InputError showing the fix (a missing scheme is the
    usual slip: `localhost:8000` would otherwise be retried for half a minute before anything says why)."""
    from urllib.parse import urlsplit

    text = (url or "").strip()
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in 0-65535
    except ValueError as err:
        raise InputError(f"{flag} {url}: not a valid URL ({err}); e.g. {flag} http://127.0.0.1:8000/v1") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        fixed = f"http://{text}" if text and "://" not in text else "http://127.0.0.1:8000/v1"
        raise InputError(f"{flag} {url}: needs a scheme and host; add http:// (or https://), e.g. {flag} {fixed}")
    return text




def nothing_listens(url: str, timeout: float = 10.0) -> bool:
    """Whether a GET of `url` is refused at the connection (no server there: retrying will not help). Any answer,
    an HTTP error included, and any other failure (a timeout, a name that does not resolve yet) is False: left to
    the caller's client and its retries."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            response.read(1)
    except urllib.error.HTTPError:  # a server answers
        return False
    except urllib.error.URLError as err:
        return isinstance(err.reason, ConnectionRefusedError)
    return False


def check_number(value: float, flag: str, low: float | None = None, high: float | None = None, *,
                 low_open: bool = False, high_open: bool = False) -> float:
    """`value` if it is a finite number within the bounds, else InputError naming `flag` and the range.

    `low_open` / `high_open` exclude that bound (e.g. low=0, low_open=True means "> 0"). NaN and infinities
    are always refused: NaN fails no comparison, so a range test alone lets it through.
    """
    if low is not None and high is not None:
        wanted = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    elif low is not None:
        wanted = f"{'>' if low_open else '>='} {low:g}"
    elif high is not None:
        wanted = f"{'<' if high_open else '<='} {high:g}"
    else:
        wanted = ""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = number and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        raise InputError(f"{flag} must be a finite number {wanted}".rstrip() + f", got {value!r}")
    return value


def check_int(value: int, flag: str, low: int | None = None, high: int | None = None) -> int:
    """`value` if it is an integer within [low, high] (either bound optional), else InputError naming `flag`."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    ok = ok and (low is None or value >= low) and (high is None or value <= high)
    if not ok:
        wanted = (f"in [{low}, {high}]" if low is not None and high is not None
                  else f">= {low}" if low is not None else f"<= {high}" if high is not None else "")
        raise InputError(f"{flag} must be an integer {wanted}".rstrip() + f", got {value!r}")
    return value


def env_number(name: str, kind: type, default: float) -> Any:
    """A number (`kind`: int or float) from the environment variable `name`; `default` when unset or empty;
    InputError naming the variable otherwise."""
    text = os.environ.get(name, "").strip()
    if not text:
        return kind(default)
    try:
        return kind(text)
    except ValueError:
        raise InputError(f"{name}={text!r} is not a number") from None


def check_choices(value: Any, name: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """`value` as a tuple of distinct names from `allowed` (at least one; a comma-separated string is split),
    else InputError naming `name` and the choices."""
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)):
        raise InputError(f"{name} must be a list of names from {list(allowed)}, got {value!r}")
    values = tuple(value)
    bad = [v for v in values if v not in allowed]
    if not values or bad or len(set(values)) != len(values):
        raise InputError(f"{name} must be a non-empty list of distinct names from {list(allowed)}, "
                         f"got {list(values)!r}")
    return values
