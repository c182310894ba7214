"""Sizing Dask workers on one node (DOMAIN.md, "Sizing workers on one node"): pure arithmetic.

Shared by the static budget check (which must know the per-worker limit before anything starts) and by
``rasterflow.cluster`` (which starts the LocalCluster with exactly these numbers).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rasterflow.units import parse_bytes

__all__ = ["MachineInfo", "WorkerLayout", "local_machine", "size_local_cluster", "size_one_process", "size_local_run",
           "RESERVE_FRACTION", "MIN_WORKER_BYTES"]

RESERVE_FRACTION = 0.20
"""Share of RAM kept for the OS, the page cache (GDAL's remote reads lean on it) and the filesystem."""
RESERVE_MIN_BYTES = 1 * 2**30
RESERVE_MAX_BYTES = 16 * 2**30
MIN_WORKER_BYTES = 1 * 2**30
"""Below ~1 GB per worker, start fewer workers instead (DOMAIN.md)."""


@dataclass(frozen=True)
class MachineInfo:
    """What the node has."""

    cores: int
    memory_bytes: int


@dataclass(frozen=True)
class WorkerLayout:
    """How many workers, how many threads each, and each one's memory limit."""

    n_workers: int
    threads_per_worker: int
    memory_limit: int
    source: str
    """Where the numbers came from: "local" (sized here) or the scheduler address."""
    processes: bool = True
    """False: no worker processes; the run's own process is the one worker (its threads run the tasks, its memory
    limit is the process's). True: worker processes (a LocalCluster's, or those of an existing cluster)."""

    @property
    def total_threads(self) -> int:
        return self.n_workers * self.threads_per_worker


def local_machine() -> MachineInfo:
    """Cores usable by this process and physical memory (cgroup limits are respected when psutil is there)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for cgroup_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(cgroup_file) as handle:
                text = handle.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < memory:
            memory = int(text)
    return MachineInfo(cores=max(1, cores), memory_bytes=int(memory))


def reserve_bytes(memory_bytes: int) -> int:
    """Memory left to the OS and page cache: 20% of RAM, clamped to [1 GiB, 16 GiB]."""
    return int(min(max(memory_bytes * RESERVE_FRACTION, RESERVE_MIN_BYTES), RESERVE_MAX_BYTES))


def size_local_cluster(
    machine: MachineInfo,
    *,
    n_workers: int | str = "auto",
    threads_per_worker: int = 1,
    memory_limit: int | str = "auto",
) -> WorkerLayout:
    """Size a LocalCluster: usable = RAM - reserve; per worker = usable / n_workers; never below 1 GB per worker.

    Parameters
    ----------
    machine
        The node's cores and memory.
    n_workers, threads_per_worker, memory_limit
        As in the spec's ``cluster`` section; ``"auto"`` is sized here.
    """
    usable = max(machine.memory_bytes - reserve_bytes(machine.memory_bytes), MIN_WORKER_BYTES)
    fixed_limit = None if memory_limit == "auto" else parse_bytes(memory_limit)
    if n_workers == "auto":
        workers = max(1, machine.cores // threads_per_worker)
        if fixed_limit is not None:
            workers = max(1, min(workers, usable // fixed_limit))
        else:
            workers = max(1, min(workers, usable // MIN_WORKER_BYTES))
    else:
        workers = int(n_workers)
    limit = fixed_limit if fixed_limit is not None else usable // workers
    return WorkerLayout(n_workers=workers, threads_per_worker=threads_per_worker, memory_limit=int(limit), source="local")


def size_one_process(machine: MachineInfo, *, threads: int, memory_limit: int | str = "auto") -> WorkerLayout:
    """One process runs the job (``cluster.processes: false``): one worker of ``threads`` threads, in the run's
    own process, whose limit is ``memory_limit`` (``"auto"``: RAM - reserve; one process holds one interpreter, not
    one per worker, so nothing is split)."""
    usable = max(machine.memory_bytes - reserve_bytes(machine.memory_bytes), MIN_WORKER_BYTES)
    limit = usable if memory_limit == "auto" else parse_bytes(memory_limit)
    return WorkerLayout(n_workers=1, threads_per_worker=max(1, int(threads)), memory_limit=int(limit), source="local",
                        processes=False)


def size_local_run(
    machine: MachineInfo,
    *,
    n_workers: int | str = "auto",
    threads_per_worker: int = 1,
    memory_limit: int | str = "auto",
    processes: bool | str = "auto",
) -> WorkerLayout:
    """The layout a run on this machine starts with, as ``cluster.processes`` says.

    ``True``: worker processes (:func:`size_local_cluster`). ``False``: one process with as many threads as those
    workers would have in all (``n_workers x threads_per_worker``) and ``memory_limit`` as its own limit
    (:func:`size_one_process`). ``"auto"``: one process when ``n_workers`` is ``"auto"`` (a number of workers is a
    request for worker processes); the run falls back to worker processes when the job's budget does not fit one
    process (:func:`rasterflow.cluster.process_fallback`).
    """
    layout = size_local_cluster(machine, n_workers=n_workers, threads_per_worker=threads_per_worker,
                                memory_limit=memory_limit)
    if processes is True or (processes == "auto" and n_workers != "auto"):
        return layout
    return size_one_process(machine, threads=layout.total_threads, memory_limit=memory_limit)
