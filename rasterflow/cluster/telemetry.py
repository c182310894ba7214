"""Memory telemetry for the run report: per-worker RSS, managed and spilled bytes over time, and stage marks.

:class:`MemorySampler` samples every worker (and this client process) from a background thread;
:func:`process_peak_since_sample` reads this process's peak since the last sample, for what the client does after
the sampler has stopped.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # pragma: no cover
    from distributed import Client, Worker

__all__ = ["MemorySampler", "process_peak_since_sample", "CLIENT", "IN_PROCESS"]

log = logging.getLogger(__name__)

CLIENT = "client"
"""The ``worker`` value of :class:`MemorySampler` samples taken in the client (driver) process."""

IN_PROCESS = "process"
"""The ``worker`` value of :class:`MemorySampler` samples of a worker that runs in this process (a one-process run):
the whole process's memory, client and scheduler included, so no separate client sample is taken."""


def _make_worker_probe(track_peaks: bool) -> Callable[[Worker], dict[str, int]]:
    """The function :class:`MemorySampler` runs in each worker.

    Defined as a closure so cloudpickle ships it by value: a remote cluster's workers need not have rasterflow.
    """

    def probe(dask_worker: Worker) -> dict[str, int]:
        import os
        import re

        import psutil

        rss = psutil.Process().memory_info().rss
        peak = rss
        if track_peaks:
            # Linux: VmHWM is the highest RSS since the last reset; writing "5" to clear_refs resets it to the
            # current RSS, so each sample also carries the peak of the interval since the previous one.
            try:
                with open("/proc/self/status") as status:
                    match = re.search(r"VmHWM:\s+(\d+)\s+kB", status.read())
                if match:
                    peak = max(rss, int(match.group(1)) * 1024)
                with open("/proc/self/clear_refs", "w") as clear:
                    clear.write("5")
            except OSError:
                pass
        data = dask_worker.data
        try:
            spilled, _disk = data.spilled_total  # type: ignore[attr-defined]  # a SpillBuffer's; a dict has none
        except AttributeError:  # spilling disabled: a plain dict
            spilled = 0
        metrics = getattr(data, "cumulative_metrics", None) or {}
        written = int(metrics.get(("disk-write", "bytes"), 0))
        return {
            "rss": int(rss),
            "rss_peak": int(peak),
            "managed": int(dask_worker.state.nbytes),
            "spilled": int(spilled),
            "spill_written": written,
            "pid": os.getpid(),
        }

    return probe


def process_peak_since_sample(reset: bool = True) -> int | None:
    """This process's highest RSS since the memory sampler's last sample of it (Linux ``VmHWM``, which each sample
    resets), in bytes; None where the kernel does not keep it. ``reset`` starts the next interval now.

    What the client does after the sampler has stopped (the STAC item's statistics pass, after the cluster is
    closed) is then still counted in the report."""
    import re

    try:
        with open("/proc/self/status") as status:
            match = re.search(r"VmHWM:\s+(\d+)\s+kB", status.read())
        if reset:
            with open("/proc/self/clear_refs", "w") as clear:
                clear.write("5")
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


class MemorySampler:
    """Samples memory in every worker (and in this client process) from a background thread.

    Every ``interval`` seconds it calls the workers through ``client.run`` (the probe runs on each worker's event
    loop, not in its task threads, so it answers while tasks compute). That is more precise than the scheduler's
    copy of the worker metrics, which is up to one heartbeat old (0.5 s or more, growing with the cluster); and
    on Linux each sample also carries the interval's RSS high-water mark (``VmHWM``, reset after each read), so a
    peak that comes and goes between two samples is still seen.

    A worker that runs in this process (a one-process run) is sampled as :data:`IN_PROCESS`, the whole process,
    and then no separate client sample is taken: it would be the same process counted twice.

    Each sample is a dict: ``t`` (seconds since start), ``worker`` (address, ``"process"`` or ``"client"``), ``rss`` (process
    RSS now), ``rss_peak`` (highest RSS since the previous sample), ``managed`` (bytes Dask tracks), ``spilled``
    (sizeof of the data currently spilled to disk), ``spill_written`` (bytes ever written to disk by spilling).
    """

    def __init__(self, client: Client, interval: float = 0.25, *, track_peaks: bool = True, sample_client: bool = True):
        self.client = client
        self.interval = float(interval)
        self.track_peaks = track_peaks
        self.sample_client = sample_client
        self.samples: list[dict[str, Any]] = []
        self.marks: list[tuple[float, str]] = []
        self.errors = 0
        self._probe = _make_worker_probe(track_peaks)
        self._t0: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _now(self) -> float:
        if self._t0 is None:
            self._t0 = time.monotonic()
        return time.monotonic() - self._t0

    def mark(self, stage: str) -> None:
        """Record that ``stage`` starts now, for the report's stage boundaries."""
        with self._lock:
            self.marks.append((round(self._now(), 4), str(stage)))

    def sample(self) -> None:
        """Take one sample of every worker and the client now."""
        import psutil

        before = self._now()
        results = self.client.run(self._probe, on_error="return")
        t = round((before + self._now()) / 2, 4)
        rows: list[dict[str, Any]] = []
        in_process = False
        for worker, result in sorted(results.items()):
            if isinstance(result, BaseException):
                self.errors += 1
                continue
            pid = result.pop("pid", None)
            if pid == os.getpid():  # a worker in this process: the sample is the whole process's
                worker, in_process = IN_PROCESS, True
            rows.append({"t": t, "worker": worker, **result})
        if self.sample_client and not in_process:
            rss = psutil.Process().memory_info().rss
            high = process_peak_since_sample() if self.track_peaks else None  # a spike between two samples
            rows.append({"t": t, "worker": CLIENT, "rss": rss, "rss_peak": max(rss, high or 0), "managed": 0,
                         "spilled": 0, "spill_written": 0})
        with self._lock:
            self.samples.extend(rows)

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            if getattr(self.client, "status", "running") in ("closing", "closed"):
                return
            try:
                self.sample()
            except Exception as exc:  # a worker leaving, the client closing: keep going, count it
                self.errors += 1
                log.debug("memory sample failed: %s", exc)
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def start(self) -> MemorySampler:
        if self._thread is not None:
            return self
        self._now()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="rasterflow-memory-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and take a last sample."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        try:
            self.sample()
        except Exception as exc:
            self.errors += 1
            log.debug("final memory sample failed: %s", exc)

    def __enter__(self) -> MemorySampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def workers(self) -> list[str]:
        """Worker addresses seen, in first-seen order (the client excluded)."""
        seen: dict[str, None] = {}
        for s in self.samples:
            if s["worker"] != CLIENT:
                seen.setdefault(s["worker"], None)
        return list(seen)

    def peak_per_worker(self) -> dict[str, int]:
        """Highest RSS seen per worker (interval high-water marks included), in bytes."""
        peaks: dict[str, int] = {}
        for s in self.samples:
            if s["worker"] != CLIENT:
                peaks[s["worker"]] = max(peaks.get(s["worker"], 0), s["rss"], s.get("rss_peak", 0))
        return peaks

    def client_peak(self) -> int:
        """Highest RSS seen in the client process (interval high-water marks included)."""
        return max((max(s["rss"], s.get("rss_peak", 0)) for s in self.samples if s["worker"] == CLIENT), default=0)

    def spilled_bytes_total(self) -> int:
        """Bytes spilled to disk while sampling, summed over workers.

        From each worker's cumulative disk-write counter (bytes written, after compression; growth between its first
        and last sample); where that counter does not move, the most data (sizeof) seen spilled at once.
        """
        total = 0
        for worker in self.workers():
            rows = [s for s in self.samples if s["worker"] == worker]
            written = rows[-1].get("spill_written", 0) - rows[0].get("spill_written", 0)
            total += written if written > 0 else max(s.get("spilled", 0) for s in rows)
        return int(total)
