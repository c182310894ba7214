"""Task and transfer counters of a Dask worker, and a worker preload that writes them when the worker closes.

The peer scripts call :func:`worker_stats` through ``client.run``. ``rasterflow run`` does not print them, so the
benchmarks load this file into its workers with ``DASK_DISTRIBUTED__WORKER__PRELOAD=["…/worker_stats.py"]``;
each worker writes ``$RASTERFLOW_BENCH_STATS/<pid>.json`` on close. (Dask copies a preload file into the worker's
scratch directory, so this module must not import its neighbours.)
"""

import json
import os
from pathlib import Path


def worker_stats(dask_worker) -> dict:
    """Tasks run, and bytes received from / sent to other workers, by one worker (runs in the worker)."""
    incoming = sum(int(entry.get("total", 0)) for entry in dask_worker.transfer_incoming_log)
    return {
        "executed": int(dask_worker.state.executed_count),
        "incoming_bytes": incoming,
        "outgoing_bytes": int(dask_worker.transfer_outgoing_bytes_total),
    }


async def dask_teardown(worker):
    directory = Path(os.environ["RASTERFLOW_BENCH_STATS"])
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{os.getpid()}.json").write_text(json.dumps(worker_stats(worker)))
