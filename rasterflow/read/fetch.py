"""Concurrent byte-range requests for remote COGs: one client per process, many requests in flight.

Why: a task that asks GDAL for one file's window after the other waits one round trip per file (and more per
sub-block), so over a network with 40 ms per request the CPU sits idle (issue 27: 7x the local wall). Here a
process keeps one asyncio event loop in a thread of its own; the compute threads hand it the byte ranges a task
needs (:meth:`RangeClient.submit`) and go on decoding what has arrived while the rest is in flight. At most
``concurrency`` requests are in flight per process (``source.io.concurrency``), whatever the number of threads.

Transports, each a well-kept library made for this:

* ``http(s)://``: aiohttp (keep-alive connections; signed URLs with their query string as they are: obstore's
  ``HTTPStore`` escapes the ``?``). obstore's ``HTTPStore`` for plain URLs takes ~25% less CPU per GB
  (``benchmarks/fetch_cpu.py``) but was no faster end to end on the season benchmark at 40 ms, three times
  (2026-12-05: 19.8 vs 19.3 s; again after the requests were halved; 2026-12-07, the tiles as views of its buffer:
  12.9-14.0 vs 12.8-14.3 s and 70-90 MB more peak), so aiohttp stays;
* ``s3://``: obstore's ``S3Store`` (signing, credentials, custom endpoints, requester pays, anonymous access), set up
  from the same environment variables GDAL and boto read (:func:`s3_config`);
* ``az://container/key`` and ``abfs://container[@account.dfs.core.windows.net]/key``: obstore's ``AzureStore``,
  set up from GDAL's ``/vsiaz/`` variables (:func:`azure_config`);
* ``gs://bucket/key``: obstore's ``GCSStore``, set up from GDAL's ``/vsigs/`` variables (:func:`gcs_config`);
  an environment that authenticates in a way only GDAL follows (HMAC keys, a refresh token, requester pays, a
  private key, a boto file) leaves ``gs://`` with GDAL (:func:`supported`). Tested against fake-gcs-server.

Every answer is checked: the status (404/403 final, the run's transient statuses retried), ``Content-Range`` against
the range asked for, and the body's length (a truncated body is a transient failure). Transient failures are tried
again under the run's :class:`~rasterflow.retry.RetryPolicy` with tenacity's ``AsyncRetrying``, each retry counted
for the run report (:func:`rasterflow.read.policy.record_retry`). Failures are
:class:`~rasterflow.read.remote.ReadFailedError` naming the href (never a signed URL's token).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, TypeVar

from rasterflow.read.policy import record_io
from rasterflow.read.remote import ReadFailedError
from rasterflow.readplan import TRUE_VALUES, gcs_config, supported  # noqa: F401  (defined below the reader)
from rasterflow.retry import RetryPolicy

if TYPE_CHECKING:  # pragma: no cover
    import aiohttp
    from obstore.store import AzureConfig, AzureStore, ClientConfig, GCSStore, S3Config, S3Store

__all__ = ["RangeClient", "Answer", "client", "close_all", "supported", "s3_config", "azure_config", "gcs_config"]

StoreT = TypeVar("StoreT")

_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)", re.IGNORECASE)
_STATUS_IN_TEXT = re.compile(r"(?:status(?: code)?|HTTP)[:\s]+(\d{3})\b", re.IGNORECASE)


def azure_config(environ: Mapping[str, str] | None = None, account: str | None = None) -> AzureConfig:
    """obstore's ``AzureStore`` settings from the variables GDAL's ``/vsiaz/`` reads:
    ``AZURE_STORAGE_CONNECTION_STRING`` (``AccountName``, ``AccountKey``, ``BlobEndpoint``,
    ``SharedAccessSignature``), ``AZURE_STORAGE_ACCOUNT``, ``AZURE_STORAGE_ACCESS_KEY``, ``AZURE_STORAGE_SAS_TOKEN``
    and ``AZURE_NO_SIGN_REQUEST``. ``account`` (from an ``abfs://container@account...`` href) wins over the
    environment's account name."""
    env = os.environ if environ is None else environ
    config: AzureConfig = {}
    parts = dict(part.split("=", 1) for part in env.get("AZURE_STORAGE_CONNECTION_STRING", "").split(";")
                 if "=" in part)
    name = account or parts.get("AccountName") or env.get("AZURE_STORAGE_ACCOUNT")
    if name:
        config["account_name"] = name
    if parts.get("BlobEndpoint"):
        config["endpoint"] = parts["BlobEndpoint"].rstrip("/")
    if env.get("AZURE_NO_SIGN_REQUEST", "").upper() in TRUE_VALUES:
        config["skip_signature"] = True
        return config
    key = parts.get("AccountKey") or env.get("AZURE_STORAGE_ACCESS_KEY")
    sas = parts.get("SharedAccessSignature") or env.get("AZURE_STORAGE_SAS_TOKEN")
    if key:
        config["account_key"] = key
    elif sas:
        config["sas_key"] = sas.lstrip("?")
    return config


def azure_location(url: str) -> tuple[str, str, str | None]:
    """``az://container/key`` or ``abfs://container[@account.host]/key`` -> (container, key, account or None)."""
    rest = url.partition("://")[2]
    where, _, key = rest.partition("/")
    container, _, host = where.partition("@")
    return container, key, (host.split(".", 1)[0] or None) if host else None


@dataclass(frozen=True)
class Answer:
    """The bytes of one range and the size of the whole file (from ``Content-Range``; None when not said); with
    ``pieces`` asked for, ``parts`` holds each piece's bytes and ``data`` is empty."""

    data: bytes | memoryview
    """A header's bytes, or the range's bytes (for an object store a view of its client's buffer)."""
    size: int | None
    parts: tuple[bytes, ...] = ()
    slot_seconds: float = 0.0
    """Of its last try, how long it waited for one of the ``source.io.concurrency`` slots (others in flight)."""
    request_seconds: float = 0.0
    """Of its last try, from taking a slot to the last byte (the round trip and the transfer)."""


def s3_config(environ: Mapping[str, str] | None = None) -> S3Config:
    """obstore's ``S3Store`` settings from the environment GDAL and boto users set (see
    :mod:`rasterflow.gdalenv`): a custom endpoint as boto (``AWS_ENDPOINT_URL[_S3]``) or GDAL
    (``AWS_S3_ENDPOINT`` + ``AWS_HTTPS``) spells it, ``AWS_VIRTUAL_HOSTING``, ``AWS_NO_SIGN_REQUEST``,
    ``AWS_REQUEST_PAYER``, the region and the credentials."""
    env = os.environ if environ is None else environ
    config: S3Config = {}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if not endpoint and env.get("AWS_S3_ENDPOINT"):
        host = env["AWS_S3_ENDPOINT"]
        scheme = "http" if env.get("AWS_HTTPS", "YES").upper() in ("NO", "FALSE", "0") else "https"
        endpoint = host if "://" in host else f"{scheme}://{host}"
    if endpoint:
        config["endpoint"] = endpoint.rstrip("/")
        virtual = env.get("AWS_VIRTUAL_HOSTING", "FALSE").upper() in ("YES", "TRUE", "1")
        config["virtual_hosted_style_request"] = virtual
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        config["region"] = region
    if env.get("AWS_NO_SIGN_REQUEST", "").upper() in ("YES", "TRUE", "1"):
        config["skip_signature"] = True
    else:
        credentials: tuple[tuple[str, Literal["access_key_id", "secret_access_key", "session_token"]], ...] = (
            ("AWS_ACCESS_KEY_ID", "access_key_id"), ("AWS_SECRET_ACCESS_KEY", "secret_access_key"),
            ("AWS_SESSION_TOKEN", "session_token"))
        for name, key in credentials:
            if env.get(name):
                config[key] = env[name]
    if env.get("AWS_REQUEST_PAYER", "").lower() == "requester":
        config["request_payer"] = True
    return config


@dataclass(frozen=True)
class _Submission:
    """The arguments of one :meth:`RangeClient.submit` until the loop starts it."""

    future: concurrent.futures.Future[list[Answer]]
    href: str
    url: str
    ranges: Sequence[tuple[int, int]]
    policy: RetryPolicy
    run_id: str
    on_retry: Callable[[], None] | None
    header: bool
    pieces: Sequence[tuple[int, int]] | None = None


def _cancel_all(tasks: Sequence[asyncio.Task[Answer]]) -> None:
    for task in tasks:
        task.cancel()


class RangeClient:
    """The range requests of one process: an event loop in a daemon thread, bounded in flight."""

    def __init__(self, concurrency: int):
        self.concurrency = max(1, int(concurrency))
        self._in_flight = 0  # changed in the loop's thread only
        # submissions not yet started in the loop: one wake-up of the loop for a burst of them, not one each
        self._queue_lock = threading.Lock()
        self._queued: list[_Submission] = []
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rasterflow-io", daemon=True)
        self._thread.start()
        self._limit = asyncio.Semaphore(self.concurrency)
        self._session: aiohttp.ClientSession | None = None
        self._stores: dict[str, S3Store] = {}
        self._azure_stores: dict[str, AzureStore] = {}
        self._gcs_stores: dict[str, GCSStore] = {}
        self.pid = os.getpid()

    # ---- called from the compute threads ----------------------------------------------------------------------

    def submit(self, href: str, url: str, ranges: Sequence[tuple[int, int]], policy: RetryPolicy, run_id: str,
               on_retry: Callable[[], None] | None = None,
               header: bool = False,
               pieces: Sequence[tuple[int, int]] | None = None) -> concurrent.futures.Future[list[Answer]]:
        """Fetch ``ranges`` (``(start, length)`` each, one request each) of ``url`` (``href`` signed, or as it is)
        -> a future of ``list[Answer]``; ``href`` names the file in errors. ``on_retry`` runs (in the loop's
        thread) before each retry. Cancelling the future cancels its requests (their places in flight are freed).

        ``pieces`` (``(offset in the range, length)`` each, in order, not overlapping; one range only): the answer
        holds each piece's bytes apart (:attr:`Answer.parts`), read from the body as it arrives, the bytes between
        them read and dropped: the tiles of one request without a copy of the whole body (from an object store,
        each copied once out of obstore's buffer)."""
        if pieces is not None and len(ranges) != 1:
            raise ValueError("pieces are for a submission of one range")
        future: concurrent.futures.Future[list[Answer]] = concurrent.futures.Future()
        with self._queue_lock:
            self._queued.append(_Submission(future, href, url, ranges, policy, run_id, on_retry, header, pieces))
            wake = len(self._queued) == 1  # else a wake-up is on its way and will start this one too
        if wake:
            try:
                self._loop.call_soon_threadsafe(self._start_queued)
            except RuntimeError:  # the client was closed: the loop runs no more
                with self._queue_lock:
                    self._queued.clear()
                raise
        return future

    def close(self) -> None:
        async def _close() -> None:
            if self._session is not None:
                await self._session.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():  # else it is still running: leave it to the interpreter's exit
            self._loop.close()  # its selector and self-pipe (else a ResourceWarning when it is collected)

    # ---- in the loop ------------------------------------------------------------------------------------------

    def _start_queued(self) -> None:
        with self._queue_lock:
            queued, self._queued = self._queued, []
        for each in queued:
            self._start(each)

    def _start(self, job: _Submission) -> None:
        """A task per range of ``job``; its future gets their answers in order, or the first failure (the other
        ranges go on, as under ``asyncio.gather``). Done without a task and a gather of its own per submission: at
        ~13k requests a run, the client's CPU per request is what a worker's cores pay for remote reads."""
        future = job.future
        if future.cancelled():
            return
        tasks = [self._loop.create_task(self._fetch_retried(job.href, job.url, start, length, job.policy,
                                                            job.run_id, job.on_retry, job.header, job.pieces))
                 for start, length in job.ranges]
        left = len(tasks)

        def settle(task: asyncio.Task[Answer]) -> None:
            nonlocal left
            left -= 1
            if future.done():  # failed already, or cancelled: only take the error off the task (else it is logged)
                if not task.cancelled():
                    task.exception()
                return
            if task.cancelled():
                future.cancel()
            elif task.exception() is not None:
                if future.set_running_or_notify_cancel():
                    future.set_exception(task.exception())
            elif left == 0 and future.set_running_or_notify_cancel():
                future.set_result([each.result() for each in tasks])

        def cancelled(done: concurrent.futures.Future[list[Answer]]) -> None:  # in the thread that cancelled
            if done.cancelled():
                with contextlib.suppress(RuntimeError):  # the loop is closed: nothing runs in it anymore
                    self._loop.call_soon_threadsafe(_cancel_all, tasks)

        if not tasks:
            if future.set_running_or_notify_cancel():
                future.set_result([])
            return
        for task in tasks:
            task.add_done_callback(settle)
        future.add_done_callback(cancelled)

    async def _fetch_retried(self, href: str, url: str, start: int, length: int, policy: RetryPolicy, run_id: str,
                             on_retry: Callable[[], None] | None, header: bool,
                             pieces: Sequence[tuple[int, int]] | None = None) -> Answer:
        """The range, tried again under ``policy`` after a transient failure. The first try is made directly
        (most succeed): tenacity's ``AsyncRetrying`` is built only after a transient failure, whose first attempt
        then gives that failure again instead of a request, so the tries, their waits, the retries counted through
        ``on_retry`` and the message when it gives up are tenacity's as before."""
        try:
            return await self._fetch_once(href, url, start, length, policy, run_id, header, pieces)
        except ReadFailedError as err:
            if not err.transient:
                raise
            first = err
        return await self._retried(first, href, url, start, length, policy, run_id, on_retry, header, pieces)

    async def _retried(self, first: ReadFailedError, href: str, url: str, start: int, length: int,
                       policy: RetryPolicy, run_id: str, on_retry: Callable[[], None] | None, header: bool,
                       pieces: Sequence[tuple[int, int]] | None = None) -> Answer:
        import tenacity

        def transient(err: BaseException) -> bool:
            return isinstance(err, ReadFailedError) and err.transient

        def before_sleep(state: tenacity.RetryCallState) -> None:
            if on_retry is not None:
                on_retry()

        attempt = 0
        try:
            async for trying in tenacity.AsyncRetrying(
                    stop=tenacity.stop_after_attempt(max(1, policy.attempts)),
                    wait=tenacity.wait_exponential(multiplier=policy.backoff, exp_base=policy.backoff_factor,
                                                   max=policy.max_delay) if policy.backoff > 0
                    else tenacity.wait_none(),
                    retry=tenacity.retry_if_exception(transient), before_sleep=before_sleep, reraise=True):
                with trying:
                    attempt = trying.retry_state.attempt_number
                    if attempt == 1:
                        raise first  # the first try, made already by _fetch_retried
                    return await self._fetch_once(href, url, start, length, policy, run_id, header, pieces)
        except ReadFailedError as err:
            if attempt > 1:
                why = "transient failures" if err.transient else "then a failure that is not transient"
                raise ReadFailedError(f"{err} (gave up after {attempt} tries: {why}; source.retry.attempts is "
                                      f"{policy.attempts})", href=href, status=err.status, transient=err.transient,
                                      attempts=attempt) from None
            raise
        raise AssertionError("unreachable: tenacity either returns or raises")

    async def _fetch_once(self, href: str, url: str, start: int, length: int, policy: RetryPolicy, run_id: str,
                          header: bool, pieces: Sequence[tuple[int, int]] | None = None) -> Answer:
        asked = time.perf_counter()
        async with self._limit:
            self._in_flight += 1
            in_flight = self._in_flight
            started = time.perf_counter()
            received = 0
            try:
                if url.lower().startswith(("s3://", "az://", "abfs://", "gs://")):
                    # several tiles: each copied out of obstore's buffer once, so that each goes after its last
                    # window (views would hold the whole range until the last of them)
                    answer = _in_pieces(await self._object_store(href, url, start, length, policy, header), pieces)
                else:
                    answer = await self._http(href, url, start, length, policy, header, pieces)
                received = length if answer.parts else len(answer.data)
            finally:
                self._in_flight -= 1
                took = time.perf_counter() - started
                record_io(run_id, requests=1, bytes=received, header_reads=int(header), request_seconds=took,
                          in_flight=in_flight)
            return replace(answer, slot_seconds=started - asked, request_seconds=took)

    async def _http(self, href: str, url: str, start: int, length: int, policy: RetryPolicy,
                    header: bool, pieces: Sequence[tuple[int, int]] | None = None) -> Answer:
        import aiohttp

        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.concurrency, limit_per_host=self.concurrency)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        timeout = self._timeouts.get(policy.timeout)
        if timeout is None:
            timeout = self._timeouts[policy.timeout] = aiohttp.ClientTimeout(total=policy.timeout,
                                                                             connect=min(policy.timeout, 10.0))
        end = start + length - 1
        try:
            async with self._session.get(url, headers={"Range": f"bytes={start}-{end}"}, timeout=timeout) as answer:
                status = answer.status
                if status >= 400:
                    await answer.read()
                    raise _failure(href, f"HTTP {status}", status=status,
                                   transient=policy.is_transient_status(status))
                content_range = answer.headers.get("Content-Range")
                if pieces and status == 206:
                    _check_range(href, content_range, start, end, header)
                    return Answer(b"", _size(content_range), await _read_pieces(href, answer.content, length,
                                                                               pieces))
                data = await answer.read()
        except ReadFailedError:
            raise
        except asyncio.TimeoutError:
            raise _failure(href, f"timed out (source.retry.timeout is {policy.timeout:g} s)", transient=True) \
                from None
        except aiohttp.ClientPayloadError as err:
            raise _failure(href, f"truncated body ({err})", transient=True) from None
        except (aiohttp.ClientError, OSError) as err:
            text = str(err) or type(err).__name__
            reason = "connection reset" if "reset" in text.lower() or isinstance(
                err, aiohttp.ServerDisconnectedError) else text
            raise _failure(href, reason, transient=True) from None
        if status == 200:
            # the server ignored the range: the whole file came (a static host without range support)
            if len(data) < start + (0 if header else length):
                raise _failure(href, f"the server sent {len(data)} bytes without a range, fewer than asked for",
                               transient=True)
            return _in_pieces(Answer(data[start:start + length], len(data)), pieces)
        if status != 206:
            raise _failure(href, f"HTTP {status} to a range request", status=status, transient=False)
        got_start, got_end = _check_range(href, content_range, start, end, header)
        if len(data) != got_end - got_start + 1:
            raise _failure(href, f"truncated body: {len(data)} of {got_end - got_start + 1} bytes", transient=True)
        return Answer(data, _size(content_range))

    async def _object_store(self, href: str, url: str, start: int, length: int, policy: RetryPolicy,
                            header: bool) -> Answer:
        """A range of an ``s3://``, ``gs://`` or Azure object through obstore, which checks the answer's
        ``Content-Range`` itself."""
        import obstore

        store: S3Store | AzureStore | GCSStore
        if url.lower().startswith("s3://"):
            bucket, _, key = url[len("s3://"):].partition("/")
            store = self._store(bucket, policy)
        elif url.lower().startswith("gs://"):
            bucket, _, key = url[len("gs://"):].partition("/")
            store = self._gcs_store(bucket, href, policy)
        else:
            container, key, account = azure_location(url)
            store = self._azure_store(container, account, policy)
        try:
            result = await obstore.get_async(store, key, options={"range": (start, start + length)})
            body = await result.bytes_async()
            # a header is parsed as bytes; tiles are decoded from (or copied out of) a view of obstore's buffer,
            # not from a copy of the whole range
            data: bytes | memoryview = bytes(body) if header else memoryview(body)
            size = int(result.meta["size"])
        except Exception as err:  # obstore's errors: NotFoundError, PermissionDeniedError, GenericError...
            raise _object_store_failure(href, err, policy) from None
        if len(data) != (min(start + length, size) - start if header else length):
            raise _failure(href, f"truncated body: {len(data)} of {length} bytes", transient=True)
        return Answer(data, size)

    @staticmethod
    def _client_options(endpoint: str, policy: RetryPolicy) -> ClientConfig:
        from datetime import timedelta

        options: ClientConfig = {"timeout": timedelta(seconds=policy.timeout),
                                   "connect_timeout": timedelta(seconds=min(policy.timeout, 10.0)),
                                   "pool_max_idle_per_host": "256"}
        if endpoint.startswith("http://"):
            options["allow_http"] = True
        return options

    def _store(self, bucket: str, policy: RetryPolicy) -> S3Store:
        """The bucket's store, for the environment as it is now (a changed endpoint or credentials make a new
        one: a long-lived worker may serve runs with different settings)."""
        from obstore.store import S3Store

        config = s3_config()
        return self._cached(self._stores, S3Store, bucket, config, str(config.get("endpoint", "")), policy)

    def _azure_store(self, container: str, account: str | None, policy: RetryPolicy) -> AzureStore:
        """The container's store for the environment as it is now (as :meth:`_store`)."""
        from obstore.store import AzureStore

        config = azure_config(account=account)
        return self._cached(self._azure_stores, AzureStore, container, config, str(config.get("endpoint", "")),
                            policy)

    def _gcs_store(self, bucket: str, href: str, policy: RetryPolicy) -> GCSStore:
        """The bucket's store for the environment as it is now (as :meth:`_store`); an environment only GDAL can
        follow (:func:`gcs_config` is None) is a final failure naming ``href``."""
        from obstore.store import GCSStore

        config = gcs_config()
        if config is None:
            raise _failure(href, "the environment configures /vsigs/ in a way only GDAL follows (HMAC keys, a refresh "
                           "token, requester pays, a private key or a boto file): read it with source.io.reader: gdal",
                           transient=False)
        return self._cached(self._gcs_stores, GCSStore, bucket, config, str(config.get("base_url", "")), policy)

    def _cached(self, cache: dict[str, StoreT], make: Callable[..., StoreT], where: str, config: Mapping[str, object],
                endpoint: str, policy: RetryPolicy) -> StoreT:
        """The store of ``where`` (a bucket or container) under ``config`` from ``cache``, made on first use; at most
        64 kept."""
        from datetime import timedelta

        key = repr((where, sorted(config.items()), policy.timeout))
        store = cache.get(key)
        if store is None:
            # rasterflow retries (counted, reported): the store's own retries would hide the failures
            store = make(where, config=config, client_options=self._client_options(endpoint, policy),
                         retry_config={"max_retries": 0, "retry_timeout": timedelta(seconds=1)})
            if len(cache) > 64:
                cache.clear()
            cache[key] = store
        return store


def _size(content_range: str | None) -> int | None:
    """The file's size a valid ``Content-Range`` says (None for ``*``)."""
    match = _CONTENT_RANGE.match(content_range or "")
    return None if match is None or match.group(3) == "*" else int(match.group(3))


def _check_range(href: str, content_range: str | None, start: int, end: int, header: bool) -> tuple[int, int]:
    """The first and last byte a 206 answer's ``Content-Range`` says it holds, checked against the range asked for
    (a header read may end at the file's end); a transient failure otherwise."""
    match = _CONTENT_RANGE.match(content_range or "")
    if match is None:
        raise _failure(href, f"answer without a valid Content-Range ({content_range!r})", transient=True)
    got_start, got_end = int(match.group(1)), int(match.group(2))
    size = _size(content_range)
    wanted_end = end if size is None or not header else min(end, size - 1)
    if got_start != start or got_end != wanted_end:
        raise _failure(href, f"the server sent bytes {got_start}-{got_end} for the range {start}-{end} "
                       "(a wrong Content-Range)", transient=True)
    return got_start, got_end


async def _read_pieces(href: str, body: aiohttp.StreamReader, length: int,
                       pieces: Sequence[tuple[int, int]]) -> tuple[bytes, ...]:
    """``pieces`` of a body of ``length`` bytes, read as they arrive (the bytes between them read and dropped);
    a body that ends early, or goes on, is a truncated or wrong answer (transient)."""
    parts: list[bytes] = []
    position = 0
    try:
        for offset, count in pieces:
            if offset > position:
                await body.readexactly(offset - position)
            parts.append(await body.readexactly(count))
            position = offset + count
        if position < length:
            await body.readexactly(length - position)
    except asyncio.IncompleteReadError:
        raise _failure(href, f"truncated body: it ended before the {length} bytes asked for", transient=True) \
            from None
    if not body.at_eof() and await body.read(1):
        raise _failure(href, f"the body goes on beyond the {length} bytes asked for", transient=True)
    return tuple(parts)


def _in_pieces(answer: Answer, pieces: Sequence[tuple[int, int]] | None) -> Answer:
    """``answer`` with ``pieces`` of its bytes apart (each a copy, the whole dropped), when asked for."""
    if not pieces:
        return answer
    view = memoryview(answer.data)
    return Answer(b"", answer.size, tuple(bytes(view[offset:offset + count]) for offset, count in pieces))


def _failure(href: str, reason: str, *, status: int | None = None, transient: bool) -> ReadFailedError:
    """A failed request: the message is the reason alone (the reader puts the item, asset and href before it)."""
    return ReadFailedError(reason, href=href, status=status, transient=transient)


def _object_store_failure(href: str, err: BaseException, policy: RetryPolicy) -> ReadFailedError:
    """What an obstore error was: 404 and 403 final, the run's transient statuses retried, a shifted
    ``Content-Range``, a body cut short, a reset or a timeout transient."""
    import obstore.exceptions as errors

    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    if isinstance(err, (errors.NotFoundError, FileNotFoundError)):
        return _failure(href, "HTTP 404 (not found)", status=404, transient=False)
    if isinstance(err, (errors.PermissionDeniedError, errors.UnauthenticatedError, PermissionError)):
        return _failure(href, f"HTTP 403: {text}", status=403, transient=False)
    match = _STATUS_IN_TEXT.search(str(err))
    if match:
        status = int(match.group(1))
        return _failure(href, f"HTTP {status}", status=status, transient=policy.is_transient_status(status))
    wrong = re.search(r"Requested \d+\.\.\d+, got \d+\.\.\d+", str(err))
    if wrong:
        return _failure(href, f"a wrong Content-Range ({wrong.group(0)})", transient=True)
    if "body" in str(err).lower():
        return _failure(href, f"truncated body ({text})", transient=True)
    if "timed out" in str(err).lower() or "timeout" in str(err).lower():
        return _failure(href, f"timed out (source.retry.timeout is {policy.timeout:g} s)", transient=True)
    reason = "connection reset" if "sending request" in str(err) or "reset" in str(err).lower() else text
    return _failure(href, reason, transient=True)  # the network


_CLIENTS: dict[int, RangeClient] = {}
_CLIENT_LOCK = threading.Lock()


def close_all() -> None:
    """Close this process's clients (their connections, loops and threads); registered to run at exit."""
    with _CLIENT_LOCK:
        clients = [c for c in _CLIENTS.values() if c.pid == os.getpid()]
        _CLIENTS.clear()
    for each in clients:
        each.close()


atexit.register(close_all)


def client(concurrency: int) -> RangeClient:
    """This process's client of that ``concurrency``, made on first use (again after a fork). Runs of one process
    with different settings get a client each (and each its own bound), so neither closes the other's."""
    concurrency = max(1, int(concurrency))
    with _CLIENT_LOCK:
        current = _CLIENTS.get(concurrency)
        if current is None or current.pid != os.getpid():
            current = _CLIENTS[concurrency] = RangeClient(concurrency)
        return current
