"""The Dask cluster a run computes on: a sized LocalCluster, or an existing scheduler.

Three jobs, each small:

- :func:`open_cluster` starts a ``LocalCluster`` with exactly the :class:`~rasterflow.sizing.WorkerLayout` the budget
  check used (sizing lives in :mod:`rasterflow.sizing`, not here), with ``GDAL_CACHEMAX`` set in every worker process
  before GDAL starts and the worker memory thresholds in the workers' Dask config; or, for a one-process layout
  (``cluster.processes: false``, or ``auto`` when the job fits), one in-process worker whose threads run the tasks
  in this process; or connects to ``cluster.address`` / ``DASK_SCHEDULER_ADDRESS`` and leaves that cluster running.
  :func:`local_run_layout` / :func:`process_fallback` choose the local layout; :func:`remote_layout` reads an
  existing cluster's real layout for the budget check.
- :class:`ProgressReporter` / :func:`progress`: a rich bar on a terminal, plain lines for cron.
- :class:`MemorySampler`: per-worker RSS, managed and spilled bytes over time, and stage marks, for the run report.

This is the execution layer: it may import dask and distributed, and it must not import ``rasterflow.graph``,
``rasterflow.write`` or ``rasterflow.commands``.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, TextIO

from rasterflow.errors import ClusterError
from rasterflow.sizing import WorkerLayout
from rasterflow.units import format_bytes

__all__ = [
    "ClusterSettings",
    "ClusterHandle",
    "resolve_address",
    "remote_layout",
    "local_run_layout",
    "process_fallback",
    "open_cluster",
    "gdal_cachemax_env_value",
    "worker_dask_config",
    "ProgressReporter",
    "progress",
    "MemorySampler",
    "CountingProgress",
    "CLIENT",
    "IN_PROCESS",
    "ADDRESS_ENV",
    "process_peak_since_sample",
]

log = logging.getLogger(__name__)

ADDRESS_ENV = "DASK_SCHEDULER_ADDRESS"
"""Environment variable naming an existing scheduler; used when the spec's ``cluster.address`` is null."""

CLIENT = "client"
"""The ``worker`` value of :class:`MemorySampler` samples taken in the client (driver) process."""

IN_PROCESS = "process"
"""The ``worker`` value of :class:`MemorySampler` samples of a worker that runs in this process (a one-process run):
the whole process's memory, client and scheduler included, so no separate client sample is taken."""

_GDAL_MB_THRESHOLD = 100_000
"""GDAL reads a bare GDAL_CACHEMAX number below 100000 as megabytes (MiB) and one at or above it as bytes."""


# --------------------------------------------------------------------------------------------------------------------
# Settings and layout
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterSettings:
    """What the spec's ``cluster`` section says, as plain values."""

    address: str | None
    """``tcp://host:8786`` to use an existing cluster; None -> LocalCluster unless DASK_SCHEDULER_ADDRESS is set."""
    n_workers: int | str
    """``"auto"`` or a number of LocalCluster worker processes."""
    threads_per_worker: int
    memory_limit: int | str
    """``"auto"`` or a per-worker size (``"4GB"`` or bytes)."""
    gdal_cachemax: int
    """GDAL block cache per worker process, in bytes."""
    memory_target: float = 0.6
    memory_spill: float = 0.7
    memory_pause: float = 0.8
    memory_terminate: float = 0.95
    connect_timeout: float = 10.0
    """Seconds to wait for an existing scheduler to answer."""
    processes: bool | str = True
    """``cluster.processes``: True (worker processes), False (one process) or ``"auto"``; see
    :func:`local_run_layout`."""

    @classmethod
    def from_spec(cls, cluster: Any, gdal_cachemax: int | None = None) -> ClusterSettings:
        """Build from the validated spec's ``cluster`` section (any object with the same attribute names);
        ``gdal_cachemax``: the plan's (``auto`` resolved, :attr:`rasterflow.planning.JobPlan.gdal_cachemax`), else the
        spec's size, or for ``auto`` without a plan the default."""
        from rasterflow.budget import spec_gdal_cachemax

        memory = getattr(cluster, "memory", None)
        thresholds = {}
        if memory is not None:
            thresholds = {
                "memory_target": float(memory.target),
                "memory_spill": float(memory.spill),
                "memory_pause": float(memory.pause),
                "memory_terminate": float(memory.terminate),
            }
        return cls(
            address=cluster.address,
            n_workers=cluster.n_workers,
            threads_per_worker=int(cluster.threads_per_worker),
            memory_limit=cluster.memory_limit,
            gdal_cachemax=spec_gdal_cachemax(cluster.gdal_cachemax) if gdal_cachemax is None else int(gdal_cachemax),
            processes=getattr(cluster, "processes", True),
            **thresholds,
        )


@dataclass
class ClusterHandle:
    """An open cluster: the client to compute with and what it runs on."""

    client: Any
    """The ``distributed.Client`` (set as the default client while the cluster is open)."""
    layout: WorkerLayout
    dashboard_link: str | None
    """The dashboard URL, or None when there is none (bokeh missing)."""
    address: str
    """The scheduler address."""
    is_local: bool
    """True for a LocalCluster started (and shut down) by :func:`open_cluster`."""

    def as_dict(self) -> dict[str, Any]:
        """The run report's ``cluster`` section."""
        return {
            "address": self.address,
            "n_workers": self.layout.n_workers,
            "threads_per_worker": self.layout.threads_per_worker,
            "memory_limit": self.layout.memory_limit,
            "dashboard_link": self.dashboard_link,
            "is_local": self.is_local,
            "processes": self.layout.processes,
        }


def resolve_address(settings: ClusterSettings) -> str | None:
    """The scheduler to connect to: ``settings.address``, else env ``DASK_SCHEDULER_ADDRESS``, else None (local)."""
    if settings.address:
        return settings.address
    return os.environ.get(ADDRESS_ENV) or None


def local_run_layout(settings: ClusterSettings, machine: Any = None) -> WorkerLayout:
    """The layout of a run on this machine: worker processes or one process, as ``settings.processes`` says
    (:func:`rasterflow.sizing.size_local_run`; ``machine`` default: this one)."""
    from rasterflow.sizing import local_machine, size_local_run

    return size_local_run(machine or local_machine(), n_workers=settings.n_workers,
                          threads_per_worker=settings.threads_per_worker, memory_limit=settings.memory_limit,
                          processes=settings.processes)


def process_fallback(settings: ClusterSettings, layout: WorkerLayout, machine: Any = None) -> WorkerLayout | None:
    """``processes: auto`` chose one process (``layout``) and the job's budget refused it: the worker processes'
    layout to plan again with; None when there is nothing to fall back to (the layout was asked for, or is not a
    one-process one)."""
    if settings.processes != "auto" or layout.processes or resolve_address(settings):
        return None
    from rasterflow.sizing import local_machine, size_local_cluster

    return size_local_cluster(machine or local_machine(), n_workers=settings.n_workers,
                              threads_per_worker=settings.threads_per_worker, memory_limit=settings.memory_limit)


def _unreachable(address: str, timeout: float, exc: BaseException) -> ClusterError:
    return ClusterError(
        f"cannot reach the Dask scheduler at {address} within {timeout:g} s ({type(exc).__name__}: {exc}). "
        f"Check that the scheduler is running and listening on that host and port, that cluster.address "
        f"(or ${ADDRESS_ENV}) names it correctly, and that this machine can reach it (firewall, VPN, TLS)."
    )


def _connect(address: str, timeout: float, *, set_as_default: bool) -> Any:
    from distributed import Client

    try:
        return Client(address, timeout=timeout, set_as_default=set_as_default)
    except (OSError, ValueError, TypeError) as exc:  # TimeoutError is an OSError; a malformed address a ValueError
        raise _unreachable(address, timeout, exc) from exc


def _layout_from_info(info: dict, address: str) -> WorkerLayout:
    workers = info.get("workers") or {}
    if not workers:
        raise ClusterError(
            f"the Dask scheduler at {address} has no workers; start some (`dask worker {address} "
            f"--memory-limit 4GB --nthreads 1`) or wait until they have joined"
        )
    limits = [int(w.get("memory_limit") or 0) for w in workers.values()]
    limited = [m for m in limits if m > 0]
    if not limited:
        raise ClusterError(
            f"the workers of {address} have no memory limit, so no memory budget can be checked; "
            f"restart them with e.g. `dask worker {address} --memory-limit 4GB`"
        )
    threads = max(int(w.get("nthreads") or 1) for w in workers.values())
    return WorkerLayout(n_workers=len(workers), threads_per_worker=threads, memory_limit=min(limited), source=address)


def remote_layout(address: str, timeout: float = 10) -> WorkerLayout:
    """The layout of an existing cluster, read from its scheduler: the workers' real limits and thread counts.

    ``memory_limit`` is the smallest worker limit and ``threads_per_worker`` the largest thread count, so the budget
    check is made against the tightest worker.

    Raises
    ------
    ClusterError
        The scheduler is unreachable within ``timeout`` seconds, has no workers, or its workers have no memory limit.
    """
    client = _connect(address, timeout, set_as_default=False)
    try:
        info = client.scheduler_info(n_workers=-1)
    finally:
        client.close()
    return _layout_from_info(info, address)


# --------------------------------------------------------------------------------------------------------------------
# Opening a cluster
# --------------------------------------------------------------------------------------------------------------------


def gdal_cachemax_env_value(nbytes: int) -> str:
    """``GDAL_CACHEMAX`` as GDAL reads it from the environment, exactly ``nbytes``.

    GDAL takes a bare number below 100000 as megabytes (MiB) and one at or above 100000 as bytes; sizes in a spec
    are bytes, so they are passed as bytes (``256MB`` -> ``"256000000"``, read back by GDAL as 256000000). A size
    below 100 kB cannot be given in bytes and is rounded up to whole MiB.
    """
    nbytes = int(nbytes)
    if nbytes < 0:
        raise ValueError(f"GDAL_CACHEMAX cannot be negative (got {nbytes})")
    if nbytes == 0 or nbytes >= _GDAL_MB_THRESHOLD:
        return str(nbytes)
    return str(math.ceil(nbytes / 2**20))


def worker_dask_config(settings: ClusterSettings) -> dict[str, Any]:
    """The Dask config a LocalCluster's workers (and nannies) are started with."""
    return {
        "distributed.worker.memory.target": settings.memory_target,
        "distributed.worker.memory.spill": settings.memory_spill,
        "distributed.worker.memory.pause": settings.memory_pause,
        "distributed.worker.memory.terminate": settings.memory_terminate,
        # "auto" is lz4 when lz4 is installed; without it, no compression at all (zlib is never chosen by "auto").
        "distributed.worker.memory.spill-compression": "auto",
        # The worker's statistical profiler calls sys._current_frames() every 10 ms; on Python <= 3.11 that can
        # deadlock the worker against the garbage collector (HEAD_LOCK vs the GIL: cpython#106883,
        # dask/distributed#8616, not fixed in 3.11): a run whose worker froze mid-write never ended. distributed
        # already skips its event-loop profiler on 3.11 for the same reason; nothing of rasterflow uses either.
        **({"distributed.worker.profile.enabled": False} if sys.version_info < (3, 12) else {}),
    }


def worker_environ() -> dict[str, int]:
    """``distributed.nanny.pre-spawn-environ`` for rasterflow's worker processes: distributed's own (one thread per
    numerical library) without its ``MALLOC_TRIM_THRESHOLD_=65536``, so that glibc's allocator keeps its dynamic
    thresholds (2.3x faster tasks than with distributed's setting), and with one malloc arena (a worker's memory
    does not creep up with its tasks); see :mod:`rasterflow.allocator`. Allocator settings of the user's Dask config
    win, and a ``MALLOC_ARENA_MAX`` of the environment (which the workers inherit)."""
    import dask

    from rasterflow.allocator import DISTRIBUTED_TRIM_THRESHOLD, WORKER_ARENA_MAX

    configured = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {})
    users_own = any(k.startswith("MALLOC_")
                    and not (k == "MALLOC_TRIM_THRESHOLD_" and v == DISTRIBUTED_TRIM_THRESHOLD)
                    for k, v in configured.items())
    if users_own:
        return configured
    environ = {k: v for k, v in configured.items() if k != "MALLOC_TRIM_THRESHOLD_"}
    if "MALLOC_ARENA_MAX" not in os.environ:
        environ["MALLOC_ARENA_MAX"] = WORKER_ARENA_MAX
    return environ


def _drop_leaked_trim_threshold(spawn_environ: Mapping[str, Any]) -> None:
    """Take distributed's ``MALLOC_TRIM_THRESHOLD_=65536`` out of this process's environment while the workers
    spawn (they inherit it, and a nanny can set variables but not unset them), unless the worker environment sets
    one. It gets here when an earlier nanny in this process (any other LocalCluster) wrote it and did not take it
    back; the caller restores the environment (``saved``) once the workers exist."""
    from rasterflow.allocator import DISTRIBUTED_TRIM_THRESHOLD

    key = "MALLOC_TRIM_THRESHOLD_"
    if key not in spawn_environ and os.environ.get(key) == str(DISTRIBUTED_TRIM_THRESHOLD):
        del os.environ[key]


def _check_lz4() -> bool:
    if importlib.util.find_spec("lz4") is None:
        log.warning(
            "lz4 is not installed: Dask's spill compression 'auto' means no compression, so spilled chunks take "
            "their full size on disk; install lz4 (a rasterflow dependency) to fix"
        )
        return False
    return True


def _dashboard_link(client: Any) -> str | None:
    if importlib.util.find_spec("bokeh") is None:  # the HTTP server is up, but it serves no dashboard
        return None
    try:
        link = client.dashboard_link
    except Exception:  # no dashboard service (bokeh missing) or an old scheduler
        return None
    return link or None


def _pre_spawn_keys() -> list[str]:
    """Variables a nanny writes into its own process's environment before spawning a worker."""
    import dask

    keys = [str(k) for k in (dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {})]
    keys += [k for k in (*worker_environ(), "MALLOC_TRIM_THRESHOLD_") if k not in keys]  # (see _drop_leaked_trim...)
    return keys + ["PYTHONHASHSEED"]  # the nanny adds PYTHONHASHSEED=6640 when it is unset or "0"


def _restore_environ(saved: dict[str, str | None]) -> None:
    """Undo what the nanny wrote into this process's environment before spawning workers."""
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _configured_preloads() -> list[str]:
    """The worker preloads of the user's Dask config (``distributed.worker.preload``: a list, or one string)."""
    import dask

    configured = dask.config.get("distributed.worker.preload", None) or []
    return [configured] if isinstance(configured, str) else [str(p) for p in configured]


def _start_local(settings: ClusterSettings, layout: WorkerLayout) -> tuple[Any, Any]:
    import dask
    from distributed import Client, LocalCluster

    _check_lz4()
    env = {"GDAL_CACHEMAX": gdal_cachemax_env_value(settings.gdal_cachemax)}
    # GDAL settings read once per process (its shared HTTP cache size), before GDAL starts; see rasterflow.gdalenv
    from rasterflow.gdalenv import process_env

    env.update(process_env())
    # The nanny sets distributed.nanny.pre-spawn-environ (OMP_NUM_THREADS=1, MALLOC_TRIM_THRESHOLD_, ...) in *this*
    # process before spawning each worker; put the parent's values back once the workers exist. GDAL_CACHEMAX goes
    # through env=, which the nanny applies only inside the worker process.
    saved = {key: os.environ.get(key) for key in _pre_spawn_keys()}
    spawn_environ = worker_environ()
    _drop_leaked_trim_threshold(spawn_environ)
    cluster = None
    try:
        # Nannies copy dask.config when they are created, and the workers start with that copy.
        with dask.config.set({**worker_dask_config(settings), "distributed.nanny.pre-spawn-environ": spawn_environ}):
            cluster = LocalCluster(
                n_workers=layout.n_workers,
                threads_per_worker=layout.threads_per_worker,
                memory_limit=layout.memory_limit,
                processes=True,
                dashboard_address=":0",  # a free port; the HTTP server runs even without bokeh (health, metrics)
                silence_logs=logging.WARNING,
                env=env,
                # workers ignore SIGINT/SIGTERM/SIGHUP (the run shuts them down) and log to the run's worker log
                # (after the preloads the user's Dask config names: the argument replaces that config)
                preload=[*_configured_preloads(), "rasterflow.workerinit"],
            )
        client = Client(cluster)
    except Exception as exc:
        if cluster is not None:
            cluster.close()
        raise ClusterError(
            f"could not start a LocalCluster of {layout.n_workers} worker(s) x {layout.threads_per_worker} "
            f"thread(s) with {format_bytes(layout.memory_limit)} each: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        _restore_environ(saved)
    return cluster, client


def _start_in_process(settings: ClusterSettings, layout: WorkerLayout) -> tuple[Any, Any, int | None]:
    """One worker in this process (``LocalCluster(processes=False)``): its threads run the tasks, beside the client
    and the scheduler; no worker process, no second interpreter, no per-worker imports. Returns the cluster, the
    client and GDAL's previous block cache size (put back by :func:`open_cluster`).

    What a worker process gets at spawn is set here in this process instead: GDAL's block cache (``GDAL_CACHEMAX``
    through ``GDALSetCacheMax64``, which takes effect even when GDAL has started), the per-process GDAL settings
    (unless set; the read policy plugin does the same) and the memory thresholds in the worker's Dask config (the
    worker's memory monitor measures this process, so ``memory_limit`` is the process's limit; there is no nanny,
    so the ``terminate`` threshold does not apply). No dashboard is started. The worker preload ``rasterflow.workerinit`` is *not* run: this
    process's signals and output are the run's own (the user's configured preloads still are).
    """
    import dask
    import rasterio.env
    from distributed import Client, LocalCluster

    from rasterflow.gdalenv import process_env

    _check_lz4()
    for key, value in process_env().items():
        os.environ.setdefault(key, value)
    previous_cache = int(rasterio.env.get_gdal_config("GDAL_CACHEMAX"))
    rasterio.env.set_gdal_config("GDAL_CACHEMAX", int(settings.gdal_cachemax))
    cluster = None
    try:
        # No statistical profiler: every 10 ms it calls sys._current_frames() on the worker's event loop, which
        # here shares the GIL with the task threads, and on CPython 3.11 a garbage collection inside that call
        # that frees a threading.local deadlocks the process (seen: a 2048² run hung with every thread waiting).
        with dask.config.set({**worker_dask_config(settings), "distributed.worker.profile.enabled": False}):
            cluster = LocalCluster(
                n_workers=1,
                threads_per_worker=layout.threads_per_worker,
                memory_limit=layout.memory_limit,
                processes=False,
                # no dashboard: bokeh's import and server cost ~20 MB and 0.5-3 s of start-up (measured 2026-12-03),
                # a large share of a small job; processes: true keeps it
                dashboard_address=None,
                silence_logs=logging.WARNING,
                preload=_configured_preloads(),
            )
        client = Client(cluster)
    except Exception as exc:
        if cluster is not None:
            cluster.close()
        rasterio.env.set_gdal_config("GDAL_CACHEMAX", previous_cache)
        raise ClusterError(
            f"could not start a worker of {layout.threads_per_worker} thread(s) with "
            f"{format_bytes(layout.memory_limit)} in this process: {type(exc).__name__}: {exc}"
        ) from exc
    return cluster, client, previous_cache


def _check_worker_versions(client: Any, address: str) -> None:
    """Every worker of an existing cluster must import this rasterflow: its tasks call rasterflow's own functions,
    and another version could compute another result."""
    from rasterflow import __version__

    def imported_version() -> str | None:  # a closure: cloudpickle ships it by value, it needs no rasterflow there
        try:
            import rasterflow
        except ImportError:
            return None
        return str(getattr(rasterflow, "__version__", None))

    # An import, not the installed package metadata (Client.get_versions): the metadata can be there when the
    # package cannot be imported, and the tasks need the import.
    found = {worker: (None if isinstance(version, BaseException) else version)
             for worker, version in client.run(imported_version, on_error="return").items()}
    wrong = {worker: version for worker, version in found.items() if version != __version__}
    if wrong:
        shown = ", ".join(f"{worker}: {version or 'not importable'}" for worker, version in sorted(wrong.items()))
        raise ClusterError(
            f"{len(wrong)} of the {len(found)} workers of {address} do not have rasterflow {__version__} (the "
            f"client's version) installed ({shown}); install the same rasterflow version in the workers' "
            f"environment (their image or conda/pip environment) and restart them"
        )


def _register_gdal_cache(client: Any, nbytes: int) -> str:
    """Put the spec's GDAL block cache size on every worker, also on workers that join later; returns the plugin's
    name. A LocalCluster's workers get it in their environment instead (:func:`_start_local`)."""
    import uuid

    from rasterflow.read.worker import GdalCachePlugin

    name = f"rasterflow-gdal-cache-{uuid.uuid4().hex}"
    client.register_plugin(GdalCachePlugin(nbytes), name=name)
    return name


@contextmanager
def _main_not_rerun() -> Iterator[None]:
    """While rasterflow's worker processes may be spawned, keep multiprocessing from running the main script again in
    each of them.

    A spawned child runs the parent's ``__main__`` again (as ``__mp_main__``) to find the functions it is sent; a
    script calling ``rasterflow.run(...)`` without an ``if __name__ == "__main__":`` guard then starts the run again
    in every worker, which fails ("Nanny failed to start", three tracebacks). rasterflow's workers need nothing from
    ``__main__`` (the tasks are rasterflow's functions), so for the cluster's lifetime ``__main__`` is presented to
    multiprocessing as a notebook's is (``__spec__`` named ``__main__``): the children skip it. Put back on exit."""
    import importlib.machinery

    main = sys.modules.get("__main__")
    if main is None or (getattr(main, "__file__", None) is None and getattr(main, "__spec__", None) is None):
        yield  # an interactive session: nothing is re-run anyway
        return
    missing = object()
    previous = main.__dict__.get("__spec__", missing)
    main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)  # type: ignore[assignment]
    try:
        yield
    finally:
        if previous is missing:
            main.__dict__.pop("__spec__", None)
        else:
            main.__spec__ = previous  # type: ignore[assignment]


@contextmanager
def open_cluster(settings: ClusterSettings, layout: WorkerLayout) -> Iterator[ClusterHandle]:
    """Start a LocalCluster sized by ``layout``, or connect to the existing scheduler; yield a :class:`ClusterHandle`.

    With an address (``settings.address`` or ``$DASK_SCHEDULER_ADDRESS``) only a client is opened, and only the client
    is closed on exit: the remote cluster keeps running. Its workers must have this rasterflow version installed;
    they get the spec's GDAL block cache size through a worker plugin (removed on exit, the previous size restored),
    which also reaches workers that join or restart while the client is open. Otherwise a LocalCluster of processes is started with
    ``layout``'s numbers, ``GDAL_CACHEMAX`` in each worker's environment and the memory thresholds in each worker's
    Dask config; it is shut down on exit, also when the body raises. A one-process layout (``layout.processes``
    False) gets one worker inside this process instead (:func:`_start_in_process`), GDAL's block cache size put
    back on exit.

    Raises
    ------
    ClusterError
        The scheduler could not be reached, its workers lack this rasterflow version, or the LocalCluster could not
        be started.
    """
    address = resolve_address(settings)
    if address is not None:
        client = _connect(address, settings.connect_timeout, set_as_default=True)
        plugin = None
        try:
            _check_worker_versions(client, address)
            plugin = _register_gdal_cache(client, settings.gdal_cachemax)
            yield ClusterHandle(
                client=client,
                layout=layout,
                dashboard_link=_dashboard_link(client),
                address=client.scheduler.address,
                is_local=False,
            )
        finally:
            try:
                if plugin is not None:  # a plugin stays on the scheduler after its client leaves: remove it
                    client.unregister_worker_plugin(plugin)
            except Exception as exc:  # the scheduler gone: nothing left to clean up
                log.debug("could not unregister %s: %s", plugin, exc)
            finally:
                client.close()
        return

    if not layout.processes:
        cluster, client, previous_cache = _start_in_process(settings, layout)

        def restore() -> None:
            import rasterio.env

            rasterio.env.set_gdal_config("GDAL_CACHEMAX", previous_cache)
    else:
        main_guard = _main_not_rerun()
        main_guard.__enter__()
        try:
            cluster, client = _start_local(settings, layout)
        except BaseException:
            main_guard.__exit__(None, None, None)
            raise
        saved = {key: os.environ.get(key) for key in _pre_spawn_keys()}

        def restore() -> None:
            _restore_environ(saved)  # a nanny that restarted a killed worker wrote pre-spawn-environ again
            main_guard.__exit__(None, None, None)
    try:
        yield ClusterHandle(
            client=client,
            layout=layout,
            # one process starts no dashboard (_start_in_process): the link the client formats would lead nowhere
            dashboard_link=_dashboard_link(client) if layout.processes else None,
            address=cluster.scheduler_address,
            is_local=True,
        )
    finally:
        try:
            client.close()
        finally:
            cluster.close()
            restore()


# --------------------------------------------------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------------------------------------------------


_FAILED = frozenset({"error", "cancelled", "lost"})


def _futures_of(futures_or_collection: Any, client: Any = None) -> tuple[list[Any], Any]:
    """Futures to follow and the object to hand back (persisting a lazy collection with ``client`` if needed)."""
    from distributed import Future, futures_of
    from dask import is_dask_collection

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
        futures: list[Any],
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
        self._bar: Any = None
        self._bar_task: Any = None

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

            self._bar = Progress(
                TextColumn(f"[bold]{self.label}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            self._bar.start()
            self._bar_task = self._bar.add_task(self.label, total=self.total)
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
                self._bar.update(self._bar_task, completed=done)
            elif time.monotonic() - last_line >= self.interval and not finished:
                self._emit(done, failed)
                last_line = time.monotonic()
            if finished or self._stop.wait(poll):
                return

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
            self._bar.update(self._bar_task, completed=done)
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
                self._bar.update(self._bar_task, completed=self._done, total=self._total)
            elif time.monotonic() - last_line >= self.interval:
                self._emit(self._done, 0)
                last_line = time.monotonic()


def progress(
    futures_or_collection: Any,
    client: Any = None,
    *,
    interactive: bool | None = None,
    interval: float | None = None,
    stream: TextIO | None = None,
    label: str = "tasks",
) -> Any:
    """Show progress until every future is done; returns the futures or the persisted collection.

    A lazy Dask collection is persisted with ``client`` first. Failures are counted, not raised: gather the results
    to see the exception.
    """
    futures, result = _futures_of(futures_or_collection, client)
    reporter = ProgressReporter(futures, interactive=interactive, interval=interval, stream=stream, label=label)
    with reporter:
        reporter.wait()
    return result


# --------------------------------------------------------------------------------------------------------------------
# Memory sampling
# --------------------------------------------------------------------------------------------------------------------


def _make_worker_probe(track_peaks: bool) -> Callable[..., dict]:
    """The function :class:`MemorySampler` runs in each worker.

    Defined as a closure so cloudpickle ships it by value: a remote cluster's workers need not have rasterflow.
    """

    def probe(dask_worker: Any) -> dict:
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
            spilled, _disk = data.spilled_total
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

    def __init__(self, client: Any, interval: float = 0.25, *, track_peaks: bool = True, sample_client: bool = True):
        self.client = client
        self.interval = float(interval)
        self.track_peaks = track_peaks
        self.sample_client = sample_client
        self.samples: list[dict] = []
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
        rows = []
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
