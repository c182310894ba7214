"""The floor on this machine, and rasterflow's wall time as a multiple of it.

    python benchmarks/read_limit.py [--size 4096] [--rounds 3]

1. Read + decode: every input block of the job (red, nir, scl of every date, in 1024² windows) read with rasterio
   into uint16 arrays by one process per core, no arithmetic. The I/O + decompression floor.
2. Stages, single process, NumPy, chunk by chunk (1024²): read (as 1.), mask + NDVI (float32, NaN for nodata and
   masked classes, as the NumPy reference of the tests), and the median over time, with ``np.nanmedian`` and with
   ``bottleneck.nanmedian`` (the kernel rasterflow uses; equal results, checked here).
   ideal = (read + mask/NDVI + median) / cores: perfect parallelism with no overhead at all.
3. ``rasterflow run`` on the same job (fresh process; median of the rounds): the whole process, and its
   ``compute+write`` stage (the part the ideal describes: no interpreter start, imports or cluster start).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from common import CHUNK, DATA, DROP_CLASSES, gb, run_rasterflow, sample, table, write_spec

ASSETS = ("red", "nir", "scl")


def _hrefs(items_json: str) -> list[list[str]]:
    items = json.loads(Path(items_json).read_text())["features"]
    return [[item["assets"][a]["href"] for a in ASSETS] for item in items]


def _scale_offset(items_json: str) -> list[tuple[float, float]]:
    item = json.loads(Path(items_json).read_text())["features"][0]
    band = item["assets"]["red"]["raster:bands"][0]
    return band["scale"], band["offset"]


def _windows(size: int):
    from rasterio.windows import Window

    return [Window(c, r, min(CHUNK, size - c), min(CHUNK, size - r))
            for r in range(0, size, CHUNK) for c in range(0, size, CHUNK)]


_DATASETS: list = []
_TILES: list = []


def _open(hrefs: list[list[str]], decoder: str = "gdal") -> None:
    """Open every file in this process: with rasterio (``decoder`` "gdal"), or their tile indexes for rasterflow's
    own tile decoder (``"tiles"``: ``rasterflow.read.tiles``, tifffile + imagecodecs, what rasterflow reads local
    tiled COGs with)."""
    import rasterio

    _DATASETS[:] = [[rasterio.open(h) for h in row] for row in hrefs]
    _TILES[:] = []
    if decoder == "tiles":
        from rasterflow.read.tiles import tile_index

        _TILES[:] = [[tile_index(ds.name, band_count=ds.count, dtype=np.dtype(ds.dtypes[0]), shape=ds.shape,
                                 block_shape=tuple(ds.block_shapes[0])) for ds in row] for row in _DATASETS]
        assert all(index is not None for row in _TILES for index in row), "files the tile decoder does not take"


def _read(window) -> np.ndarray:
    """(time, asset, y, x) uint16 of one window; no arithmetic."""
    out = np.empty((len(_DATASETS), len(ASSETS), window.height, window.width), dtype=np.uint16)
    if _TILES:
        from rasterflow.read.tiles import read_window

        for t, row in enumerate(_TILES):
            for a, index in enumerate(row):
                assert read_window(index, window.row_off, window.col_off, out[t, a])
        return out
    for t, row in enumerate(_DATASETS):
        for a, ds in enumerate(row):
            ds.read(1, window=window, out=out[t, a])
    return out


def _read_count(window) -> int:
    return _read(window).nbytes


def read_floor(hrefs, size: int, cores: int, decoder: str = "gdal") -> tuple[float, int]:
    """Wall time of reading every block with one process per core (pool started and files opened beforehand), with
    GDAL or rasterflow's tile decoder (``decoder``, see :func:`_open`)."""
    windows = _windows(size)
    with ProcessPoolExecutor(cores, initializer=_open, initargs=(hrefs, decoder)) as pool:
        list(pool.map(int, range(cores)))  # start the processes
        started = time.perf_counter()
        nbytes = sum(pool.map(_read_count, windows))
        return time.perf_counter() - started, nbytes


def mask_ndvi(block: np.ndarray, scale: float, offset: float) -> np.ndarray:
    """The reference computation: float32, nodata -> NaN, scale/offset, masked classes -> NaN, NDVI."""
    def reflectance(raw):
        values = raw.astype(np.float32)
        values[raw == 0] = np.nan
        return values * np.float32(scale) + np.float32(offset)

    red, nir = reflectance(block[:, 0]), reflectance(block[:, 1])
    drop = np.isin(block[:, 2], DROP_CLASSES)
    red[drop] = np.nan
    nir[drop] = np.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        return (nir - red) / (nir + red)


def stage_timings(hrefs, size: int, scale: float, offset: float) -> dict[str, float]:
    import warnings

    import bottleneck as bn

    _open(hrefs)
    times = {"read": 0.0, "mask + NDVI": 0.0, "np.nanmedian": 0.0, "bottleneck.nanmedian": 0.0}
    for window in _windows(size):
        t0 = time.perf_counter()
        block = _read(window)
        t1 = time.perf_counter()
        ndvi = mask_ndvi(block, scale, offset)
        t2 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            expected = np.nanmedian(ndvi, axis=0)
        t3 = time.perf_counter()
        fast = bn.nanmedian(ndvi, axis=0)
        t4 = time.perf_counter()
        np.testing.assert_array_equal(fast, expected)
        for key, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            times[key] += dt
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    os.environ.setdefault("GDAL_CACHEMAX", "64")  # one pass over the data: GDAL's block cache cannot help here
    catalog = sample(args.size)
    hrefs = _hrefs(str(catalog.items_json))
    scale, offset = _scale_offset(str(catalog.items_json))

    floors, stages, rf_walls, rf_jobs, rf_peaks = [], [], [], [], []
    spec = write_spec(catalog, DATA / "read_limit" / f"rasterflow_{args.size}.zarr")
    for r in range(args.rounds):  # interleaved, so that load from elsewhere on the machine hits all alike
        wall, nbytes = read_floor(hrefs, args.size, cores)
        floors.append(wall)
        stages.append(stage_timings(hrefs, args.size, scale, offset))
        m = run_rasterflow(spec, DATA / "read_limit" / "worker-stats")
        rf_walls.append(m.wall)
        rf_jobs.append(m.info["report"]["stage_seconds"]["compute+write"])
        rf_peaks.append(m.peak_rss)
        print(f"  round {r + 1}: read floor {wall:.2f} s, stages "
              + ", ".join(f"{k} {v:.2f} s" for k, v in stages[-1].items())
              + f"; rasterflow {m.wall:.2f} s (compute+write {rf_jobs[-1]:.2f} s)", flush=True)

    stage = {key: statistics.median(s[key] for s in stages) for key in stages[0]}
    floor = statistics.median(floors)
    ideal_np = (stage["read"] + stage["mask + NDVI"] + stage["np.nanmedian"]) / cores
    ideal_bn = (stage["read"] + stage["mask + NDVI"] + stage["bottleneck.nanmedian"]) / cores
    rf_wall, rf_job = statistics.median(rf_walls), statistics.median(rf_jobs)
    print()
    print(f"{args.size}² x {len(hrefs)} dates x {len(ASSETS)} assets ({nbytes / 1e9:.2f} GB decoded), {cores} cores, "
          f"median of {args.rounds} rounds")
    rows = [["read + decode, all cores (floor)", f"{floor:.2f} s", f"{nbytes / floor / 1e9:.2f} GB/s decoded"]]
    rows += [[f"stage, 1 process: {key}", f"{value:.2f} s", ""] for key, value in stage.items()]
    rows += [[f"ideal with np.nanmedian (sum / {cores})", f"{ideal_np:.2f} s", ""],
             [f"ideal with bottleneck (sum / {cores})", f"{ideal_bn:.2f} s", ""],
             ["rasterflow run, whole process", f"{rf_wall:.2f} s",
              f"{rf_wall / ideal_np:.2f}x / {rf_wall / ideal_bn:.2f}x ideal (np / bn); peak {gb(max(rf_peaks))}"],
             ["rasterflow run, compute+write stage", f"{rf_job:.2f} s",
              f"{rf_job / ideal_np:.2f}x / {rf_job / ideal_bn:.2f}x ideal (np / bn)"]]
    print(table(rows, ["what", "time", "note"]))
    print("target: rasterflow <= 1.3x the ideal")


if __name__ == "__main__":
    main()
