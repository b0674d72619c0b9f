"""A small chat-completion client for OpenAI-compatible servers (OpenAI, vLLM, ...), with our own retries.

The `openai` client's built-in retries are switched off (`max_retries=0`) so that the policy lives
here, where it can be tested and reported:

- 429, 5xx, timeouts, dropped connections and a 200 whose body is not valid JSON are retried with
  exponential backoff and full jitter (delay drawn uniformly from
  [0, min(max_delay, base_delay * 2**retry)]); a `Retry-After` header (seconds or an HTTP date) on a
  429/503 is honoured instead, up to `max_retry_after` seconds.
- 401/403 (bad key), 404 (wrong --base-url or --model) and 400 (e.g. an unsupported response_format)
  raise `FatalAPIError` at once, with the fix spelled out.
- A `RateLimiter` spaces request starts across all threads (`requests_per_minute`).

The API key is handed to the `openai` client and to nothing else: no message built here contains it,
and `redact` removes it from any server text we quote (a server might echo the request).
"""
from __future__ import annotations

import email.utils
import json
import math
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import openai

from common.validation import InputError

RETRY_AFTER_STATUSES = (429, 503)  # statuses whose Retry-After header we honour


class FatalAPIError(RuntimeError):
    """An error retrying cannot fix (bad key, wrong URL/model, rejected request), or retries ran out."""


class RetriesExhausted(FatalAPIError):
    """Every try failed by a transient fault (429, 5xx, timeout, dropped connection, a body that is not JSON): the
    server, not the request, is the problem, so a caller that plays episodes may record the episode as not scored
    and play it later."""


@dataclass(frozen=True)
class RetryPolicy:
    """How transient HTTP failures are retried.

    max_retries: retries after the first try (0 = try once). base_delay / max_delay: seconds of the
    exponential backoff before jitter. max_retry_after: the longest server-requested wait we accept.
    """

    max_retries: int = 6
    base_delay: float = 1.0
    max_delay: float = 60.0
    max_retry_after: float = 300.0

    def __post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise InputError(f"max_retries must be an integer >= 0 (got {self.max_retries!r}); e.g. --http-retries 6")
        for name in ("base_delay", "max_delay", "max_retry_after"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise InputError(f"{name} must be a finite number of seconds >= 0 (got {value!r})")
        if self.max_delay < self.base_delay:
            raise InputError(f"max_delay ({self.max_delay}) must be >= base_delay ({self.base_delay}); "
                             "e.g. --backoff-base 1 --backoff-max 60")

    def backoff(self, retry: int, rng: random.Random) -> float:
        """Seconds to wait before retry number `retry` (0-based): full jitter over the exponential cap."""
        cap = min(self.max_delay, self.base_delay * (2 ** retry))
        return rng.uniform(0.0, cap)


class RateLimiter:
    """Spaces request starts at least 60/requests_per_minute seconds apart, across threads.

    `clock` and `sleep` are injectable so the spacing can be tested without waiting.
    """

    def __init__(self, requests_per_minute: float | None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if requests_per_minute is not None and (not math.isfinite(requests_per_minute) or requests_per_minute <= 0):
            raise InputError(f"requests_per_minute must be > 0 (got {requests_per_minute!r}); omit it for no limit")
        self.interval = 60.0 / requests_per_minute if requests_per_minute else 0.0
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._next_start = -math.inf

    def wait(self) -> None:
        """Block until this request may start; reserves its slot before sleeping so threads queue up."""
        if not self.interval:
            return
        with self._lock:
            now = self._clock()
            start = max(now, self._next_start)
            self._next_start = start + self.interval
        if start > now:
            self._sleep(start - now)


@dataclass
class ChatResult:
    """One successful completion: the text, token usage (0 when the server sends none) and HTTP retries."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    http_retries: int
    finish_reason: str | None = None


@dataclass
class RetryLog:
    """Thread-safe counters of retried failures by kind (e.g. "429", "500", "timeout", "connection")."""

    counts: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, kind: str) -> None:
        with self._lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


class ChatClient:
    """Chat completions against one OpenAI-compatible endpoint, retried by `RetryPolicy`.

    Thread-safe: one instance is shared by all labeling threads. `sleep` and `rng` are injectable for tests.
    """

    def __init__(self, base_url: str, api_key: str, model: str, *, key_source: str = "the API key variable",
                 timeout: float = 120.0, retry: RetryPolicy | None = None, limiter: RateLimiter | None = None,
                 sleep: Callable[[float], None] = time.sleep, rng: random.Random | None = None) -> None:
        if not api_key:
            raise InputError(f"{key_source} is empty; set it (any non-empty value, e.g. EMPTY, for a server "
                             "without authentication)")
        self.base_url, self.model, self.key_source = base_url, model, key_source
        self.retry = retry or RetryPolicy()
        self.limiter = limiter or RateLimiter(None)
        self.retry_log = RetryLog()
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._rng_lock = threading.Lock()
        self._secret = api_key
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout)

    def redact(self, text: str) -> str:
        """`text` with the API key replaced by ***, for quoting server answers in messages."""
        return text.replace(self._secret, "***") if self._secret else text

    def _server_text(self, err: openai.APIStatusError) -> str:
        """A short, key-free excerpt of an error response body."""
        try:
            body = err.response.text
        except (UnicodeDecodeError, RuntimeError):  # RuntimeError: a streamed body that was not read
            body = ""
        return self.redact(" ".join(body.split())[:300])

    def _wait_before_retry(self, retry: int, kind: str, retry_after: float | None) -> None:
        self.retry_log.add(kind)
        if retry_after is not None:
            if retry_after > self.retry.max_retry_after:
                raise FatalAPIError(f"{self.base_url}: the server asks to wait {retry_after:.0f}s (Retry-After) after "
                                    f"{kind}, more than --max-retry-after {self.retry.max_retry_after:g}s; try later")
            delay = retry_after
        else:
            with self._rng_lock:
                delay = self.retry.backoff(retry, self._rng)
        self._sleep(delay)

    def complete(self, messages: list[dict[str, str]], *, temperature: float | None = None, seed: int | None = None,
                 max_tokens: int | None = None, response_format: dict[str, Any] | None = None) -> ChatResult:
        """One chat completion; transient failures are retried, others raise FatalAPIError."""
        params: dict[str, Any] = {"model": self.model, "messages": messages}
        if temperature is not None:
            params["temperature"] = temperature
        if seed is not None:
            params["seed"] = seed
        if max_tokens is not None:
            params["max_tokens"] = max_tokens
        if response_format is not None:
            params["response_format"] = response_format
        last_problem = ""
        for attempt in range(self.retry.max_retries + 1):
            self.limiter.wait()
            retry_after: float | None = None
            try:
                response = self._client.chat.completions.create(**params)
            except openai.APITimeoutError:  # subclass of APIConnectionError: test it first
                kind, last_problem = "timeout", "the request timed out"
            except openai.APIConnectionError as err:
                kind, last_problem = "connection", f"connection failed ({type(err.__cause__ or err).__name__})"
            except json.JSONDecodeError as err:  # a 200 whose body is cut or not JSON: a bad proxy, a server hiccup
                kind, last_problem = "bad_body", f"the server answered with a body that is not valid JSON ({err})"
            except openai.APIStatusError as err:
                status = err.status_code
                if status in (401, 403):
                    raise FatalAPIError(f"{self.base_url}: HTTP {status} (not authorised); check the key in "
                                        f"{self.key_source} and that it is valid for this server") from None
                if status == 404:
                    raise FatalAPIError(f"{self.base_url}: HTTP 404 for model {self.model!r}; check --base-url (it "
                                        "usually ends in /v1) and --model (the server's model name): "
                                        f"{self._server_text(err)}") from None
                if status != 429 and status < 500:
                    raise FatalAPIError(f"{self.base_url}: HTTP {status}, request rejected: {self._server_text(err)}"
                                        " (if it is about response_format, try --json-mode object or none)") from None
                kind, last_problem = str(status), f"HTTP {status}: {self._server_text(err)}"
                if status in RETRY_AFTER_STATUSES:
                    retry_after = parse_retry_after(err.response.headers.get("retry-after"))
            else:
                return self._result(response, attempt)
            if attempt < self.retry.max_retries:
                self._wait_before_retry(attempt, kind, retry_after)
        raise RetriesExhausted(f"{self.base_url}: gave up after {self.retry.max_retries + 1} tries; last failure: "
                            f"{last_problem}")

    def _result(self, response: Any, retries: int) -> ChatResult:
        choices = getattr(response, "choices", None) or []
        if not choices or getattr(choices[0], "message", None) is None:
            raise FatalAPIError(f"{self.base_url}: the answer has no choices[0].message; is this an "
                                "OpenAI-compatible chat completions endpoint?")
        usage = getattr(response, "usage", None)
        return ChatResult(text=choices[0].message.content or "",
                          prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
                          completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
                          http_retries=retries, finish_reason=getattr(choices[0], "finish_reason", None))
