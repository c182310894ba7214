"""Progress of a run's work: a rich bar on a terminal, plain lines for cron logs.

:class:`ProgressReporter` follows a set of futures (:func:`progress` is its one-call form); :class:`CountingProgress`
is fed counts instead, by writers that report finished blocks.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:  # pragma: no cover
    from distributed import Client, Future
    from rich.progress import Progress, TaskID

__all__ = ["ProgressReporter", "CountingProgress", "progress"]

_FAILED = frozenset({"error", "cancelled", "lost"})


def _futures_of(futures_or_collection: Any, client: Client | None = None) -> tuple[list[Future[Any]], Any]:
    """Futures to follow and the object to hand back (persisting a lazy collection with ``client`` if needed):
    ``futures_or_collection`` is a Future, an iterable of Futures or a Dask collection."""
    from dask.base import is_dask_collection
    from distributed import Future, futures_of

    obj = futures_or_collection
    if isinstance(obj, Future):
        return [obj], obj
    if is_dask_collection(obj):
        futures = futures_of(obj)
        if not futures:
            if client is None:
                raise TypeError("a lazy Dask collection needs a client to persist it; pass client=")
            obj = client.persist(obj)
            futures = futures_of(obj)
        return futures, obj
    futures = list(obj)
    if not all(isinstance(f, Future) for f in futures):
        raise TypeError("progress() takes a Future, a list of Futures or a Dask collection")
    return futures, futures


class ProgressReporter:
    """Reports how many of a set of futures are done, from a background thread.

    Polls the futures' own status (kept up to date by the client; no scheduler plugin, no RPC). On a terminal
    (``interactive`` None -> ``stream.isatty()``) it draws a rich progress bar; otherwise it writes plain lines such as
    ``12/48 tasks done, 25%, 3.1 s`` every ``interval`` seconds and once at the end, for cron logs.

    Use as a context manager around the code that waits for the futures, or call :meth:`wait`.
    """

    def __init__(
        self,
        futures: list[Future[Any]],
        *,
        interactive: bool | None = None,
        interval: float | None = None,
        stream: TextIO | None = None,
        label: str = "tasks",
        done_word: str = "done",
    ):
        self.futures = list(futures)
        self.done_word = done_word
        """What the count is: ``12/48 tasks done``, ``12/48 blocks written``."""
        self.stop_reason = "stopped by an error"
        """How a stopped line ends: an error, or ``interrupted by SIGINT`` (set by :meth:`__exit__`)."""
        self.stream = stream if stream is not None else sys.stdout
        if interactive is None:
            isatty = getattr(self.stream, "isatty", None)
            interactive = bool(isatty and isatty())
        self.interactive = interactive
        self.interval = float(interval if interval is not None else (0.1 if interactive else 10.0))
        self.label = label
        self.lines: list[str] = []
        """The plain lines written so far (non-interactive mode)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._bar: Progress | None = None
        self._bar_task: TaskID | None = None

    @property
    def total(self) -> int:
        return len(self.futures)

    def counts(self) -> tuple[int, int]:
        """(finished, failed) futures right now."""
        statuses = [f.status for f in self.futures]
        return sum(s == "finished" for s in statuses), sum(s in _FAILED for s in statuses)

    def format_line(self, done: int, failed: int, elapsed: float, *, stopped: bool = False) -> str:
        total = self.total
        if stopped and total == 0:  # stopped before the writer knew its block count: no "0/0 ... 100%"
            line = f"{done} {self.label} {self.done_word}, {elapsed:.1f} s"
        else:
            percent = 100 if total == 0 else int(100 * done / total)
            line = f"{done}/{total} {self.label} {self.done_word}, {percent}%, {elapsed:.1f} s"
        if failed:
            line += f", {failed} failed"
        if stopped:
            line += f", {self.stop_reason}"
        return line

    def _emit(self, done: int, failed: int, *, stopped: bool = False) -> None:
        line = self.format_line(done, failed, time.monotonic() - self._t0, stopped=stopped)
        self.lines.append(line)
        self.stream.write(line + "\n")
        self.stream.flush()

    def start(self) -> ProgressReporter:
        self._t0 = time.monotonic()
        if self.interactive:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            bar = Progress(
                TextColumn(f"[bold]{self.label}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            bar.start()
            self._bar, self._bar_task = bar, bar.add_task(self.label, total=self.total)
        self._thread = threading.Thread(target=self._loop, name="rasterflow-progress", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        poll = min(self.interval, 0.25)
        last_line = time.monotonic()
        while True:
            done, failed = self.counts()
            finished = done + failed >= self.total
            if self.interactive:
                self._update_bar(completed=done)
            elif time.monotonic() - last_line >= self.interval and not finished:
                self._emit(done, failed)
                last_line = time.monotonic()
            if finished or self._stop.wait(poll):
                return

    def _update_bar(self, **fields: Any) -> None:
        """Move the bar (interactive: :meth:`start` made it)."""
        assert self._bar is not None and self._bar_task is not None
        self._bar.update(self._bar_task, **fields)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every future is done (or ``timeout``); True if all are done."""
        if self._thread is None:
            self.start()
        assert self._thread is not None
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self, *, stopped: bool = False) -> None:
        """Stop polling and report the final count (a last plain line, or the bar's final state); ``stopped``: an
        error ended the work, and the line says so."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        done, failed = self.counts()
        if self.interactive:
            self._update_bar(completed=done)
            assert self._bar is not None
            self._bar.stop()
        else:
            self._emit(done, failed, stopped=stopped)
        self._thread = None

    def __enter__(self) -> ProgressReporter:
        return self.start()

    def __exit__(self, exc_type: object, exc: object = None, *rest: object) -> None:
        if isinstance(exc_type, type) and issubclass(exc_type, KeyboardInterrupt):  # Ctrl-C, SIGTERM: not an error
            name = getattr(exc, "signal_name", None) or "SIGINT"
            self.stop_reason = f"interrupted by {name}"
        self.stop(stopped=exc_type is not None)


class CountingProgress(ProgressReporter):
    """A :class:`ProgressReporter` fed with counts instead of futures: for writers that report finished blocks."""

    def __init__(self, *, label: str = "blocks", done_word: str = "written", **options: Any):
        super().__init__([], label=label, done_word=done_word, **options)
        self._done = 0
        self._total = 0

    def update(self, done: int, total: int) -> None:
        """Record progress; called by a writer after each block (any thread)."""
        self._done, self._total = done, total

    @property
    def total(self) -> int:
        return self._total

    def counts(self) -> tuple[int, int]:
        return self._done, 0

    def _loop(self) -> None:
        # Unlike futures, counts never announce the end: poll until stop().
        poll = min(self.interval, 0.25)
        last_line = time.monotonic()
        while not self._stop.wait(poll):
            if self.interactive:
                self._update_bar(completed=self._done, total=self._total)
            elif time.monotonic() - last_line >= self.interval:
                self._emit(self._done, 0)
                last_line = time.monotonic()


def progress(
    futures_or_collection: Any,
    client: Client | None = None,
    *,
    interactive: bool | None = None,
    interval: float | None = None,
    stream: TextIO | None = None,
    label: str = "tasks",
) -> Any:
    """Show progress until every future is done; returns the futures or the persisted collection.

    ``futures_or_collection``: a Future, an iterable of Futures or a Dask collection.

    A lazy Dask collection is persisted with ``client`` first. Failures are counted, not raised: gather the results
    to see the exception.
    """
    futures, result = _futures_of(futures_or_collection, client)
    reporter = ProgressReporter(futures, interactive=interactive, interval=interval, stream=stream, label=label)
    with reporter:
        reporter.wait()
    return result
