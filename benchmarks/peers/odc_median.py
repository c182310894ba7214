"""The peer: masked NDVI median over time with ``odc.stac.load`` and the same xarray code as the stackstac peer.

    python odc_median.py ITEMS_JSON OUTPUT_ZARR MINX MINY MAXX MAXY

LocalCluster of 2 workers x 1 thread; odc-stac loads uint16 (nodata 0) in 1024² chunks, one date per chunk.
Prints one JSON line: job seconds and the workers' task and transfer counters.
"""

import json
import sys
import time
from pathlib import Path

import numpy as np
import odc.stac
import pystac
import xarray as xr
from dask.distributed import Client, LocalCluster
from odc.geo.geobox import GeoBox

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from worker_stats import worker_stats  # noqa: E402  (only to report the counters)


def main(items_json: str, output: str, bounds: tuple[float, ...]) -> None:
    started = time.perf_counter()
    cluster = LocalCluster(n_workers=2, threads_per_worker=1)
    client = Client(cluster)
    items = [pystac.Item.from_dict(f) for f in json.loads(Path(items_json).read_text())["features"]]

    geobox = GeoBox.from_bbox(bounds, crs="EPSG:32633", resolution=10)
    ds = odc.stac.load(items, bands=["red", "nir", "scl"], geobox=geobox, chunks={"x": 1024, "y": 1024})
    cloudy = ds.scl.isin([3, 8, 9, 10])

    def reflectance(dn):  # nodata 0 -> NaN, then raster:bands scale and offset
        return xr.where(dn == 0, np.nan, dn.astype("float32") * 0.0001 - 0.1)

    red = xr.where(cloudy, np.nan, reflectance(ds.red))
    nir = xr.where(cloudy, np.nan, reflectance(ds.nir))
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
