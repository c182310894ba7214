"""Products (issue 29): (a) several statistics from one read against the median alone; (b) the geomedian + MADs
against odc-algo's ``geomedian_with_mads``.

(a) the wall of a run that writes the median, p10, p90 and the count, over the wall of the same job writing the
median only, interleaved rounds, one process (``cluster.processes: false``), the sample COGs (``common.sample``).
Every statistic is compared with NumPy computed from the same pixels.

    .venv/bin/python benchmarks/products.py statistics --size 2048 --dates 12 --rounds 3

Target: the four statistics <= 1.3x the wall of the median alone.

(b) the geomedian of red, green, nir and swir16 with MADs and count, cloud-masked by SCL: rasterflow (2 worker
processes x 1 thread) and odc-stac + odc-algo (``peers/odc_algo_geomedian.py``, the same cluster shape), one run
each; wall, peak RSS of the process tree, results compared (geomad starts each pixel from its row neighbour, so a
chunk layout moves values within the tolerance).

    .venv/bin/python benchmarks/products.py geomedian --size 4096 --dates 24

Targets: <= 0.75x odc-algo's wall and <= 0.25x its peak RSS. ``--no-peer``: rasterflow alone (odc-algo not
installed); the peak RSS of each worker process is printed beside the tree's.

(c) the whole tile x a season, rasterflow alone beside the 4096² x 24 run:

    .venv/bin/python benchmarks/products.py geomedian --season --size 10980 --dates 36

Targets: the peak per worker within 10 % of the 4096² run's, within the static budget.
"""

from __future__ import annotations

import argparse
import json
import statistics as stats
import warnings
from pathlib import Path

import numpy as np

from common import DATA, DROP_CLASSES, HERE, PYTHON, RASTERFLOW, check, compare, gb, measure, physical_window, \
    sample, table, write_spec

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


GEOMEDIAN = "{method: geomedian, bands: [red, green, nir, swir16], mads: true}"


def _geomedian_spec(catalog, folder: Path) -> Path:
    spec = write_spec(catalog, folder / "rf.zarr", name="gm")
    text = spec.read_text().replace("reduce: {over: time, method: median}", f"reduce: {GEOMEDIAN}")
    text = text.replace("assets: {red: red, nir: nir, scl: scl}",
                        "assets: {red: red, green: green, nir: nir, swir16: swir16, scl: scl}")
    spec.write_text(text)
    return spec


def geomedian(args: argparse.Namespace) -> None:
    """Part (b): rasterflow's geomedian + MADs against odc-algo's, one run each."""
    import xarray as xr

    if args.season:
        return geomedian_season(args)
    catalog = sample(args.size, args.dates)
    folder = DATA / f"geomedian-{args.size}x{args.dates}"
    spec = _geomedian_spec(catalog, folder)
    rf = check(measure([RASTERFLOW, "run", str(spec)]), "rasterflow geomedian")
    per_worker = ", ".join(gb(peak) for peak in sorted(rf.worker_peaks.values(), reverse=True)) or "(one process)"
    if args.no_peer:
        print(f"\ngeomedian + MADs, {args.size}² x {args.dates} dates x 4 bands, 2 workers x 1 thread, rasterflow "
              f"alone\n")
        print(table([["rasterflow", f"{rf.wall:.1f} s", gb(rf.peak_rss), per_worker]],
                    ["variant", "wall", "peak RSS (tree)", "peak RSS per worker"]))
        return None
    peer_out = folder / "odc.zarr"
    minx, miny, maxx, maxy = catalog.bounds
    peer = check(measure([PYTHON, str(HERE / "peers" / "odc_algo_geomedian.py"), str(catalog.items_json),
                          str(peer_out), str(minx), str(miny), str(maxx), str(maxy)], timeout=3600),
                 "odc-algo geomedian")
    with xr.open_zarr(folder / "rf.zarr") as ours, xr.open_zarr(peer_out) as theirs:
        verdicts = {}
        for name in ("red", "green", "nir", "swir16", "emad", "smad", "bcmad", "count"):
            a = ours[name].values.astype(np.float32)
            b = theirs[name].values.astype(np.float32)
            b = b.squeeze() if b.ndim > 2 else b
            same = np.isclose(a, b, rtol=0, atol=1e-3, equal_nan=True)
            verdicts[name] = f"{same.mean() * 100:.2f}% within 1e-3, {np.mean(a == b) * 100:.1f}% identical"
    rows = [["rasterflow", f"{rf.wall:.1f} s", gb(rf.peak_rss), per_worker],
            ["odc-stac + odc-algo", f"{peer.wall:.1f} s", gb(peer.peak_rss),
             ", ".join(gb(peak) for peak in sorted(peer.worker_peaks.values(), reverse=True)) or "-"]]
    print(f"\ngeomedian + MADs, {args.size}² x {args.dates} dates x 4 bands, 2 workers x 1 thread, one run each\n")
    print(table(rows, ["variant", "wall", "peak RSS (tree)", "peak RSS per worker"]))
    print(f"\nrasterflow / odc-algo: wall {rf.wall / peer.wall:.2f}x (target <= 0.75x), peak "
          f"{rf.peak_rss / peer.peak_rss:.2f}x (target <= 0.25x)")
    print("results: " + "; ".join(f"{k} {v}" for k, v in verdicts.items()))


def geomedian_season(args: argparse.Namespace) -> None:
    """Part (c): the geomedian + MADs of a whole tile x a season (``--size 10980 --dates 36``) beside the 4096² x 24
    run, rasterflow only (odc-algo holds the whole stack: ~70 GB here): each run's peak per worker (its run report's
    sampler) against the static budget's projection and the worker's limit, and the two peaks side by side."""
    rows, peaks = [], []
    for size, dates in ((4096, 24), (args.size, args.dates)):
        catalog = sample(size, dates)
        folder = DATA / f"geomedian-{size}x{dates}"
        spec = _geomedian_spec(catalog, folder)
        report_path = folder / "report.json"
        run = check(measure([RASTERFLOW, "run", str(spec), "--report", str(report_path)], timeout=4 * 3600),
                    f"rasterflow geomedian {size}")
        report = json.loads(report_path.read_text())
        worker = max(report["measured_peak_per_worker"].values())
        predicted = report["predicted_peak_per_worker"]
        peaks.append(worker)
        rows.append([f"{size}² x {dates}", f"{run.wall:.0f} s", gb(worker), gb(predicted),
                     f"{predicted / worker:.2f}", gb(report["memory_limit"] or 0), gb(run.peak_rss)])
    print("\ngeomedian + MADs, 4 bands, 2 workers x 1 thread, one run each\n")
    print(table(rows, ["job", "wall", "peak per worker", "budget's projection", "projected / measured",
                       "worker limit", "peak RSS (tree)"]))
    print(f"\npeak per worker {args.size}² / 4096²: {peaks[1] / peaks[0]:.2f}x (target: within 10%); both within "
          f"the static budget when projected / measured >= 1")


def statistics_part(args: argparse.Namespace) -> None:
    """Part (a): four statistics from one read against the median alone."""
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["statistics", "geomedian"])
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--dates", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--season", action="store_true",
                        help="geomedian (c): rasterflow alone at --size/--dates beside the 4096² x 24 run")
    parser.add_argument("--no-peer", action="store_true",
                        help="geomedian (b): rasterflow alone (odc-algo not installed; the peer's numbers in "
                             "benchmarks/README.md stand)")
    args = parser.parse_args()
    (statistics_part if args.part == "statistics" else geomedian)(args)


if __name__ == "__main__":
    main()
