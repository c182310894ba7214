"""The geomedian peer as odc-stats' experts run it: odc-stac time-whole chunks, odc-algo's geomedian_with_mads.

    python odc_algo_geomedian.py ITEMS_JSON OUTPUT_ZARR MINX MINY MAXX MAXY

LocalCluster of 2 workers x 1 thread (the cluster shape of rasterflow's run). ``odc.stac.load(..., chunks={"x":
1024, "y": 1024})`` (one date per chunk, what odc-algo's ``yxbt`` reshape takes, as odc-stats loads); cloud mask ``enum_to_bool(scl, (3, 8, 9, 10))`` and ``erase_bad``; reflectance with
``to_float`` (the items' raster:bands scale and offset, nodata -> NaN); then ``geomedian_with_mads`` with its
multi-worker reshape strategy (``yxbt``: its ``mem`` default assumes one worker holding the whole input), eps 1e-4
and maxiters 1000 (rasterflow's defaults, geomad's float default). Prints one JSON line.
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
from odc.algo import enum_to_bool, erase_bad, geomedian_with_mads, to_float
from odc.geo.geobox import GeoBox

BANDS = ("red", "green", "nir", "swir16")
CHUNK = 1024


def main(items_json: str, output: str, bounds: tuple[float, ...]) -> None:
    started = time.perf_counter()
    cluster = LocalCluster(n_workers=2, threads_per_worker=1)
    client = Client(cluster)
    items = [pystac.Item.from_dict(f) for f in json.loads(Path(items_json).read_text())["features"]]
    geobox = GeoBox.from_bbox(bounds, crs="EPSG:32633", resolution=10)
    ds = odc.stac.load(items, bands=[*BANDS, "scl"], geobox=geobox, chunks={"x": CHUNK, "y": CHUNK})
    cloudy = enum_to_bool(ds.scl, (3, 8, 9, 10))
    reflectance = xr.Dataset({
        name: erase_bad(to_float(ds[name], scale=items[0].assets[name].extra_fields["raster:bands"][0]["scale"],
                                 offset=items[0].assets[name].extra_fields["raster:bands"][0]["offset"],
                                 dtype="float32"), cloudy, nodata=np.nan)
        for name in BANDS
    })
    gm = geomedian_with_mads(reflectance, reshape_strategy="yxbt", eps=1e-4, maxiters=1000)
    # its output chunks are 100 px within each 1024 block (odc-algo's internal block size): whole 1024 blocks for Zarr
    gm.chunk({"y": CHUNK, "x": CHUNK}).to_zarr(output, mode="w")
    elapsed = time.perf_counter() - started
    client.close()
    cluster.close()
    print(json.dumps({"job_seconds": elapsed, "variables": sorted(map(str, gm.data_vars))}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], tuple(float(v) for v in sys.argv[3:7]))
