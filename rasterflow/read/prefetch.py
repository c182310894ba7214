"""The remote reads of one task, fetched ahead of the decoder: headers once per file and process, the task's tiles
in as few requests as their layout allows, in the order the task decodes them, a bounded number of bytes ahead.

A task knows before it reads a pixel which windows it will read (its chunk, or its sub-blocks one after the other),
in which order (window by window, item by item, asset by asset: the kernels take each item when its date is
evaluated), and, from each file's header, which tiles each window needs and where they lie in the file. So
:class:`TaskReads` plans every fetch at the start of the task:

* each tile is fetched once per task, when the first window that needs it is near, and dropped after the last
  window that needs it has decoded it (a tile cut by two sub-blocks is fetched once, not twice);
* the tiles of one file are coalesced: adjacent tiles of a row of tiles, or tiles apart by at most
  :data:`MAX_GAP` bytes, become one range request (at most :data:`MAX_REQUEST` bytes) when the windows that need
  them follow each other (a task's sub-blocks are taken across each row of them: one request per row of tiles of
  the chunk and file, not one per tile);
* requests are issued in decode order while the bytes fetched but not yet decoded stay within ``buffer``
  (``source.io.buffer``); the process's :class:`~rasterflow.read.fetch.RangeClient` keeps at most
  ``source.io.concurrency`` of them in flight. The decoder thus works on window *w* while the tiles of the next
  windows arrive: I/O and compute overlap, and memory stays bounded by the buffer plus the tiles a later window
  of the task still needs (what :mod:`rasterflow.budget` counts). The window the decoder is at is always asked
  for whole, in every file, whatever the buffer: its tiles arrive in one round trip, not one per file beyond it;
* a task's first window would still cost it a round trip, so where the writer queues tasks on workers of its own
  process (the one-process layout), each queued task's reads are started, within the buffer, before a thread runs
  it (:func:`ahead`, one task ahead per running task) and the task takes them over when it starts.

Files this path cannot decode bit for bit (see :mod:`rasterflow.read.cogheader`), files that need warping, and
schemes the client does not speak go to GDAL as before (:meth:`TaskReads.read` returns False).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from rasterflow.read.cogheader import HEADER_BYTES, RemoteTiff, parse_header
from rasterflow.read.datasets import check_facts, signed_href
from rasterflow.read.fetch import Answer, RangeClient, client, supported
from rasterflow.read.policy import ReadPolicy, collect, failed_before, record_io, record_retry, record_wait
from rasterflow.read.remote import ReadFailedError
from rasterflow.read.tiles import decoder_available, place_tile, window_tiles
from rasterflow.sources import AssetRead, grid_offset

if TYPE_CHECKING:  # pragma: no cover
    import numpy.typing as npt

    from rasterflow.planning import GridPlan
    from rasterflow.read.tiles import TileIndex

__all__ = ["TaskReads", "task_reads", "active", "headers", "probe", "ahead", "starts_ahead", "MAX_GAP", "MAX_REQUEST", "MAX_HEADERS",
           "clear_headers"]

MAX_GAP = 64 * 1024
"""Bytes between two needed tiles of a file that are read through rather than split into two requests (as GDAL's
multi-range merging and async-tiff do): a request costs a round trip, 64 KB cost ~0.5 ms at 1 Gbit/s."""

MAX_REQUEST = 16 * 1024 * 1024
"""No range request is longer: a very wide window is still fetched in pieces that arrive in parallel."""

MIN_WAIT_KEPT = 0.001
"""Waits for bytes shorter than this are counted (``wait_seconds``) but not offered to the report's longest."""

MAX_HEADERS = 4096
"""Parsed headers one process keeps (least recently used dropped first): ~10 KB each for a 10980² COG in 512²
tiles, so at most ~40 MB; a job's files are far fewer per worker."""


# ---- headers, once per file and process ---------------------------------------------------------------------

_HEADERS: collections.OrderedDict[tuple[str, str], RemoteTiff] = collections.OrderedDict()
"""``(run_id, href)`` -> header: a run reads each header once per process, and a later run on the same (long-lived)
workers reads it again, so a file replaced between runs is never decoded with its old tile index."""
_HEADERS_LOCK = threading.Lock()


def clear_headers() -> None:
    """Forget every parsed header of this process (tests)."""
    with _HEADERS_LOCK:
        _HEADERS.clear()


_PENDING: dict[tuple[str, str], concurrent.futures.Future[RemoteTiff | ReadFailedError]] = {}
"""Headers being fetched by some thread of this process: the other threads wait for that fetch, not a second."""


def headers(reads: Sequence[AssetRead], policy: ReadPolicy) -> dict[str, RemoteTiff | ReadFailedError]:
    """The parsed header of each read's file: from this process's cache, the missing ones fetched all at once (one
    request of :data:`~rasterflow.read.cogheader.HEADER_BYTES` each, concurrently). A file whose header cannot be
    fetched maps to its error (the read that needs it raises it). Threads asking for the same file at once share
    one fetch."""
    found: dict[str, RemoteTiff | ReadFailedError] = {}
    mine: dict[str, AssetRead] = {}
    theirs: dict[str, concurrent.futures.Future[RemoteTiff | ReadFailedError]] = {}
    with _HEADERS_LOCK:
        for read in reads:
            key = (policy.run_id, read.href)
            known = _HEADERS.get(key)
            if known is not None:
                _HEADERS.move_to_end(key)
                found[read.href] = known
            elif key in _PENDING:
                theirs[read.href] = _PENDING[key]
            elif read.href not in mine:
                mine[read.href] = read
                _PENDING[key] = concurrent.futures.Future()
    fetcher = client(policy.io_concurrency) if mine else None
    pending: dict[str, tuple[str, concurrent.futures.Future[list[Answer]]]] = {}
    if fetcher is not None:  # files of ours to fetch
        for href, read in mine.items():
            url = signed_href(read, policy)
            pending[href] = (url, fetcher.submit(href, url, [(0, HEADER_BYTES)], policy.retry, policy.run_id,
                                                 on_retry=_counting(policy, href), header=True))
    for href, (url, future) in pending.items():
        result: RemoteTiff | ReadFailedError
        try:
            answer = future.result()[0]

            def more(start: int, length: int, href: str = href, url: str = url) -> bytes:
                assert fetcher is not None  # pending holds fetches of ours only when there is a fetcher
                return fetcher.submit(href, url, [(start, length)], policy.retry,
                                      policy.run_id, on_retry=_counting(policy, href), header=True).result()[0].data

            result = parse_header(href, answer.data, answer.size, more)
        except ReadFailedError as err:
            result = err
        except BaseException as err:  # shared with other threads: they must not wait forever
            result = ReadFailedError(f"header not read ({type(err).__name__}: {err})", href=href, transient=True)
        found[href] = result
        with _HEADERS_LOCK:
            shared = _PENDING.pop((policy.run_id, href))
            if isinstance(result, RemoteTiff):
                _HEADERS[(policy.run_id, href)] = result
                while len(_HEADERS) > MAX_HEADERS:
                    _HEADERS.popitem(last=False)
        shared.set_result(result)
    for href, shared in theirs.items():
        found[href] = shared.result()
    return found


def probe(read: AssetRead, policy: ReadPolicy) -> tuple[RemoteTiff | None, float]:
    """One file's header through the concurrent reader, and the round trip of one small request on the connection
    it opened (what ``plan`` estimates the network time from, and ``source.io.concurrency: auto`` follows; the
    first request also pays the client's start and the connection's set-up). ``(None, seconds)`` when the header
    could not be read; nothing is cached or counted for the run."""
    probe_policy = replace(policy, run_id=f"probe-{policy.run_id}")
    started = time.perf_counter()
    parsed = headers([read], probe_policy)
    seconds = time.perf_counter() - started
    header = parsed.get(read.href)
    if isinstance(header, RemoteTiff):
        started = time.perf_counter()
        try:
            client(policy.io_concurrency).submit(read.href, signed_href(read, policy), [(0, 1024)], policy.retry,
                                                 probe_policy.run_id, header=True).result()
            seconds = min(seconds, time.perf_counter() - started)
        except ReadFailedError:
            pass
    with _HEADERS_LOCK:
        _HEADERS.pop((probe_policy.run_id, read.href), None)
    collect(probe_policy.run_id)  # the probe's statistics are not the run's
    return (header if isinstance(header, RemoteTiff) else None), seconds


def compressed_bytes_per_pixel(reads: Sequence[AssetRead], policy: ReadPolicy) -> float | None:
    """The compressed tile bytes per pixel of ``reads``' files taken together (their headers fetched at once, as
    :func:`probe` does: nothing cached or counted for the run), e.g. one file of each asset a job loads: a mask band
    of few classes compresses far better than a reflectance band. None when no header could be read."""
    probe_policy = replace(policy, run_id=f"probe-{policy.run_id}")
    parsed = headers(reads, probe_policy)
    packed = pixels = 0.0
    for header in parsed.values():
        facts = header.facts if isinstance(header, RemoteTiff) else None
        if facts is not None and facts.compressed_bytes_per_pixel is not None:
            packed += facts.compressed_bytes_per_pixel * facts.height * facts.width
            pixels += facts.height * facts.width
    with _HEADERS_LOCK:
        for read in reads:
            _HEADERS.pop((probe_policy.run_id, read.href), None)
    collect(probe_policy.run_id)
    return packed / pixels if pixels else None


def _counting(policy: ReadPolicy, href: str) -> Callable[[], None]:
    return lambda: record_retry(policy, href)


# ---- one task's reads -------------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Fetch:
    """One range request: ``length`` bytes of ``href`` from ``start``, holding the tiles ``tiles``."""

    href: str
    url: str
    index: TileIndex
    """The file's :class:`~rasterflow.read.tiles.TileIndex` (where each tile lies in the fetched bytes)."""
    start: int
    length: int
    tiles: list[int]
    future: concurrent.futures.Future[list[Answer]] | None = None
    data: bytes | None = None
    error: ReadFailedError | None = None
    pending_tiles: int = 0
    """Tiles of this fetch that a later window still needs (the bytes are dropped at 0)."""
    touched: bool = False
    """Decoded from at least once (its bytes no longer count as fetched ahead)."""
    released: bool = False
    """Its bytes were dropped (no later window needs its tiles)."""
    parts: dict[int, bytes] | None = None
    """A fetch of several tiles once it arrived: each tile's bytes on their own, so that each goes when the last
    window that needs it is decoded (a row of tiles serves the windows across it one after the other)."""
    held: int = 0
    """Bytes of this fetch the task holds (in flight or arrived, not yet dropped)."""
    issued_at: float = 0.0
    """``time.perf_counter()`` when it was asked of the client."""
    issued_ahead: bool = False
    """Asked while its task was queued (:func:`ahead`)."""


@dataclass(eq=False)
class _Event:
    """One window of one file, in decode order: which tiles it needs and where the file lies on the output grid."""

    read: AssetRead
    tiff: RemoteTiff
    rows: tuple[int, int]
    cols: tuple[int, int]
    direct: tuple[int, int]
    tiles: list[int]
    window: int = 0
    """Its window's place in the task's order."""
    consumed: bool = False
    fetches: list[_Fetch] = field(default_factory=list)
    """The fetches this window is the first to need (issued in this order)."""


class TaskReads:
    """The remote reads of one task (see the module docstring). Use from one thread: the task's."""

    def __init__(self, reads_by_item: Sequence[Sequence[AssetRead | None]], grid: GridPlan,
                 windows: Sequence[tuple[tuple[int, int], tuple[int, int]]], policy: ReadPolicy, *,
                 ahead_of_task: bool = False):
        self.policy = policy
        self.grid = grid
        self.events: list[_Event] = []
        self.by_key: dict[tuple[str, tuple[int, int], tuple[int, int]], collections.deque[int]] = {}
        self.tile_left: dict[tuple[str, int], int] = {}
        """Per tile, the windows still to decode it (its bytes go at 0)."""
        self.tile_fetch: dict[tuple[str, int], _Fetch] = {}
        self.header_errors: dict[str, ReadFailedError] = {}
        self.mismatch: dict[str, Exception] = {}
        self.cursor = 0
        self.next_issue = 0
        self.ahead = 0
        """Bytes issued and not yet decoded from: in flight or arrived ahead of the decoder (within ``io_buffer``)."""
        self.holding = 0
        """Bytes issued and not yet dropped: ``ahead`` plus the tiles later windows still need."""
        self.holding_peak = 0
        self.fetcher: RangeClient | None = None
        self.sub_blocks = len(windows) > 1
        """The task reads several windows (sub-blocks): the budget counts a row of the chunk's tiles per file."""
        self.ahead_of_task = ahead_of_task
        """Planned before its task ran (:func:`ahead`)."""
        self.queued = ahead_of_task
        """Its task has not started: what is fetched stays within the buffer (whole windows are asked for only
        once the task decodes them)."""
        self._plan(reads_by_item, windows)

    # ---- planning the task's fetches -------------------------------------------------------------------------

    def _plan(self, reads_by_item: Sequence[Sequence[AssetRead | None]],
              windows: Sequence[tuple[tuple[int, int], tuple[int, int]]]) -> None:
        policy = self.policy
        remote = [read for item in reads_by_item for read in item
                  if read is not None and supported(read.href) and failed_before(policy, read.href) is None]
        if not remote:
            return
        parsed = headers(remote, policy)
        usable: dict[str, tuple[RemoteTiff, tuple[int, int]]] = {}
        urls: dict[str, str] = {}
        for read in remote:
            header = parsed.get(read.href)
            if isinstance(header, ReadFailedError):
                self.header_errors[read.href] = header
                continue
            if header is None or header.index is None or header.facts is None:
                continue
            facts = header.facts
            try:
                check_facts(read, count=facts.count, dtype=facts.dtype, crs=facts.crs, height=facts.height,
                            width=facts.width, transform=facts.transform)
            except Exception as err:  # SourceMismatchError: raised where the file is read
                self.mismatch[read.href] = err
                continue
            direct = grid_offset(facts.crs, facts.transform, self.grid)
            if direct is None:
                continue  # needs warping: GDAL
            usable[read.href] = (header, direct)
            urls[read.href] = signed_href(read, policy)
        if not usable and not self.header_errors and not self.mismatch:
            return
        self.fetcher = client(policy.io_concurrency)
        spans: dict[tuple[str, int], list[int]] = {}  # (href, tile) -> [first window, last window, first event]
        needed: dict[str, list[int]] = {}
        for position, (rows, cols) in enumerate(windows):
            for item in reads_by_item:
                for maybe in item:
                    if maybe is None or maybe.href not in usable:
                        continue
                    read = maybe
                    header, direct = usable[read.href]
                    index = header.index
                    assert index is not None
                    r0, r1 = max(rows[0], direct[0]), min(rows[1], direct[0] + index.height)
                    c0, c1 = max(cols[0], direct[1]), min(cols[1], direct[1] + index.width)
                    if r0 >= r1 or c0 >= c1:
                        tiles: list[int] = []
                    else:
                        tiles = window_tiles(index, r0 - direct[0], c0 - direct[1], r1 - r0, c1 - c0)
                    event = _Event(read=read, tiff=header, rows=rows, cols=cols, direct=direct, tiles=tiles,
                                   window=position)
                    self.by_key.setdefault((read.href, rows, cols), collections.deque()).append(len(self.events))
                    self.events.append(event)
                    for number in tiles:
                        key = (read.href, number)
                        self.tile_left[key] = self.tile_left.get(key, 0) + 1
                        if index.byte_counts[number] <= 0:
                            continue  # sparse: nothing to fetch
                        span = spans.get(key)
                        if span is None:
                            spans[key] = [position, position, len(self.events) - 1]
                            needed.setdefault(read.href, []).append(number)
                        else:
                            span[1] = position
        for href, numbers in needed.items():
            index = usable[href][0].index
            assert index is not None
            for fetch in _coalesce(href, urls[href], index, numbers, spans):
                self.events[min(spans[(href, n)][2] for n in fetch.tiles)].fetches.append(fetch)
                for number in fetch.tiles:
                    self.tile_fetch[(href, number)] = fetch
        for (href, number), fetch in self.tile_fetch.items():
            fetch.pending_tiles += self.tile_left[(href, number)]
        self._pump()

    def _pump(self) -> None:
        """Issue the next fetches in decode order while the bytes fetched ahead stay within the buffer (always at
        least the fetches of the file and window the decoder is at; of a task's sub-blocks, the whole window it is
        at, in every file: a window's tiles are then asked for at once, so the decoder waits at most one round trip
        per window, not one per file beyond the buffer, and a window's tiles are within what the budget counts, a
        row of the chunk's tiles per file)."""
        assert self.fetcher is not None or not self.events
        current = self.events[min(self.cursor, len(self.events) - 1)].window if self.events else 0
        while self.next_issue < len(self.events):
            event = self.events[self.next_issue]
            size = sum(f.length for f in event.fetches)
            beyond = event.window > current if self.sub_blocks and not self.queued else \
                self.next_issue > self.cursor
            if beyond and self.ahead + size > self.policy.io_buffer and self.ahead > 0:
                return
            for fetch in event.fetches:
                self._issue(fetch)
            self.next_issue += 1

    def _issue(self, fetch: _Fetch) -> None:
        """One request per fetch, so that each fetch's bytes go as soon as its own tiles are decoded."""
        if fetch.future is not None or fetch.data is not None or fetch.parts is not None:
            return
        assert self.fetcher is not None
        # several tiles: each one's bytes apart as they arrive, not the whole body and then a copy of each
        pieces = [(int(fetch.index.offsets[n]) - fetch.start, int(fetch.index.byte_counts[n])) for n in fetch.tiles] \
            if len(fetch.tiles) > 1 else None
        fetch.future = self.fetcher.submit(fetch.href, fetch.url, [(fetch.start, fetch.length)], self.policy.retry,
                                           self.policy.run_id, on_retry=_counting(self.policy, fetch.href),
                                           pieces=pieces)
        fetch.issued_at, fetch.issued_ahead = time.perf_counter(), self.queued
        self.ahead += fetch.length
        self.holding += fetch.length
        fetch.held = fetch.length
        self.holding_peak = max(self.holding_peak, self.holding)

    def _at_first_window(self) -> bool:
        """The decoder is at the task's first window (its waits there are the task's start-up)."""
        return self.cursor < len(self.events) and self.events[self.cursor].window == 0

    def taken_over(self) -> None:
        """Its task starts (it was planned ahead of it): from now on the whole window the decoder is at is asked
        for, beginning with the first."""
        self.queued = False
        if self.events:
            self._pump()

    # ---- the decoder's side -----------------------------------------------------------------------------------

    def read(self, read: AssetRead, rows: tuple[int, int], cols: tuple[int, int], out: npt.NDArray[Any],
             covered: npt.NDArray[np.bool_] | None) -> tuple[bool, float | None]:
        """Decode ``read``'s part of the window ``rows`` x ``cols`` into ``out`` and mark ``covered``.

        Returns ``(True, file nodata)`` when done here, ``(False, None)`` when GDAL must read it (a file or
        window this task did not plan). Raises the file's :class:`ReadFailedError` or
        :class:`~rasterflow.errors.SourceMismatchError`."""
        href = read.href
        if href in self.header_errors:
            raise _named(read, self.header_errors[href])
        if href in self.mismatch:
            raise self.mismatch[href]
        queue = self.by_key.get((href, rows, cols))
        if not queue:
            return False, None
        position = queue.popleft()
        event = self.events[position]
        self._skip_to(position)
        try:
            self._decode(event, out, covered)
        except ReadFailedError as err:
            raise _named(read, err) from None
        finally:
            self._consume(event)
            self.cursor = max(self.cursor, position + 1)
            self._pump()
        return True, event.tiff.facts.nodata if event.tiff.facts is not None else None

    def _skip_to(self, position: int) -> None:
        """Windows planned before ``position`` that the decoder did not ask for (the kernel skipped them): their
        tiles are released as if decoded."""
        for earlier in range(self.cursor, position):
            event = self.events[earlier]
            if not event.consumed:
                queue = self.by_key.get((event.read.href, event.rows, event.cols))
                if queue is not None and earlier in queue:
                    queue.remove(earlier)
                self._consume(event)
        if position > self.next_issue:
            self.next_issue = position  # the skipped windows' own fetches are issued on demand, if ever needed
        self._pump()

    def _decode(self, event: _Event, out: npt.NDArray[Any], covered: npt.NDArray[np.bool_] | None) -> None:
        index = event.tiff.index
        assert index is not None
        rows, cols, (row_off, col_off) = event.rows, event.cols, event.direct
        r0, r1 = max(rows[0], row_off), min(rows[1], row_off + index.height)
        c0, c1 = max(cols[0], col_off), min(cols[1], col_off + index.width)
        if r0 >= r1 or c0 >= c1:
            return
        target = out[r0 - rows[0]:r1 - rows[0], c0 - cols[0]:c1 - cols[0]]
        fill = event.tiff.facts.nodata if event.tiff.facts is not None and event.tiff.facts.nodata is not None else 0
        for number in event.tiles:
            fetch = self.tile_fetch.get((event.read.href, number))
            data = None if fetch is None else self._bytes(fetch, number)
            try:
                place_tile(index, number, data, r0 - row_off, c0 - col_off, target, fill=fill)
            except Exception as err:
                raise ReadFailedError(f"tile {number} does not decode ({type(err).__name__}: {err})",
                                      href=event.read.href, transient=False) from None
        if covered is not None:
            covered[r0 - rows[0]:r1 - rows[0], c0 - cols[0]:c1 - cols[0]] = True

    def _bytes(self, fetch: _Fetch, number: int) -> memoryview:
        if fetch.error is not None:
            raise fetch.error
        if fetch.data is None and fetch.parts is None:
            if fetch.future is None:  # planned beyond what was issued (the decoder jumped ahead): issue it now
                self._issue(fetch)
            future = fetch.future
            assert future is not None  # issued (now or before) and not yet answered
            waited = time.perf_counter()
            try:
                answer = future.result()[0]
            except ReadFailedError as err:
                fetch.error = err
                raise
            finally:
                fetch.future = None  # the future would keep the bytes alive after they are dropped
                seconds = time.perf_counter() - waited
                if self._at_first_window():
                    record_io(self.policy.run_id, wait_seconds=seconds, first_wait_seconds=seconds)
                else:
                    record_io(self.policy.run_id, wait_seconds=seconds)
            if seconds >= MIN_WAIT_KEPT:
                record_wait(self.policy.run_id, {
                    "href": fetch.href, "bytes": fetch.length, "seconds": round(seconds, 3),
                    "asked_before": round(waited - fetch.issued_at, 3), "started_ahead": fetch.issued_ahead,
                    "first_window": self._at_first_window(), "slot_seconds": round(answer.slot_seconds, 3),
                    "request_seconds": round(answer.request_seconds, 3)})
            if answer.parts:
                self._keep(fetch, answer.parts)
            else:
                fetch.data = answer.data
        if not fetch.touched:
            fetch.touched = True
            self.ahead -= fetch.length
        if fetch.parts is not None:
            return memoryview(fetch.parts[number])
        assert fetch.data is not None
        start = int(fetch.index.offsets[number]) - fetch.start
        # a view, not a copy: the decoders take any buffer
        return memoryview(fetch.data)[start:start + int(fetch.index.byte_counts[number])]

    def _keep(self, fetch: _Fetch, pieces: Sequence[bytes]) -> None:
        """A fetch of several tiles, arrived with each tile's bytes apart (the gaps read through were dropped), so
        that each goes after the last window that needs it, not after the last window that needs any of them. A
        tile whose windows are all done already (skipped) is not kept."""
        parts = {number: piece for number, piece in zip(fetch.tiles, pieces)
                 if self.tile_left.get((fetch.href, number), 0) > 0}
        kept = sum(len(part) for part in parts.values())
        self.holding -= fetch.held - kept
        fetch.held, fetch.parts = kept, parts

    def _consume(self, event: _Event) -> None:
        if event.consumed:
            return
        event.consumed = True
        for number in event.tiles:
            key = (event.read.href, number)
            fetch = self.tile_fetch.get(key)
            if fetch is None:
                continue
            fetch.pending_tiles -= 1
            self.tile_left[key] -= 1
            if self.tile_left[key] <= 0 and fetch.parts is not None and number in fetch.parts:
                gone = len(fetch.parts.pop(number))  # this tile's last window is done: its bytes go
                fetch.held -= gone
                self.holding -= gone
            if fetch.pending_tiles <= 0:
                if not fetch.touched and (fetch.future is not None or fetch.data is not None):
                    fetch.touched = True
                    self.ahead -= fetch.length
                if fetch.future is not None:
                    fetch.future.cancel()
                if not fetch.released:
                    fetch.released = True
                    self.holding -= fetch.held
                    fetch.held = 0
                fetch.data, fetch.future, fetch.parts = None, None, None  # no later window needs its tiles

    def close(self) -> None:
        """Drop every byte the task still holds (also when it failed: nothing is kept for the next task); the most it
        held goes into the run's I/O statistics (``held_peak``, what the budget's :func:`remote_io_bytes` bounds)."""
        if self.holding_peak:
            record_io(self.policy.run_id, held_peak=self.holding_peak)
        for fetch in set(self.tile_fetch.values()):
            if fetch is not None:
                fetch.data, fetch.parts = None, None
                if fetch.future is not None:
                    fetch.future.cancel()
        self.events.clear()
        self.by_key.clear()


def _named(read: AssetRead, err: ReadFailedError) -> ReadFailedError:
    """``err`` with the item, asset and href in front of its reason, as the GDAL path words its errors."""
    if str(err).startswith("cannot "):
        return err
    return ReadFailedError(f"cannot read {read.describe()}: {err}", href=err.href or read.href, status=err.status,
                           transient=err.transient, attempts=err.attempts, unreadable=err.unreadable)


def _coalesce(href: str, url: str, index: TileIndex, numbers: list[int],
              spans: dict[tuple[str, int], list[int]]) -> list[_Fetch]:
    """The tiles ``numbers`` of one file that a task needs, as range requests: sorted by offset, a tile joins the
    request before it when the gap is at most :data:`MAX_GAP`, the request stays within :data:`MAX_REQUEST`, and
    either the same window is the first to need both, or the tile lies in the same row of tiles and the windows that
    need it follow on from the windows that need the request's tiles (``spans``: ``(href, tile)`` -> ``[first
    window, last window, ...]``).

    Why the window rules: a request's bytes are held from its first window to its last, so tiles joined across
    windows that do not follow each other would be held through the windows between them. With a task's sub-blocks
    taken across each row of them (``tasks.chunk_reduce``), a request is at most a row of the chunk's tiles per file
    (what the budget's :func:`~rasterflow.budget.remote_io_bytes` counts), and a task asks once per row of tiles and
    file instead of once per tile."""
    fetches: list[_Fetch] = []
    first_window = last_window = 0
    for number in sorted(numbers, key=lambda n: index.offsets[n]):
        start, count = int(index.offsets[number]), int(index.byte_counts[number])
        first, last = spans[(href, number)][:2]
        previous = fetches[-1] if fetches else None
        if previous is not None and 0 <= start - (previous.start + previous.length) <= MAX_GAP \
                and start + count - previous.start <= MAX_REQUEST \
                and (first == first_window or (number // index.tiles_across == previous.tiles[-1] // index.tiles_across
                                               and first <= last_window + 1)):
            previous.length = start + count - previous.start
            previous.tiles.append(number)
            first_window, last_window = min(first_window, first), max(last_window, last)
        else:
            fetches.append(_Fetch(href=href, url=url, index=index, start=start, length=count, tiles=[number]))
            first_window, last_window = first, last
    return fetches


# ---- the task's session, seen by the reader -----------------------------------------------------------------

_active = threading.local()


def active() -> TaskReads | None:
    """The :class:`TaskReads` of the task running in this thread, if any."""
    return getattr(_active, "session", None)


@contextlib.contextmanager
def task_reads(reads_by_item: Sequence[Sequence[AssetRead | None]], grid: GridPlan,
               windows: Sequence[tuple[tuple[int, int], tuple[int, int]]],
               policy: ReadPolicy) -> Iterator[TaskReads | None]:
    """Plan and run the remote reads of a task whose windows are ``windows`` (in decode order) for the reads
    ``[item][asset]`` (see :class:`TaskReads`); the reader finds it with :func:`active`. Nothing is planned (and
    None is yielded) when the job reads no remote file this path reads, or ``source.io.reader`` is ``gdal``."""
    if active() is not None or not starts_ahead(reads_by_item, policy):
        yield None
        return
    session = _AHEAD.take(_task_key(reads_by_item, windows, policy))
    if session is not None:
        session.taken_over()
    else:
        session = TaskReads(reads_by_item, grid, windows, policy)
    if session.events:
        record_io(policy.run_id, tasks=1, tasks_ahead=int(session.ahead_of_task))
    _active.session = session
    _AHEAD.started(1)
    try:
        yield session
    finally:
        _AHEAD.started(-1)
        _active.session = None
        session.close()


# ---- the next tasks' reads, started before they run ------------------------------------------------------------


TaskKey = tuple[str, int, tuple[tuple[tuple[int, int], tuple[int, int]], ...]]


def _task_key(reads_by_item: Sequence[Sequence[AssetRead | None]],
              windows: Sequence[tuple[tuple[int, int], tuple[int, int]]], policy: ReadPolicy) -> TaskKey:
    """What identifies a task's reads in a run: its files and its windows."""
    return (policy.run_id, hash(tuple(read.href if read is not None else "" for item in reads_by_item
                                      for read in item)), tuple(windows))


class _Ahead:
    """Started :class:`TaskReads` of tasks queued in this process, planned in one background thread in the order
    they were asked for, as many waiting to be taken over as tasks read this way now (the next task of every
    thread; each within ``source.io.buffer``, which the budget counts); a task finds its own with
    :meth:`take` (waiting when it is being planned; a task asked for and not yet started is planned by its task)."""

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.queue: collections.OrderedDict[TaskKey, Callable[[], TaskReads]] = collections.OrderedDict()
        self.ready: dict[TaskKey, TaskReads] = {}
        self.planning: TaskKey | None = None
        self.dropped: set[TaskKey] = set()
        self.thread: threading.Thread | None = None
        self.running = 0
        """Tasks of this process reading this way now: one started ahead for each (every thread's next task)."""

    def started(self, change: int) -> None:
        with self.condition:
            self.running += change
            self.condition.notify_all()

    def ask(self, key: TaskKey, make: Callable[[], TaskReads]) -> None:
        with self.condition:
            if key in self.queue or key in self.ready or key == self.planning:
                return
            self.queue[key] = make
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, name="rasterflow-ahead", daemon=True)
                self.thread.start()
            self.condition.notify_all()

    def take(self, key: TaskKey) -> TaskReads | None:
        with self.condition:
            self.queue.pop(key, None)  # not started: the task plans its reads itself
            while self.planning == key:
                self.condition.wait()
            session = self.ready.pop(key, None)
            self.condition.notify_all()
            return session

    def drop(self, key: TaskKey) -> None:
        with self.condition:
            self.queue.pop(key, None)
            if self.planning == key:
                self.dropped.add(key)
            session = self.ready.pop(key, None)
            self.condition.notify_all()
        if session is not None:
            session.close()

    def _loop(self) -> None:
        while True:
            with self.condition:
                while not self.queue or len(self.ready) >= max(1, self.running):
                    self.condition.wait()
                key, make = self.queue.popitem(last=False)
                self.planning = key
            session: TaskReads | None = None
            try:
                session = make()
            except Exception:  # noqa: BLE001 - the task plans its reads itself and meets the error there
                session = None
            with self.condition:
                self.planning = None
                if key in self.dropped:
                    self.dropped.discard(key)
                elif session is not None:
                    self.ready[key] = session
                    session = None
                self.condition.notify_all()
            if session is not None:
                session.close()


_AHEAD = _Ahead()


def ahead(reads_by_item: Sequence[Sequence[AssetRead | None]], grid: GridPlan,
          windows: Sequence[tuple[tuple[int, int], tuple[int, int]]],
          policy: ReadPolicy) -> Callable[[], None] | None:
    """Start the reads of a task of this process that has not started yet (the reads :func:`task_reads` would
    plan for it): its headers and its first fetches, within ``source.io.buffer``, in a background thread, one task
    ahead per task running in the process, in the order asked. The task takes them over when it starts, so it does not
    wait a round trip for its first windows. Returns the callable that drops them if the task never starts here
    (None when the task reads nothing this path reads)."""
    if not starts_ahead(reads_by_item, policy):
        return None
    key = _task_key(reads_by_item, windows, policy)
    _AHEAD.ask(key, lambda: TaskReads(reads_by_item, grid, windows, policy, ahead_of_task=True))
    return lambda: _AHEAD.drop(key)


def starts_ahead(reads_by_item: Sequence[Sequence[AssetRead | None]], policy: ReadPolicy) -> bool:
    """Whether :func:`ahead` starts anything for a task with these reads: the concurrent reader reads some of its
    files (a scheme it speaks, ``source.io.reader`` not ``gdal``, the tile decoder installed)."""
    return policy.io_reader != "gdal" and decoder_available() and any(
        read is not None and supported(read.href) for item in reads_by_item for read in item)
