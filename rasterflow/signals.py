"""Stop a run cleanly on SIGINT, SIGTERM and SIGHUP (what a terminal, cron wrappers, systemd and Kubernetes send).

A handler raises :class:`~rasterflow.errors.RunInterrupted` in the main thread, so the run unwinds through its
``finally`` blocks: the writers delete their temporary files (or keep a resumable Zarr staging store), the cluster is
shut down, the report is written with status ``interrupted``. Once the output is being committed (every block is
computed, the writer only renames), a signal is only *recorded*: the run finishes, and an output that was committed is
reported as a success, never as a failure.

Stdlib only; installing handlers is opt-in (the CLI does it; the Python API only when asked), because a library must
not take over the signals of an Airflow worker or a notebook.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from types import FrameType
from typing import Any

from rasterflow.errors import RunInterrupted

__all__ = ["Interrupts", "HANDLED_SIGNALS"]

HANDLED_SIGNALS: tuple[signal.Signals, ...] = tuple(
    s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP")) if s is not None
)


class Interrupts:
    """The run's signal state: install handlers, defer signals while the output is committed, read what arrived.

    Attributes
    ----------
    received : int or None
        The first signal number received, whether it interrupted the run or arrived while deferred.
    deferring : bool
        While true a signal is recorded instead of raised.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self.deferring = False
        self._saved: dict[int, Any] = {}
        self._saved_hook: Any = None

    # ---- handlers -----------------------------------------------------------------------------------------------

    def _handler(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
        if self.deferring:
            return
        _quiet_teardown_loggers()
        raise RunInterrupted(signum)

    def install(self) -> Interrupts:
        """Install the handlers (main thread only; elsewhere this is a no-op, as Python allows nothing else), and
        an unraisable hook that keeps quiet about the handler's exception when Python swallows it (raised inside a
        finalizer or a garbage-collector callback, e.g. distributed's GC diagnosis): :meth:`check` raises it again
        where the run sees it, and the user's terminal gets the run's own line, not a traceback."""
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in HANDLED_SIGNALS:
            self._saved[sig] = signal.signal(sig, self._handler)
        self._saved_hook = sys.unraisablehook
        previous = self._saved_hook

        def quiet_about_interrupts(unraisable: Any) -> None:
            if isinstance(unraisable.exc_value, RunInterrupted):
                return
            previous(unraisable)

        sys.unraisablehook = quiet_about_interrupts
        return self

    def restore(self) -> None:
        """Put back the handlers and the unraisable hook that were there before :meth:`install`."""
        for sig, previous in self._saved.items():
            signal.signal(sig, previous)
        self._saved.clear()
        if self._saved_hook is not None:
            sys.unraisablehook = self._saved_hook
            self._saved_hook = None

    def __enter__(self) -> Interrupts:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.restore()

    # ---- used by the run ----------------------------------------------------------------------------------------

    def defer(self) -> None:
        """From now on only record signals (the output is being committed)."""
        self.deferring = True

    def check(self) -> None:
        """Raise :class:`RunInterrupted` for a signal that arrived while not deferring and whose exception never
        reached the run: a handler's exception raised inside a finalizer (an object's ``__del__``, such as a
        distributed ``Future`` released by the garbage collector) or a callback is printed and swallowed by Python,
        and the run would go on to finish with exit 0. The run calls this after every finished block."""
        if self.received is not None and not self.deferring:
            raise RunInterrupted(self.received)

    def resume(self) -> None:
        """Raise on signals again; a signal that arrived while deferred is raised now."""
        self.deferring = False
        if self.received is not None:
            raise RunInterrupted(self.received)

    def note(self, exc: BaseException) -> None:
        """Record the signal behind an exception (a ``KeyboardInterrupt`` raised by Python's own SIGINT handler)."""
        if self.received is None:
            if isinstance(exc, RunInterrupted):
                self.received = exc.signum
            elif isinstance(exc, KeyboardInterrupt):
                self.received = int(signal.SIGINT)


# Loggers that report callbacks failing while an interrupted client tears down its event loop (e.g. distributed's
# ``sync`` cancel callback: "NameError: cannot access free variable 'future'", tornado.application). The run's own
# line says what happened; these tracebacks would only bury it.
_TEARDOWN_LOGGERS = ("tornado.application", "asyncio", "distributed.client", "distributed.utils")


def _quiet_teardown_loggers() -> None:
    for name in _TEARDOWN_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def start_resource_tracker_deaf_to_hangups() -> None:
    """Start multiprocessing's resource tracker now, with SIGHUP blocked in it.

    The tracker (a helper process the workers' semaphores register with) ignores SIGINT and SIGTERM by itself, but
    not SIGHUP: when a terminal closes, the whole session gets SIGHUP, the tracker dies and prints a traceback per
    semaphore. A signal mask is inherited by the spawned process and kept across exec, so blocking SIGHUP while it
    is spawned makes it deaf to hangups; here a hangup during the spawn stays pending and is delivered on unblock.
    """
    sighup = getattr(signal, "SIGHUP", None)
    if sighup is None or threading.current_thread() is not threading.main_thread():
        return
    from multiprocessing import resource_tracker

    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {sighup})
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
