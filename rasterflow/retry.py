"""The retry policy of remote requests (``source.retry``), shared by the STAC search and the raster reader.

One frozen :class:`RetryPolicy` says how often and how patiently to retry; two adapters apply it with well-kept
libraries instead of a hand-written loop:

* :func:`urllib3_retry`: a ``urllib3.Retry`` for a requests session (pystac-client's ``StacApiIO``): every method
  (a STAC search is a POST), the policy's HTTP statuses, connection resets and timeouts, ``Retry-After`` honoured;
* :func:`retrying`: a ``tenacity.Retrying`` for a callable whose failures a predicate classifies (the reader: GDAL
  reports HTTP statuses and curl errors in its messages, see :mod:`rasterflow.read.remote`).

Transient means 5xx / 429 / 408 (the policy's ``statuses``), connection resets and timeouts; a 404, a 403 or a file
that is not a raster is never retried. Pure and light to import: urllib3 and tenacity are imported on use.

:func:`using` makes a policy the current one for the code it wraps (a context variable), so the catalog search
picks it up without every layer in between passing it along.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import tenacity
    from urllib3.response import BaseHTTPResponse
    from urllib3.util.retry import Retry

    from rasterflow.spec.models import SourceRetry

__all__ = ["RetryPolicy", "DEFAULT_STATUSES", "urllib3_retry", "retrying", "using", "current"]

DEFAULT_STATUSES = (408, 429, 500, 502, 503, 504)
"""HTTP statuses retried unless the spec says otherwise: timeouts, throttling and server-side failures."""


@dataclass(frozen=True)
class RetryPolicy:
    """How remote requests are retried."""

    attempts: int = 5
    """Tries in all, the first included (1 = never retry)."""
    backoff: float = 0.5
    """Seconds before the second try."""
    backoff_factor: float = 2.0
    """Each further wait is this many times the previous one."""
    max_delay: float = 20.0
    """No wait is longer than this many seconds (a ``Retry-After`` too)."""
    statuses: tuple[int, ...] = DEFAULT_STATUSES
    """HTTP statuses that are transient."""
    timeout: float = 60.0
    """Seconds one request may take (connecting: at most 10 of them); a timeout is transient."""

    @classmethod
    def from_spec(cls, retry: SourceRetry | None) -> RetryPolicy:
        """From the spec's ``source.retry`` section (None -> the defaults)."""
        if retry is None:
            return cls()
        return cls(attempts=int(retry.attempts), backoff=float(retry.backoff),
                   backoff_factor=float(retry.backoff_factor), max_delay=float(retry.max_delay),
                   statuses=tuple(int(s) for s in retry.statuses), timeout=float(retry.timeout))

    def delay(self, retry_number: int) -> float:
        """Seconds to wait before retry ``retry_number`` (1 = the second try)."""
        return min(self.max_delay, self.backoff * self.backoff_factor ** max(0, retry_number - 1))

    def is_transient_status(self, status: int | None) -> bool:
        return status is not None and status in self.statuses

    def as_dict(self) -> dict[str, Any]:
        return {"attempts": self.attempts, "backoff": self.backoff, "backoff_factor": self.backoff_factor,
                "max_delay": self.max_delay, "statuses": list(self.statuses), "timeout": self.timeout}


def urllib3_retry(policy: RetryPolicy) -> Retry:
    """A ``urllib3.Retry`` applying ``policy`` to every request of a requests session.

    ``allowed_methods=None`` retries every verb: pystac-client searches with POST, which urllib3 leaves alone by
    default. ``raise_on_status=False`` hands the last answer back after the final try, so the caller's error names
    the status instead of urllib3's "too many retries".
    """
    from urllib3.util.retry import Retry

    class _CappedRetry(Retry):
        """A server's Retry-After, but never longer than the policy's max_delay (a misbehaving server must not park
        the run for an hour); urllib3 carries the subclass through each retry (``Retry.new``)."""

        def get_retry_after(self, response: BaseHTTPResponse) -> float | None:
            seconds = super().get_retry_after(response)
            return None if seconds is None else min(seconds, policy.max_delay)

    retries = max(0, policy.attempts - 1)
    # urllib3 2.x retries the first time at once, then waits backoff * 2 ** (n - 1) (its base is always 2), at
    # most backoff_max; a Retry-After header replaces that wait.
    return _CappedRetry(
        total=retries, connect=retries, read=retries, status=retries, other=0,
        backoff_factor=policy.backoff, backoff_max=policy.max_delay,
        status_forcelist=frozenset(policy.statuses), allowed_methods=None,
        respect_retry_after_header=True, raise_on_status=False, raise_on_redirect=False,
    )


def retrying(policy: RetryPolicy, is_transient: Callable[[BaseException], bool],
             before_retry: Callable[[int, BaseException], None] | None = None) -> tenacity.Retrying:
    """A ``tenacity.Retrying`` that re-runs on transient errors (``is_transient``) up to ``policy.attempts``.

    ``before_retry(retry_number, error)`` runs before each new try (e.g. to clear a cached failure). The last error
    is re-raised as it was when the tries are used up or an error is not transient.
    """
    import tenacity

    def _before_sleep(state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        if before_retry is not None and error is not None:
            before_retry(state.attempt_number, error)

    return tenacity.Retrying(
        stop=tenacity.stop_after_attempt(max(1, policy.attempts)),
        wait=tenacity.wait_exponential(multiplier=policy.backoff, exp_base=policy.backoff_factor,
                                       max=policy.max_delay) if policy.backoff > 0 else tenacity.wait_none(),
        retry=tenacity.retry_if_exception(is_transient),
        before_sleep=_before_sleep,
        reraise=True,
    )


_CURRENT: contextvars.ContextVar[RetryPolicy | None] = contextvars.ContextVar("rasterflow_retry", default=None)


@contextlib.contextmanager
def using(policy: RetryPolicy) -> Iterator[RetryPolicy]:
    """Make ``policy`` the current retry policy inside the ``with`` block (see :func:`current`)."""
    token = _CURRENT.set(policy)
    try:
        yield policy
    finally:
        _CURRENT.reset(token)


def current() -> RetryPolicy:
    """The policy set by :func:`using`, else the defaults."""
    return _CURRENT.get() or RetryPolicy()
