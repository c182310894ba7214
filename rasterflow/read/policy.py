"""The read policy of a run on the workers, and the read statistics that come back from them.

:class:`ReadPolicy` is what every read of a run obeys: the retry policy, ``on_read_error`` (``fail`` | ``nodata``),
the signer, the GDAL options. It travels inside every task (:attr:`rasterflow.read.ReadJob.policy`, from
:attr:`rasterflow.planning.JobPlan.read_policy`), so runs sharing one cluster never see each other's; no worker
holds a run's policy. :func:`set_policy` sets the policy of this process's own reads outside tasks (the
run's client, ``rasterflow profile``), restored when the run ends.

Each worker process counts, per run, the retries per href and every read that failed for good
(:func:`record_retry`, :func:`record_failure`; thread-safe). When the computation ends, successful or not, the
client collects and clears those counts with ``Client.run`` (one call per worker, so nothing is capped as in an
event log) and :func:`summarize` merges them into a :class:`ReadSummary` for the run report. The first failure of
an href in a worker is also logged with the scheduler (``Worker.log_event``), so a worker lost before the end
still has its holes reported. An href that failed for good fails at once in the later windows of that worker
(:func:`failed_before`): no second round of retries against a server that is down, and with ``nodata`` the file
is missing from all of that worker's windows. With ``nodata``, :func:`check_quota` fails the run when the share of
the job's files that failed exceeds ``max_failed_fraction``.

Two runs on one shared cluster at the same time read under their own policies (each task carries its run's) and
their statistics stay apart (keyed by ``run_id``).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from rasterflow.errors import RunFailedError
from rasterflow.gdalenv import aws_env_summary
from rasterflow.readplan import ReadPolicy, io_concurrency, policy_from_spec  # noqa: F401  (defined below the reader)

if TYPE_CHECKING:  # pragma: no cover
    from distributed import Client

    from rasterflow.planning import JobPlan
    from rasterflow.report import RunReport
    from rasterflow.sources import AssetRead

__all__ = [
    "ReadPolicy", "FailedRead", "ReadSummary", "set_policy", "current_policy", "record_retry", "record_failure",
    "record_wait", "LONGEST_WAITS",
    "failed_before",
    "collect", "summarize", "check_quota", "read_monitor", "ReadMonitor", "policy_from_spec", "job_hrefs",
]


# ---- the policy in this process -------------------------------------------------------------------------------

_POLICY: ReadPolicy | None = None


def set_policy(policy: ReadPolicy | None) -> None:
    """Make ``policy`` the one this process's reads obey (None: the defaults)."""
    global _POLICY
    _POLICY = policy


def current_policy() -> ReadPolicy:
    return _POLICY or ReadPolicy()


# ---- statistics in this process -------------------------------------------------------------------------------

_LOCK = threading.Lock()
_STATS: dict[str, dict[str, Any]] = {}


def _run_stats(run_id: str) -> dict[str, Any]:
    return _STATS.setdefault(run_id, {"retries": {}, "failed": {}})


IO_COUNTERS = ("requests", "bytes", "header_reads", "request_seconds", "wait_seconds", "first_wait_seconds",
               "tasks", "tasks_ahead")
"""Summed over processes: requests and bytes fetched, headers read, seconds requests took, seconds the compute
threads waited for bytes (``first_wait_seconds``: of that, before a task's first window), tasks that read this way
and, of them, tasks whose reads had been started before they ran (``source.io`` prefetching the next task)."""


IO_PEAKS = ("in_flight_peak", "held_peak")
"""I/O statistics that keep their largest value (per process; across processes too)."""


def record_io(run_id: str, *, in_flight: int = 0, held_peak: int = 0, **counts: float) -> None:
    """Add ``counts`` (:data:`IO_COUNTERS`) to this process's I/O statistics of ``run_id``; ``in_flight``: the
    requests in flight when one started, ``held_peak``: the most compressed bytes one task held (the peaks are
    kept)."""
    with _LOCK:
        io = _run_stats(run_id).setdefault("io", {})
        for key, value in counts.items():
            io[key] = io.get(key, 0) + value
        if in_flight:
            io["in_flight_peak"] = max(io.get("in_flight_peak", 0), in_flight)
        if held_peak:
            io["held_peak"] = max(io.get("held_peak", 0), held_peak)


LONGEST_WAITS = 5
"""Waits for bytes a run's report keeps one by one (the longest, across processes): enough to tell a slow file or
request from a read asked for late, without a log of every wait."""


def record_wait(run_id: str, wait: dict[str, Any]) -> None:
    """Offer one wait of a compute thread for its bytes (``wait["seconds"]`` and what it waited for) to this
    process's :data:`LONGEST_WAITS` longest of ``run_id``."""
    with _LOCK:
        io = _run_stats(run_id).setdefault("io", {})
        kept: list[dict[str, Any]] = io.setdefault("longest_waits", [])
        if len(kept) >= LONGEST_WAITS and wait["seconds"] <= kept[-1]["seconds"]:
            return
        kept.append(wait)
        kept.sort(key=lambda each: -each["seconds"])
        del kept[LONGEST_WAITS:]


def record_retry(policy: ReadPolicy, href: str) -> None:
    """One more try of ``href`` (counted per href)."""
    with _LOCK:
        retries = _run_stats(policy.run_id)["retries"]
        retries[href] = retries.get(href, 0) + 1


def record_failure(policy: ReadPolicy, read: AssetRead, error: BaseException) -> None:
    """``read`` (an :class:`~rasterflow.sources.AssetRead`) failed for good with ``error``; counted per href."""
    with _LOCK:
        failed = _run_stats(policy.run_id)["failed"]
        entry = failed.get(read.href)
        if entry is None:
            entry = failed[read.href] = {
                "item_id": read.item_id, "asset": read.name, "href": read.href, "error": str(error),
                "status": getattr(error, "status", None), "attempts": int(getattr(error, "attempts", 1)),
                "windows": 1,
            }
            _log_event(policy, dict(entry))
        else:
            entry["windows"] += 1
            entry["attempts"] = max(entry["attempts"], int(getattr(error, "attempts", 1)))


def failed_before(policy: ReadPolicy, href: str) -> dict[str, Any] | None:
    """The record of ``href`` when a read of it already failed for good in this process during this run."""
    with _LOCK:
        entry = _STATS.get(policy.run_id, {}).get("failed", {}).get(href)
        return None if entry is None else dict(entry)


def _topic(policy: ReadPolicy) -> str:
    return f"rasterflow-failed-reads-{policy.run_id}"


def _log_event(policy: ReadPolicy, entry: dict[str, Any]) -> None:
    """Also tell the scheduler at once (first failure of an href in this process): a worker that dies later
    takes its counts with it, but a hole it left in the output must still be reported."""
    if "distributed" not in sys.modules:
        return
    from distributed import get_worker

    try:
        get_worker().log_event(_topic(policy), entry)
    except ValueError:  # not inside a worker
        pass


def collect(run_id: str) -> dict[str, Any]:
    """This process's statistics of ``run_id`` (removed here: each is collected once)."""
    with _LOCK:
        return _STATS.pop(run_id, {"retries": {}, "failed": {}})


def merge_io(parts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The I/O statistics of several processes: counters summed, the in-flight peak the largest (per process), the
    :data:`LONGEST_WAITS` longest waits of them all."""
    total: dict[str, Any] = {}
    waits: list[dict[str, Any]] = []
    for part in parts:
        io = part.get("io") or {}
        for key, value in io.items():
            if key == "longest_waits":
                waits.extend(value)
                continue
            total[key] = max(total.get(key, 0), value) if key in IO_PEAKS else total.get(key, 0) + value
    if waits:
        total["longest_waits"] = sorted(waits, key=lambda each: -each["seconds"])[:LONGEST_WAITS]
    for key in ("request_seconds", "wait_seconds", "first_wait_seconds"):
        if key in total:
            total[key] = round(float(total[key]), 3)
    return total


# ---- on the client ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FailedRead:
    """A file that could not be read (after its retries)."""

    item_id: str
    asset: str
    href: str
    error: str
    status: int | None
    attempts: int
    """Tries of its last failing read."""
    windows: int
    """How many task windows it failed in."""


@dataclass(frozen=True)
class ReadSummary:
    """The reads of a run, over all workers."""

    files: int
    """Distinct files the job reads."""
    failed: tuple[FailedRead, ...] = ()
    retries: dict[str, int] = field(default_factory=dict)
    """href -> retries made (files read without a retry are left out)."""
    policy: ReadPolicy = field(default_factory=ReadPolicy)
    io: dict[str, Any] = field(default_factory=dict)
    """The concurrent remote path's requests, bytes, header reads, in-flight peak (per process) and the seconds
    the compute threads waited for bytes (:func:`merge_io`); empty when no file was read that way."""

    @property
    def failed_fraction(self) -> float:
        return len(self.failed) / self.files if self.files else 0.0

    @property
    def total_retries(self) -> int:
        return sum(self.retries.values())

    def exceeded(self) -> bool:
        """Whether the failures are more than the policy allows."""
        if not self.failed:
            return False
        return self.policy.on_read_error == "fail" or self.failed_fraction > self.policy.max_failed_fraction

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "failed_count": len(self.failed),
            "failed_fraction": round(self.failed_fraction, 6),
            "failed": [asdict(f) | {"retries": self.retries.get(f.href, 0)} for f in self.failed],
            "retried_files": len(self.retries),
            "total_retries": self.total_retries,
            "retries": dict(sorted(self.retries.items())),
            "policy": self.policy.as_dict(),
            "io": dict(self.io),
        }

    def quota_message(self) -> str:
        """Why the run failed: the share, the quota and every failed file."""
        lines = [f"{len(self.failed)} of {self.files} source files ({self.failed_fraction:.1%}) could not be read, "
                 f"more than source.max_failed_fraction ({self.policy.max_failed_fraction:g}) allows:"]
        lines += [f"  {f.error}" for f in self.failed]
        lines.append("Fix or drop those items, or raise source.max_failed_fraction to accept the holes")
        return "\n".join(lines)


def summarize(parts: Iterable[dict[str, Any]], files: int, policy: ReadPolicy,
              events: Iterable[dict[str, Any]] = ()) -> ReadSummary:
    """Merge the statistics collected from each process; ``events`` (failures the workers logged with the
    scheduler) add the hrefs of workers that were lost before their statistics were collected."""
    retries: dict[str, int] = {}
    failed: dict[str, dict[str, Any]] = {}
    parts = list(parts)
    for part in parts:
        for href, n in part.get("retries", {}).items():
            retries[href] = retries.get(href, 0) + int(n)
        for href, entry in part.get("failed", {}).items():
            kept = failed.get(href)
            if kept is None:
                failed[href] = dict(entry)
            else:
                kept["windows"] += entry["windows"]
                kept["attempts"] = max(kept["attempts"], entry["attempts"])
    for entry in events:
        if isinstance(entry, dict) and entry.get("href") and entry["href"] not in failed:
            failed[entry["href"]] = dict(entry)
    names = {f.name for f in fields(FailedRead)}  # the scheduler adds "worker" to an event
    rows = tuple(FailedRead(**{k: v for k, v in failed[href].items() if k in names}) for href in sorted(failed))
    return ReadSummary(files=files, failed=rows, retries=retries, policy=policy, io=merge_io(parts))


def check_quota(summary: ReadSummary) -> None:
    """With ``nodata``: :class:`RunFailedError` when more files failed than ``max_failed_fraction`` allows."""
    if summary.policy.on_read_error == "nodata" and summary.exceeded():
        raise RunFailedError(summary.quota_message())


class ReadMonitor:
    """What :func:`read_monitor` yields: :meth:`check` fails the run as soon as the quota is exceeded."""

    CHECK_EVERY = 0.5
    """Seconds between two looks at the scheduler's failure events while blocks complete."""

    def __init__(self, client: Client | None, policy: ReadPolicy, files: int):
        self.client, self.policy, self.files = client, policy, files
        self._last = 0.0

    def failures(self) -> list[dict[str, Any]]:
        """The failures the workers logged with the scheduler so far (first per href and worker)."""
        if self.client is None:
            return []
        return [message for _, message in self.client.get_events(_topic(self.policy))]

    def check(self, done: int = 0, total: int = 0) -> None:
        """Called as blocks complete (the writer's progress): with ``nodata``, raise :class:`RunFailedError` once
        more files failed than allowed, so the run stops early and the writer never commits an output with more
        holes than the quota; always looked at when the last block is done (before the writer commits)."""
        import time

        if self.policy.on_read_error != "nodata" or self.client is None:
            return
        now = time.monotonic()
        if not (total and done >= total) and now - self._last < self.CHECK_EVERY:
            return
        self._last = now
        summary = summarize([], self.files, self.policy, self.failures())
        check_quota(summary)


@contextlib.contextmanager
def read_monitor(client: Client | None, policy: ReadPolicy, hrefs: Iterable[str],
                 report: RunReport | None = None) -> Iterator[ReadMonitor]:
    """Around a run's computation: the policy on every worker (and in this process) before it, the statistics
    collected after it into ``report.reads`` (also when it fails), then the failure quota checked.

    ``client`` may be None (reads in this process only). The signer is looked up first, so a missing package is
    an error before any task runs. The :class:`ReadMonitor` yielded checks the quota while blocks complete.
    """
    from rasterflow.read.signing import get_signer

    if policy.sign:
        get_signer(policy.sign)
    files = len(set(hrefs))
    previous = _POLICY
    set_policy(policy)
    plugin_name = f"rasterflow-process-env-{policy.run_id}"
    if client is not None:  # the policy itself travels inside each task (ReadJob.policy), never per worker
        from rasterflow.read.worker import ProcessEnvPlugin

        client.register_plugin(ProcessEnvPlugin(), name=plugin_name)
    if report is not None:
        report.gdal_options = {"reads": policy.gdal_options(), "aws_env": aws_env_summary()}
    summary = None
    monitor = ReadMonitor(client, policy, files)
    try:
        yield monitor
    finally:
        parts, events = [collect(policy.run_id)], []
        if client is not None:
            with contextlib.suppress(Exception):
                events = monitor.failures()
            try:
                # on_error="ignore": a worker lost at the end costs its own counts, not the others'
                parts += [part for part in client.run(collect, policy.run_id, on_error="ignore").values()
                          if isinstance(part, dict)]
            except Exception:  # the scheduler itself gone: the run's own error says more
                pass
            with contextlib.suppress(Exception):
                client.unregister_worker_plugin(plugin_name)
        set_policy(previous)
        summary = summarize(parts, files, policy, events)
        if report is not None:
            report.reads = summary.to_dict()
    check_quota(summary)


def job_hrefs(plan: JobPlan) -> list[str]:
    """Every distinct href a plan's tasks read (``plan.sources``), in order."""
    sources = getattr(plan, "sources", None)
    if sources is None:
        return []
    return list(dict.fromkeys(read.href for item in sources.reads for read in item if read is not None))
