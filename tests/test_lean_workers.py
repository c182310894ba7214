"""A worker process imports what its tasks need, not the client's libraries.

``dask.array`` imports xarray (and with it pandas) whenever xarray is installed; a worker that unpickles a task
function from a module importing ``dask.array`` or xarray carries them, ~45 MB of a worker's ~150 MB before any
pixel (benchmarks/README.md, "Lean workers"). The read-and-reduce and Zarr write tasks live in light modules
(``rasterflow.tasks``, ``rasterflow.write.regions``); these tests run real jobs on a real worker process, started
fresh for each, and look into it afterwards.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import rasterio
import xarray as xr

from conftest import spec_text
from procs import finish
from reference import assert_same, load_items, masked_ndvi, reduce_reference

pytestmark = pytest.mark.slow

CLIENT_ONLY = ("dask.array", "xarray", "pandas", "rioxarray", "pyproj")


def _probe():
    """A function that tells which of the client's libraries a worker process has imported. Nested, so that
    cloudpickle sends it by value: by reference, the worker would import this test module, and xarray with it."""
    names = CLIENT_ONLY + ("rasterflow.tasks", "numpy", "rasterflow.write.cogtiles")

    def imported() -> dict[str, bool]:
        import sys as worker_sys

        return {name: name in worker_sys.modules for name in names}

    return imported


@pytest.mark.parametrize("output,reduce", [
    ("lean.zarr", "{method: median}"),  # the fused task and the Zarr region writer
    ("lean.tif", "{method: median}"),  # the fused task, blocks gathered by the client (GDAL's copy: 64² chunks)
    ("tiles.tif, cog: {blocksize: 64}", "{method: median}"),  # the COG tiles made by the worker (write.cogtiles)
    ("lean.zarr", "{method: quantile, q: [0.25, 0.75]}"),  # a band and quantile selected out of the fused block
    ("lean.zarr", None),  # the series path: every date, no reduction
    ("lean.zarr", "{method: mean}"),  # with time in chunks of 3 (below): the tree path's partials and combines
])
def test_a_worker_that_ran_the_job_has_not_imported_dask_array_or_xarray(sample, tmp_path, output, reduce):
    from distributed import Client, LocalCluster

    # no HTTP server on 8787, which another cluster on the machine may hold ("Port 8787 is already in use" warns)
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=None,
                      scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"},
                      memory_limit="2GB") as cluster, Client(cluster) as client:
        before = next(iter(client.run(_probe()).values()))
        assert not any(before[name] for name in CLIENT_ONLY), before  # a fresh worker: nothing to blame on the test
        spec = tmp_path / "lean.yaml"
        name, _, options = output.partition(",")
        spec.write_text(spec_text(sample, reduce=reduce, output=f"out/{name}{',' + options if options else ''}",
                                  chunks=f"{{time: {3 if reduce == '{method: mean}' else -1}, y: 64, x: 64}}",
                                  cluster=f"{{address: '{cluster.scheduler_address}'}}"))
        proc = subprocess.Popen([sys.executable, "-m", "rasterflow", "run", str(spec)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        text, _ = finish(proc, 300)
        assert proc.returncode == 0, text
        after = next(iter(client.run(_probe()).values()))
    assert after["rasterflow.tasks"] and after["numpy"], after  # the job's tasks did run in this worker
    assert not any(after[name] for name in CLIENT_ONLY), after
    assert after["rasterflow.write.cogtiles"] == ("cog:" in output), after

    import json

    out = tmp_path / "out" / name
    ids = json.loads((tmp_path / "out" / f"{name}.report.json").read_text())["item_ids"]
    series = masked_ndvi(load_items(sample, ids))
    if reduce is None:
        expected = series
    elif reduce == "{method: mean}":
        expected = reduce_reference(series, "mean")
    elif "quantile" in reduce:
        expected = np.stack([reduce_reference(series, "quantile", q) for q in (0.25, 0.75)])
    else:
        expected = reduce_reference(series, "median")
    if output.endswith(".zarr"):
        with xr.open_zarr(out) as ds:
            values = ds["ndvi"].values
    else:
        with rasterio.open(out) as src:
            values = src.read(1)
    assert_same(values, expected)
