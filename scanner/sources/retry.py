"""Retries with backoff for the Hub calls that huggingface_hub does not retry itself.

The client retries listing pages (408/429/5xx) and file downloads on 408/429, but not ``model_info`` and not a
download that answers 5xx; a nightly scan of thousands of repos meets both. A 429 or 503 that says
``Retry-After`` is waited out as the server asks; anything else backs off exponentially.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TypeVar

import httpx2
from huggingface_hub.errors import HfHubHTTPError
from tenacity import (
    RetryCallState,
    Retrying,
    before_sleep_log,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

T = TypeVar("T")
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep trying: ``attempts`` calls in all, waits doubling from ``base_wait`` up to ``max_wait``."""

    attempts: int = 6
    base_wait: float = 1.0
    max_wait: float = 60.0
    max_retry_after: float = 600.0  # a Retry-After beyond this is a sign to give up on the model for tonight


def call_with_retries(fn: Callable[[], T], policy: RetryPolicy) -> T:
    """``fn()``, repeated while it fails with a transient Hub error; the last error is re-raised."""
    backoff = wait_exponential(multiplier=policy.base_wait, max=policy.max_wait)

    def wait(state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome else None
        after = retry_after_seconds(error) if error is not None else None
        return min(after, policy.max_retry_after) if after is not None else backoff(state)

    retrying = Retrying(
        stop=stop_after_attempt(policy.attempts),
        wait=wait,
        retry=retry_if_exception(is_transient),
        before_sleep=before_sleep_log(log, logging.WARNING),
        reraise=True,
    )
    return retrying(fn)


def is_transient(error: BaseException) -> bool:
    """A rate limit, a server error or a dropped connection: worth asking again."""
    if isinstance(error, HfHubHTTPError):
        return error.response is not None and error.response.status_code in RETRYABLE_STATUS
    return isinstance(error, httpx2.TransportError)


def retry_after_seconds(error: BaseException) -> float | None:
    """The wait an HTTP error's ``Retry-After`` header asks for (seconds or an HTTP date), if any."""
    response = getattr(error, "response", None)
    value = response.headers.get("Retry-After") if response is not None else None
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
