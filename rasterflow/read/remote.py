"""Remote files for the reader: the GDAL path of an href, what a failure was (HTTP status, transient or not), and
how a retry gets past GDAL's cached failure.

Hrefs: ``http(s)://...`` -> ``/vsicurl/...``; ``s3://bucket/key`` -> ``/vsis3/bucket/key``; ``gs://`` ->
``/vsigs/``; ``az://`` / ``abfs://`` -> ``/vsiaz/``; ``/vsi...`` paths and local files as they are.

What GDAL says (measured with GDAL 3.10.3 against tests/http_faults.py): an HTTP error on the first request of an
open is ``HTTP response code: 503``; a reset or a timeout is ``CURL error: ...``; but an HTTP error or a reset on the
*header range request* that follows is reported only as "not recognized as being in a supported file format", the
same words as for a file that is not a raster. That ambiguous case is settled by one small range request of our
own (http/https; :func:`probe`): an HTTP error or a reset there is what it says; a readable answer (or an object
store, which we cannot ask unsigned) gets exactly one more try, in case the fault was on GDAL's header request
only, and then the file itself is bad (not transient). A failure in the middle of a block read ("Read failed",
"IReadBlock failed") of a remote file is transient (GDAL names no cause); local files are never retried.

GDAL caches a failed open per process (the next open of the href fails at once, with no request). A retry opens
the file with the config option ``CPL_VSIL_CURL_NON_CACHED`` set to that file's path: GDAL then neither uses nor
keeps cached data of that file, and closing the handle drops what was cached (rasterio 1.4 has no public call of
``VSICurlPartialClearCache``; ``rasterio.cache.invalidate`` arrived in 1.5, and the option works with both).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from rasterflow.errors import SourceReadError
from rasterflow.readplan import is_remote, vsi_path  # noqa: F401  (defined below the reader)
from rasterflow.retry import RetryPolicy

__all__ = ["ReadFailedError", "Failure", "vsi_path", "is_remote", "classify", "cache_busting_options", "probe"]

_HTTP_STATUS = re.compile(r"HTTP (?:response )?(?:code|error)[^0-9]{0,12}(\d{3})", re.IGNORECASE)
_CURL_ERROR = re.compile(r"CURL error|Connection reset|timed out|Couldn't connect|Failed to connect|Empty reply|"
                         r"Recv failure|Send failure|transfer closed|SSL", re.IGNORECASE)
_AMBIGUOUS = re.compile(r"not recognized as (?:being in )?a supported file format", re.IGNORECASE)
_READ_FAILED = re.compile(r"Read failed|IReadBlock failed|TIFFRead|read error|short read|Cannot read", re.IGNORECASE)
_MISSING = re.compile(r"does not exist in the file system|No such file", re.IGNORECASE)
# object stores answer in words (S3 error codes and messages as GDAL passes them on)
_OBJECT_STORE = (
    (re.compile(r"specified key does not exist|NoSuchKey|specified bucket does not exist|NoSuchBucket",
                re.IGNORECASE), 404),
    (re.compile(r"Access Denied|AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch|ExpiredToken|"
                r"AuthenticationFailed|AuthorizationFailure", re.IGNORECASE), 403),
    (re.compile(r"SlowDown|Please reduce your request rate|ServerBusy", re.IGNORECASE), 503),
    (re.compile(r"ServiceUnavailable", re.IGNORECASE), 503),
    (re.compile(r"InternalError|We encountered an internal error", re.IGNORECASE), 500),
)


class ReadFailedError(SourceReadError):
    """A source file could not be opened or read: names the item, asset and href; carries the HTTP status (None
    when there was none), whether it was transient, and the tries made."""

    def __init__(self, message: str, *, href: str = "", status: int | None = None, transient: bool = False,
                 attempts: int = 1, unreadable: bool = False):
        super().__init__(message)
        self.href = href
        self.status = status
        self.transient = transient
        self.attempts = attempts
        self.unreadable = unreadable

    @property
    def failure(self) -> Failure:
        return Failure(self.status, self.transient, str(self), self.unreadable)

    def __reduce__(self) -> tuple[Callable[..., ReadFailedError], tuple[str, str, int | None, bool, int, bool]]:
        """Keeps the attributes across process boundaries (Dask pickles task errors)."""
        return (_rebuild, (str(self), self.href, self.status, self.transient, self.attempts, self.unreadable))


def _rebuild(message: str, href: str, status: int | None, transient: bool, attempts: int,
             unreadable: bool) -> ReadFailedError:
    return ReadFailedError(message, href=href, status=status, transient=transient, attempts=attempts,
                           unreadable=unreadable)


@dataclass(frozen=True)
class Failure:
    """What one failed open or read was."""

    status: int | None
    """The HTTP status, when one is known."""
    transient: bool
    reason: str
    """``HTTP 503``, ``connection reset``, ``timed out`` or GDAL's words."""
    unreadable: bool = False
    """GDAL did not recognise the file while the server serves it: a bad file, or a fault that has passed."""


def cache_busting_options(href: str) -> dict[str, str]:
    """Config options that make GDAL forget what it cached about ``href`` (a failed open included).

    Set only around the one open of a retry: GDAL splits the option's value at colons, so for a URL with a scheme
    or port it matches more than that file, which is harmless for the handles of that single open.
    """
    return {"CPL_VSIL_CURL_NON_CACHED": vsi_path(href)} if is_remote(href) else {}


def classify(message: str, href: str, policy: RetryPolicy, *, opening: bool, previous: Failure | None = None,
             probe_href: str | None = None, probe_timeout: float = 10.0) -> Failure:
    """What a failed open (``opening``) or read of ``href`` with GDAL's ``message`` was.

    ``previous`` is the failure of the try before, if any: a file GDAL does not recognise while the server serves
    it gets one more try (the fault may have been on GDAL's header request only), never more. ``probe_href`` is
    what GDAL was given (the signed URL, when the run signs hrefs): that is what the probe asks for.
    """
    if not is_remote(href):
        return Failure(None, False, message)
    match = _HTTP_STATUS.search(message)
    if match:
        status = int(match.group(1))
        return Failure(status, policy.is_transient_status(status), f"HTTP {status}")
    if _CURL_ERROR.search(message):
        reason = "connection reset" if re.search(r"reset", message, re.IGNORECASE) else (
            "timed out" if re.search(r"timed out", message, re.IGNORECASE) else message)
        return Failure(None, True, reason)
    if _MISSING.search(message):
        return Failure(404, False, "HTTP 404 (does not exist)")
    for pattern, status in _OBJECT_STORE:
        if pattern.search(message):
            return Failure(status, policy.is_transient_status(status), f"HTTP {status}: {message}")
    if opening and _AMBIGUOUS.search(message):
        answer = probe(probe_href or href, probe_timeout)
        if isinstance(answer, int) and answer >= 400:
            return Failure(answer, policy.is_transient_status(answer), f"HTTP {answer}")
        if isinstance(answer, str):
            return Failure(None, True, answer)  # the probe was reset or timed out too: the network, not the file
        # the server serves the file (or, for an object store, we cannot ask): one more try, then it is the file
        if previous is not None and previous.unreadable:
            served = f"the server answers HTTP {answer}: " if answer is not None else ""
            return Failure(None, False, f"{message} ({served}the file is not a raster GDAL can read)",
                           unreadable=True)
        return Failure(None, True, message, unreadable=True)
    if _READ_FAILED.search(message) or not opening:
        return Failure(None, True, message)
    return Failure(None, False, message)


def probe(href: str, timeout: float = 10.0) -> int | str | None:
    """One small range request to an http(s) ``href``: its HTTP status, a connection failure's reason, or None
    when ``href`` is not plain HTTP (object stores need signing; GDAL's answer stands)."""
    import http.client
    import urllib.error
    import urllib.request

    if href.startswith("/vsicurl/"):
        href = href[len("/vsicurl/"):]
    if not href.lower().startswith(("http://", "https://")):
        return None
    request = urllib.request.Request(href, headers={"Range": "bytes=0-1023"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
        text = str(getattr(err, "reason", err))
        return "connection reset" if "reset" in text.lower() else ("timed out" if "timed out" in text else text)
