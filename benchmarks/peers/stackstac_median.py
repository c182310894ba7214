"""The peer: masked NDVI median over time written the way the stackstac / Dask tutorials do it.

    python stackstac_median.py ITEMS_JSON OUTPUT_ZARR MINX MINY MAXX MAXY

LocalCluster of 2 workers x 1 thread, ``stackstac.stack`` (default chunks), ``xr.where``, ``.median("time")``,
``.to_zarr``. Prints one JSON line: job seconds and the workers' task and transfer counters.
"""

import json
import sys
import time
from pathlib import Path

import numpy as np
import stackstac
import xarray as xr
from dask.distributed import Client, LocalCluster

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from worker_stats import worker_stats  # noqa: E402  (only to report the counters)


def main(items_json: str, output: str, bounds: tuple[float, ...]) -> None:
    started = time.perf_counter()
    cluster = LocalCluster(n_workers=2, threads_per_worker=1)
    client = Client(cluster)
    items = json.loads(Path(items_json).read_text())["features"]

    stack = stackstac.stack(items, assets=["red", "nir", "scl"], epsg=32633, resolution=10, bounds=bounds,
                            dtype="float32", fill_value=np.float32(np.nan), rescale=False)
    scl = stack.sel(band="scl")
    cloudy = scl.isin([3, 8, 9, 10])
    # raster:bands scale and offset of processing baseline >= 04.00: reflectance = DN * 0.0001 - 0.1
    red = xr.where(cloudy, np.nan, stack.sel(band="red") * 0.0001 - 0.1)
    nir = xr.where(cloudy, np.nan, stack.sel(band="nir") * 0.0001 - 0.1)
    ndvi = (nir - red) / (nir + red)
    median = ndvi.median("time").reset_coords(drop=True)
    median.to_dataset(name="ndvi").to_zarr(output, mode="w")

    stats = client.run(worker_stats)
    elapsed = time.perf_counter() - started
    client.close()
    cluster.close()
    print(json.dumps({"job_seconds": elapsed, "dtype": str(median.dtype), "workers": list(stats.values()),
                      "transfer_bytes": sum(s["incoming_bytes"] for s in stats.values())}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], tuple(float(v) for v in sys.argv[3:7]))
