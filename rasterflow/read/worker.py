"""Dask worker plugins for what is per worker *process*, not per run: GDAL's settings read once per process.

Imported only where a distributed client exists. A run's :class:`~rasterflow.read.policy.ReadPolicy` is not set
here: it travels inside every task (:attr:`rasterflow.read.ReadJob.policy`), so two runs sharing a cluster each
read under their own. :class:`ProcessEnvPlugin`'s ``setup`` runs on every current worker when registered and on
every worker that starts later (a restarted one too): it sets in the worker's environment the GDAL settings read
once per process (the size of GDAL's shared HTTP cache: it takes effect when GDAL has not started yet), without
replacing what the worker's environment already sets. The other GDAL settings are set around each read
(:meth:`ReadPolicy.gdal_options`).

:class:`GdalCachePlugin` does the same for the size of GDAL's block cache on a cluster rasterflow did not start
(a LocalCluster's workers get ``GDAL_CACHEMAX`` in their environment at spawn; a user's ``dask worker`` has GDAL's
default, 5% of the machine's RAM, which the budget check never counted).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from distributed import WorkerPlugin

from rasterflow.gdalenv import BlockCache, process_env

if TYPE_CHECKING:  # pragma: no cover
    from distributed import Worker

__all__ = ["ProcessEnvPlugin", "GdalCachePlugin"]


class ProcessEnvPlugin(WorkerPlugin):
    """Set GDAL's once-per-process settings in each worker's environment (see the module docstring)."""

    def setup(self, worker: Worker) -> None:
        for key, value in process_env().items():
            os.environ.setdefault(key, value)


class GdalCachePlugin(WorkerPlugin):
    """Set GDAL's block cache to ``nbytes`` in each worker process while the run's client is connected.

    GDAL reads ``GDAL_CACHEMAX`` from the environment only once, but its cache size can be changed at any time
    (``rasterio.env.set_gdal_config("GDAL_CACHEMAX", n)`` calls ``GDALSetCacheMax64``): the spec's
    ``cluster.gdal_cachemax`` is what the budget check counted per worker, so it is what each worker gets, as on a
    LocalCluster. A worker that has not imported rasterio gets it when it first does
    (:class:`~rasterflow.gdalenv.BlockCache`): registering the plugin loads no GDAL, so a worker that reads only
    files rasterflow decodes itself never does. ``teardown`` puts the worker's previous size back (the cluster
    outlives the run). GDAL's cache is per process: two runs with different sizes on one cluster at the same time
    get the later one's.
    """

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)
        self.cache: BlockCache | None = None

    def setup(self, worker: Worker) -> None:
        self.cache = BlockCache(self.nbytes)
        self.cache.apply()

    def teardown(self, worker: Worker) -> None:
        if self.cache is not None:
            self.cache.restore()
            self.cache = None
