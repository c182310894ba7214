"""Several statistics from one read against the median alone (issue 29, item 1): the wall of a run that writes the
median, p10, p90 and the count, over the wall of the same job writing the median only, interleaved rounds, one
process (``cluster.processes: false``), the sample COGs (``common.sample``). Every statistic is compared with NumPy
computed from the same pixels (``common.numpy_reference``'s reading, here for all four).

    .venv/bin/python benchmarks/multi_stat.py --size 2048 --dates 12 --rounds 3

Target: the four statistics <= 1.3x the wall of the median alone.
"""

from __future__ import annotations

import argparse
import json
import statistics as stats
import warnings
from pathlib import Path

import numpy as np

from common import DATA, DROP_CLASSES, check, compare, gb, measure, physical_window, sample, table, write_spec, \
    RASTERFLOW

LIST = "[{method: median}, {method: quantile, q: [0.1, 0.9]}, {method: count}]"


def _spec(catalog, folder: Path, name: str, reduce: str) -> Path:
    path = write_spec(catalog, folder / f"{name}.zarr", name=name, processes="false")
    text = path.read_text().replace("reduce: {over: time, method: median}", f"reduce: {reduce}")
    path.write_text(text)
    return path


def _reference(catalog) -> dict[str, np.ndarray]:
    """Median, p10, p90 and count of the masked NDVI, with rasterio + NumPy (whole tile in memory: small sizes)."""
    import rasterio

    items = json.loads(Path(catalog.items_json).read_text())["features"]
    items.sort(key=lambda item: (item["properties"]["datetime"], item["id"]))
    planes = {}
    for asset in ("red", "nir", "scl"):
        stack = []
        for item in items:
            with rasterio.open(item["assets"][asset]["href"]) as src:
                window = rasterio.windows.Window(0, 0, src.width, src.height)
                stack.append(physical_window(src, item, asset, window))
        planes[asset] = np.stack(stack)
    drop = np.isin(planes["scl"], DROP_CLASSES)
    red, nir = (np.where(drop, np.nan, planes[a]) for a in ("red", "nir"))
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ndvi = ((nir - red) / (nir + red)).astype(np.float32)
        return {"median": np.nanmedian(ndvi, axis=0),
                "q10": np.nanquantile(ndvi, 0.1, axis=0).astype(np.float32),
                "q90": np.nanquantile(ndvi, 0.9, axis=0).astype(np.float32),
                "count": (~np.isnan(ndvi)).sum(axis=0).astype(np.float32)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--dates", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    catalog = sample(args.size, args.dates)
    folder = DATA / f"statistics-{args.size}x{args.dates}"
    specs = {"median": _spec(catalog, folder, "median", "{method: median}"), "four": _spec(catalog, folder, "four", LIST)}
    walls: dict[str, list[float]] = {k: [] for k in specs}
    peaks: dict[str, list[int]] = {k: [] for k in specs}
    for _ in range(args.rounds):
        for key, spec in specs.items():
            m = check(measure([RASTERFLOW, "run", str(spec)]), f"rasterflow run {spec}")
            walls[key].append(m.wall)
            peaks[key].append(m.peak_rss)
    import xarray as xr

    expected = _reference(catalog)
    with xr.open_zarr(folder / "four.zarr") as ds:
        verdicts = {name: compare(ds[f"ndvi_{name}"].values.astype(np.float32), expected[name]) for name in expected}
    with xr.open_zarr(folder / "median.zarr") as ds:
        verdicts["median alone"] = compare(ds["ndvi"].values, expected["median"])
    rows = [[key, f"{stats.median(walls[key]):.2f} s", " ".join(f"{w:.1f}" for w in walls[key]),
             gb(max(peaks[key]))] for key in specs]
    print(f"\nmasked NDVI, {args.size}² x {args.dates} dates, one process, {args.rounds} rounds interleaved\n")
    print(table(rows, ["job", "wall (median)", "rounds", "peak RSS"]))
    ratio = stats.median(walls["four"]) / stats.median(walls["median"])
    print(f"\nmedian + p10 + p90 + count / median alone: {ratio:.2f}x (target <= 1.3x)")
    print("vs NumPy: " + ", ".join(f"{k} {v}" for k, v in verdicts.items()))


if __name__ == "__main__":
    main()
