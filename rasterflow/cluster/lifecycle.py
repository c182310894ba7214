"""Opening and closing the Dask cluster a run computes on.

:func:`open_cluster` starts a ``LocalCluster`` with exactly the :class:`~rasterflow.sizing.WorkerLayout` the budget
check used, with ``GDAL_CACHEMAX`` set in every worker process before GDAL starts and the worker memory thresholds in
the workers' Dask config (what the workers start with: :mod:`rasterflow.cluster.workerenv`); or, for a one-process
layout (``cluster.processes: false``, or ``auto`` when the job fits), one in-process worker whose threads run the
tasks in this process; or connects to ``cluster.address`` / ``DASK_SCHEDULER_ADDRESS``, checks that its workers have
this rasterflow, gives them the GDAL block cache size through a worker plugin, and leaves that cluster running. It
yields a :class:`ClusterHandle` and shuts down what it started, also when the run fails.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from rasterflow.cluster.settings import ClusterSettings, connect, resolve_address
from rasterflow.cluster.workerenv import (
    check_lz4,
    configured_preloads,
    drop_leaked_trim_threshold,
    gdal_cachemax_env_value,
    main_not_rerun,
    pre_spawn_keys,
    restore_environ,
    worker_dask_config,
    worker_environ,
)
from rasterflow.errors import ClusterError
from rasterflow.sizing import WorkerLayout
from rasterflow.units import format_bytes

if TYPE_CHECKING:  # pragma: no cover
    from distributed import Client, LocalCluster

    from rasterflow.gdalenv import BlockCache

__all__ = ["ClusterHandle", "open_cluster"]

log = logging.getLogger(__name__)


@dataclass
class ClusterHandle:
    """An open cluster: the client to compute with and what it runs on."""

    client: Client
    """The ``distributed.Client`` (set as the default client while the cluster is open)."""
    layout: WorkerLayout
    dashboard_link: str | None
    """The dashboard URL, or None when there is none (bokeh missing)."""
    address: str
    """The scheduler address."""
    is_local: bool
    """True for a LocalCluster started (and shut down) by :func:`open_cluster`."""
    work_stealing: bool | None = None
    """Whether the scheduler moves queued tasks between workers (a LocalCluster's, as
    :attr:`ClusterSettings.work_stealing` says); None: a cluster of its own (its configuration decides)."""

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
            "work_stealing": self.work_stealing,
        }


def _dashboard_link(client: Client) -> str | None:
    if importlib.util.find_spec("bokeh") is None:  # the HTTP server is up, but it serves no dashboard
        return None
    try:
        link = client.dashboard_link
    except Exception:  # no dashboard service (bokeh missing) or an old scheduler
        return None
    return link or None


def _start_local(settings: ClusterSettings, layout: WorkerLayout) -> tuple[LocalCluster, Client]:
    import dask
    from distributed import Client, LocalCluster

    check_lz4()
    env = {"GDAL_CACHEMAX": gdal_cachemax_env_value(settings.gdal_cachemax)}
    # GDAL settings read once per process (its shared HTTP cache size), before GDAL starts; see rasterflow.gdalenv
    from rasterflow.gdalenv import process_env

    env.update(process_env())
    # The nanny sets distributed.nanny.pre-spawn-environ (OMP_NUM_THREADS=1, MALLOC_TRIM_THRESHOLD_, ...) in *this*
    # process before spawning each worker; put the parent's values back once the workers exist. GDAL_CACHEMAX goes
    # through env=, which the nanny applies only inside the worker process.
    saved = {key: os.environ.get(key) for key in pre_spawn_keys()}
    spawn_environ = worker_environ()
    drop_leaked_trim_threshold(spawn_environ)
    cluster = None
    try:
        # Nannies copy dask.config when they are created, and the workers start with that copy. The scheduler
        # (created here) steals no work where the writer places each chunk's tasks on the worker whose process
        # started their reads (write.submit): a stolen task reads them again elsewhere (a time-chunked season at
        # 40 ms: 59 of 108 tasks found their reads started with stealing, 108 without)
        with dask.config.set({**worker_dask_config(settings), "distributed.nanny.pre-spawn-environ": spawn_environ,
                              "distributed.scheduler.work-stealing": settings.work_stealing}):
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
                preload=[*configured_preloads(), "rasterflow.workerinit"],
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
        restore_environ(saved)
    return cluster, client


def _start_in_process(settings: ClusterSettings, layout: WorkerLayout) -> tuple[LocalCluster, Client, BlockCache]:
    """One worker in this process (``LocalCluster(processes=False)``): its threads run the tasks, beside the client
    and the scheduler; no worker process, no second interpreter, no per-worker imports. Returns the cluster, the
    client and GDAL's block cache setting (its previous size put back by :func:`open_cluster`).

    What a worker process gets at spawn is set here in this process instead: GDAL's block cache (``GDAL_CACHEMAX``
    through ``GDALSetCacheMax64``, which takes effect even when GDAL has started; when this process first imports
    rasterio if it has not: :class:`~rasterflow.gdalenv.BlockCache`), the per-process GDAL settings
    (unless set; the read policy plugin does the same) and the memory thresholds in the worker's Dask config (the
    worker's memory monitor measures this process, so ``memory_limit`` is the process's limit; there is no nanny,
    so the ``terminate`` threshold does not apply). No dashboard is started. The worker preload ``rasterflow.workerinit`` is *not* run: this
    process's signals and output are the run's own (the user's configured preloads still are).
    """
    import dask
    from distributed import Client, LocalCluster

    from rasterflow.gdalenv import BlockCache, process_env

    check_lz4()
    for key, value in process_env().items():
        os.environ.setdefault(key, value)
    block_cache = BlockCache(int(settings.gdal_cachemax))
    block_cache.apply()
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
                # the scheduler's HTTP server (health, metrics) still runs: on a free loopback port, not on 8787,
                # which a user's own Dask dashboard often holds ("Port 8787 is already in use" warned otherwise)
                scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"},
                silence_logs=logging.WARNING,
                preload=configured_preloads(),
            )
        client = Client(cluster)
    except Exception as exc:
        if cluster is not None:
            cluster.close()
        block_cache.restore()
        raise ClusterError(
            f"could not start a worker of {layout.threads_per_worker} thread(s) with "
            f"{format_bytes(layout.memory_limit)} in this process: {type(exc).__name__}: {exc}"
        ) from exc
    return cluster, client, block_cache


def _check_worker_versions(client: Client, address: str) -> None:
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


def _register_gdal_cache(client: Client, nbytes: int) -> str:
    """Put the spec's GDAL block cache size on every worker, also on workers that join later; returns the plugin's
    name. A LocalCluster's workers get it in their environment instead (:func:`_start_local`)."""
    import uuid

    from rasterflow.read.worker import GdalCachePlugin

    name = f"rasterflow-gdal-cache-{uuid.uuid4().hex}"
    client.register_plugin(GdalCachePlugin(nbytes), name=name)
    return name


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
        client = connect(address, settings.connect_timeout, set_as_default=True)
        plugin = None
        try:
            _check_worker_versions(client, address)
            plugin = _register_gdal_cache(client, settings.gdal_cachemax)
            scheduler = client.scheduler
            # a connected client's (connect returns only once the scheduler answered)
            assert scheduler is not None and scheduler.address is not None
            yield ClusterHandle(
                client=client,
                layout=layout,
                dashboard_link=_dashboard_link(client),
                address=scheduler.address,
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
        cluster, client, block_cache = _start_in_process(settings, layout)

        def restore() -> None:
            block_cache.restore()
    else:
        main_guard = main_not_rerun()
        main_guard.__enter__()
        try:
            cluster, client = _start_local(settings, layout)
        except BaseException:
            main_guard.__exit__(None, None, None)
            raise
        saved = {key: os.environ.get(key) for key in pre_spawn_keys()}

        def restore() -> None:
            restore_environ(saved)  # a nanny that restarted a killed worker wrote pre-spawn-environ again
            main_guard.__exit__(None, None, None)
    try:
        yield ClusterHandle(
            client=client,
            layout=layout,
            # one process starts no dashboard (_start_in_process): the link the client formats would lead nowhere
            dashboard_link=_dashboard_link(client) if layout.processes else None,
            address=cluster.scheduler_address,
            is_local=True,
            # one process: a single worker, nothing to steal from
            work_stealing=settings.work_stealing if layout.processes else None,
        )
    finally:
        try:
            client.close()
        finally:
            cluster.close()
            restore()
