"""Where a writer's units go on worker processes when their reads can start ahead (:func:`places_units`): each unit
to the worker with the fewest units in flight per thread, its reads started in that worker's process first
(:class:`Placement`). :func:`rasterflow.write.submit.run_units` asks for it with ``one_task_per_unit`` (the fused
path: a chunk as one task) or ``place_reads`` (the tree path: every task of a chunk).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rasterflow.layers import drop_here, prefetch_here

if TYPE_CHECKING:  # pragma: no cover
    from distributed import Client

    from rasterflow.write.submit import Batch, UnitFeed

__all__ = ["Placement", "places_units", "in_this_process"]

Key = tuple[Any, ...]


class Placement:
    """Where the units of a run on worker processes go when their reads can start ahead: each unit to the worker
    with the fewest units in flight per thread, its reads started in that worker's process first
    (:func:`rasterflow.layers.prefetch_here` through ``Client.run``), so that its thread does not wait a round trip
    when it starts. A worker runs its queued tasks in an order of its own, so at most one unit waits per worker
    thread (the feed's ``max_units``): the unit whose reads were started is the one that runs next; with
    ``whole_units`` (each unit one task) also at least one (the feed's ``min_units``), however many blocks a unit
    holds, so that a series' band task of 12 dates still has a successor queued with its reads started. The unit may
    still run elsewhere if its worker leaves (a loose restriction), and then starts its own reads."""

    def __init__(self, client: Client, feed: UnitFeed, whole_units: bool = False):
        self.client, self.feed, self.whole_units = client, feed, whole_units
        self.threads: dict[str, int] = {}
        self.load: dict[str, int] = {}
        self.placed: dict[int, str] = {}  # unit in flight -> the worker its reads were started on
        self.token = f"rasterflow-ahead-{uuid.uuid4().hex}"
        self.started_on: set[str] = set()
        self.follow()

    def follow(self) -> None:
        """Take the workers there now (an adaptive cluster's come and go; the client's view, refreshed by
        distributed in the background) and let the feed's limit follow their threads."""
        current = self.client.scheduler_info().get("workers") or {}
        for address, info in current.items():
            if str(address) not in self.threads:
                self.threads[str(address)] = max(1, int((info or {}).get("nthreads") or 1))
                self.load[str(address)] = 0
        for address in [a for a in self.load if a not in current and not self.load[a]]:
            del self.load[address], self.threads[address]
        self.feed.max_units = 2 * max(1, sum(self.threads.values()))
        if self.whole_units:  # each unit one task: a queued one holds only its started reads, whatever its blocks
            self.feed.min_units = self.feed.max_units

    def place(self, number: int, built: Batch) -> str | None:
        """The worker unit ``number`` goes to, its reads started there; None: anywhere (nothing to start, or the
        worker could not be asked)."""
        calls = built.prefetchable()
        if not calls:
            return None
        self.follow()
        if not self.load:
            return None
        address = min(self.load, key=lambda a: self.load[a] / self.threads[a])
        try:
            self.client.run(prefetch_here, self.token, calls, workers=[address])
        except Exception:  # noqa: BLE001 - e.g. the worker left: the task starts its own reads wherever it runs
            return None
        self.started_on.add(address)
        self.load[address] += 1
        self.placed[number] = address
        return address

    def finished(self, number: int) -> None:
        """Unit ``number`` finished: its worker has a place more."""
        address = self.placed.pop(number, None)
        if address is not None and address in self.load:
            self.load[address] -= 1

    def close(self) -> None:
        """Drop, in every worker used, the reads no task took over (a failed or cancelled run's)."""
        if self.started_on:
            try:
                self.client.run(drop_here, self.token, workers=sorted(self.started_on))
            except Exception:  # noqa: BLE001 - a worker that left took its reads with it
                pass


def places_units(client: Client, build: Callable[[Sequence[Key]], Batch], first: Sequence[Key]) -> bool:
    """Whether :func:`~rasterflow.write.submit.run_units` with ``one_task_per_unit`` or ``place_reads`` sends each unit to a worker it picks,
    the unit's reads started there first: ``client``'s workers are processes of their own (in this process the
    writer starts the reads itself) and the first unit's reads can start ahead (remote files the concurrent reader
    reads)."""
    workers = client.scheduler_info().get("workers") or {}
    if not workers or in_this_process(workers):
        return False
    return bool(build(first).prefetchable())


def in_this_process(workers: Mapping[str, object]) -> bool:
    """Whether every one of these workers (addresses) runs in this process (the one-process layout)."""
    return all(str(address).startswith("inproc://") for address in workers)
