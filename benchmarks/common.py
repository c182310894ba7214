"""Shared pieces of the benchmark scripts: sample data, the rasterflow spec, and measuring a subprocess.

The job everywhere: masked NDVI median over time of the synthetic Sentinel-2-like scenes of
:mod:`rasterflow.sample` (8 dates, one tile of ``size`` x ``size`` pixels), written to Zarr.
Generated data lives under ``benchmarks/.data/`` (git-ignored); a sample is generated once and reused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA = HERE / ".data"
PYTHON = sys.executable
RASTERFLOW_VENV = DATA / "rf-venv"
"""rasterflow as a user installs it: a venv with ``pip install -e .`` and nothing else (make it with
``python -m venv benchmarks/.data/rf-venv && benchmarks/.data/rf-venv/bin/pip install -e .``). The benchmark venv
also holds the peers' libraries, and rasterflow's libraries import some of them when they are there (dask.array
imports scipy.sparse, which odc-algo brought; rasterio imports boto3, which moto brought): 0.3-0.5 s of start-up
that no user pays. Each tool runs from its own install, as GDAL does from ``gdal-venv``; without this venv rasterflow
runs from the benchmark's (and the scripts say so)."""
RASTERFLOW = str(RASTERFLOW_VENV / "bin" / "rasterflow") if (RASTERFLOW_VENV / "bin" / "rasterflow").exists() \
    else str(Path(sys.executable).with_name("rasterflow"))

N_DATES = 8
DROP_CLASSES = (3, 8, 9, 10)  # cloud shadow, cloud medium/high, cirrus (SCL 0 is nodata and already NaN)
CHUNK = 1024
"""Spatial chunk of every variant: the stackstac default, two 512-pixel COG tiles per side."""

GDAL_CACHEMAX = "64MB"
"""GDAL's block cache of the GDAL peer (its VRT + calc pipeline reads blocks through it; 64MB measured best for it,
see compare_peers.py). rasterflow runs with its default, ``cluster.gdal_cachemax: auto``: on these samples (grid =
the tile, chunks of whole 512² tiles) every block is decoded once, so ``plan`` gives each worker 16 MB (a larger
cache only fills: up to the old default of 256 MB per worker, +0.4 GB for the process tree). Until 2026-12-04 the
rasterflow spec here set 64MB explicitly."""

WORKER_STATS_PRELOAD = HERE / "worker_stats.py"
"""A Dask worker preload that writes the worker's task and transfer counters when it closes (for rasterflow,
whose CLI does not print them); the peer scripts ask their workers directly with :func:`worker_stats`."""


def sample(size: int, n_dates: int = N_DATES):
    """The ``n_dates``-date sample (default 8) with one ``size``² tile, generated on first use."""
    from rasterflow.sample import generate_sample

    started = time.perf_counter()
    where = DATA / (f"s{size}" if n_dates == N_DATES else f"s{size}x{n_dates}")
    catalog = generate_sample(where, size=size, n_dates=n_dates)
    elapsed = time.perf_counter() - started
    if elapsed > 2:
        print(f"(generated the {size}² sample in {elapsed:.0f} s)", flush=True)
    return catalog


def write_spec(catalog, output: Path, *, name: str = "bench", processes: str | None = None,
               method: str | None = "median", time_chunk: int = -1) -> Path:
    """The rasterflow spec of the job over ``catalog``; every item, the whole tile, written to ``output``.

    ``processes``: the spec's ``cluster.processes`` (``"true"``, ``"false"``, ``"auto"``); None leaves it out (then
    ``n_workers: 2`` means two worker processes). ``method`` and ``time_chunk`` (``chunks.time``; a median needs
    time whole, a mean with time in chunks runs the tree path; no ``method``: the series itself)."""
    cluster = "n_workers: 2, threads_per_worker: 1"
    if processes is not None:
        cluster += f", processes: {processes}"
    reduce = f"reduce: {{over: time, method: {method}}}\n" if method else ""
    minx, miny, maxx, maxy = catalog.bounds
    w, s, e, n = catalog.bbox_wgs84
    text = f"""\
version: 1
name: {name}
source:
  stac:
    catalog: {catalog.items_json}
    collections: [sentinel-2-l2a-sample]
    bbox: [{w - 0.01}, {s - 0.01}, {e + 0.01}, {n + 0.01}]
    datetime: 2024-01-01/2025-12-31  # every item of the sample: 24 or 36 dates run into 2025
  assets: {{red: red, nir: nir, scl: scl}}
grid:
  crs: EPSG:32633
  resolution: 10
  bounds: [{minx}, {miny}, {maxx}, {maxy}]
  dtype: float32
chunks: {{time: {time_chunk}, y: {CHUNK}, x: {CHUNK}}}
mask: "scl in {DROP_CLASSES}"
bands:
  ndvi: "(nir - red) / (nir + red)"
{reduce}output: {{path: {output}, overwrite: true}}
cluster: {{{cluster}}}
"""
    path = output.with_suffix(".yaml")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --------------------------------------------------------------------------------------------------------------------
# Measuring one subprocess: wall time and the peak RSS of its whole process tree


def _tree_rss(root) -> int:
    import psutil

    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


@dataclass
class Measurement:
    wall: float
    peak_rss: int
    returncode: int
    stdout: str
    stderr: str
    info: dict = field(default_factory=dict)
    """The last JSON line the process printed (``{...}``), if any."""
    worker_peaks: dict = field(default_factory=dict)
    """pid -> peak RSS of each worker process (multiprocessing's spawned children) seen while sampling."""


def measure(cmd: list[str], *, env: dict | None = None, interval: float = 0.05, timeout: float = 900) -> Measurement:
    """Run ``cmd`` and sample the RSS of it and all its descendants every ``interval`` s until it exits.

    RSS is summed over processes (shared pages count once per process, the same way for every variant).
    """
    import psutil

    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    root = psutil.Process(proc.pid)
    peak = 0
    workers: dict[int, int] = {}
    done = threading.Event()

    def sampler() -> None:
        nonlocal peak
        while not done.is_set():
            try:
                peak = max(peak, _tree_rss(root))
                for child in root.children(recursive=True):
                    try:
                        if "spawn_main" in " ".join(child.cmdline()):
                            workers[child.pid] = max(workers.get(child.pid, 0), child.memory_info().rss)
                    except (psutil.NoSuchProcess, psutil.AccessDenied):
                        pass
            except psutil.NoSuchProcess:
                return
            done.wait(interval)

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        wall = time.perf_counter() - started
        done.set()
        thread.join()
    info = {}
    for line in stdout.splitlines():
        if line.startswith("{") and line.endswith("}"):
            info = json.loads(line)
    return Measurement(wall, peak, proc.returncode, stdout, stderr, info, dict(workers))


def check(m: Measurement, what: str) -> Measurement:
    if m.returncode != 0:
        raise SystemExit(f"{what} failed ({m.returncode}):\n{m.stdout[-2000:]}\n{m.stderr[-4000:]}")
    return m


def run_rasterflow(spec: Path, stats_dir: Path) -> Measurement:
    """``rasterflow run SPEC`` in a fresh process; ``info`` gets per-worker counters and the run report."""
    stats_dir.mkdir(parents=True, exist_ok=True)
    for old in stats_dir.glob("*.json"):
        old.unlink()
    env = {"DASK_DISTRIBUTED__WORKER__PRELOAD": json.dumps([str(WORKER_STATS_PRELOAD)]),
           "RASTERFLOW_BENCH_STATS": str(stats_dir)}
    m = check(measure([RASTERFLOW, "run", str(spec)], env=env), f"rasterflow run {spec}")
    workers = [json.loads(p.read_text()) for p in sorted(stats_dir.glob("*.json"))]
    output = spec.with_suffix(".zarr")
    report = json.loads(Path(str(output) + ".report.json").read_text())
    m.info = {"workers": workers, "transfer_bytes": sum(w["incoming_bytes"] for w in workers),
              "executed": [w["executed"] for w in workers], "report": report}
    return m


def read_result(path: Path, var: str = "ndvi") -> np.ndarray:
    """The result of a variant: the Zarr variable ``var``, or band 1 of a GeoTIFF (the GDAL peer)."""
    if Path(path).suffix.lower() in (".tif", ".tiff"):
        import rasterio

        with rasterio.open(path) as src:
            return src.read(1)
    import xarray as xr

    with xr.open_zarr(path, consolidated=None) as ds:
        return ds[var].values


def physical_window(src, item: dict, asset: str, window) -> np.ndarray:
    """One window of an open source file as float32 physical values: nodata -> NaN, the item's declared
    ``raster:bands`` scale and offset applied (the reference's reading, independent of rasterflow's reader)."""
    raw = src.read(1, window=window)
    values = raw.astype(np.float32)
    if src.nodata is not None:
        values[raw == src.nodata] = np.nan
    band = (item["assets"][asset].get("raster:bands") or [{}])[0]
    scale, offset = band.get("scale", 1.0), band.get("offset", 0.0)
    if scale != 1 or offset != 0:
        values = values * np.float32(scale) + np.float32(offset)
    return values


def numpy_reference(catalog, rows: int = 256, method: str = "median") -> np.ndarray:
    """The job computed independently with rasterio + NumPy, as ``tests/reference.py`` does it, in strips of
    ``rows`` rows (bounded memory at 8192²): every item, each asset read raw, nodata -> NaN, ``raster:bands``
    scale and offset in float32, SCL classes dropped, NDVI in float32, ``np.nanmedian`` over time (``method``
    ``"mean"``: ``np.nanmean`` in float64, then float32).

    Cached as ``reference-<method>.npy`` in the sample's directory (the sample is deterministic)."""
    import warnings

    import rasterio
    from rasterio.windows import Window

    reduce = {"median": lambda a: np.nanmedian(a, axis=0),
              "mean": lambda a: np.nanmean(a.astype(np.float64), axis=0).astype(np.float32)}[method]
    cache = Path(catalog.directory) / f"reference-{method}.npy"
    if cache.exists():
        return np.load(cache)
    items = json.loads(Path(catalog.items_json).read_text())["features"]
    items.sort(key=lambda item: (item["properties"]["datetime"], item["id"]))
    files = {a: [rasterio.open(item["assets"][a]["href"]) for item in items] for a in ("red", "nir", "scl")}
    try:
        height, width = files["red"][0].height, files["red"][0].width
        out = np.empty((height, width), dtype=np.float32)
        for row in range(0, height, rows):
            window = Window(0, row, width, min(rows, height - row))
            planes = {}
            for asset, sources in files.items():
                stack = []
                for item, src in zip(items, sources):
                    stack.append(physical_window(src, item, asset, window))
                planes[asset] = np.stack(stack)
            drop = np.isin(planes["scl"], DROP_CLASSES)
            red = np.where(drop, np.nan, planes["red"])
            nir = np.where(drop, np.nan, planes["nir"])
            with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN pixels
                ndvi = ((nir - red) / (nir + red)).astype(np.float32)
                out[row:row + window.height] = reduce(ndvi)
    finally:
        for sources in files.values():
            for src in sources:
                src.close()
    np.save(cache, out)
    return out


def numpy_series_strips(catalog, rows: int = 256, strips: int = 2) -> dict[int, np.ndarray]:
    """The series itself (no reduction: masked NDVI per date, ``(time, rows, width)``) for ``strips`` strips of
    ``rows`` rows spread down the tile, keyed by their first row: a whole season's series (4.3 GB at 5490² x 36) is
    compared strip by strip. Computed as :func:`numpy_reference` reads, with rasterio + NumPy."""
    import warnings

    import rasterio
    from rasterio.windows import Window

    items = json.loads(Path(catalog.items_json).read_text())["features"]
    items.sort(key=lambda item: (item["properties"]["datetime"], item["id"]))
    files = {a: [rasterio.open(item["assets"][a]["href"]) for item in items] for a in ("red", "nir", "scl")}
    out: dict[int, np.ndarray] = {}
    try:
        height, width = files["red"][0].height, files["red"][0].width
        for row in sorted({min(height - rows, k * (height // strips)) for k in range(strips)}):
            window = Window(0, row, width, rows)
            planes = {asset: np.stack([physical_window(src, item, asset, window) for item, src in zip(items, sources)])
                      for asset, sources in files.items()}
            drop = np.isin(planes["scl"], DROP_CLASSES)
            red = np.where(drop, np.nan, planes["red"])
            nir = np.where(drop, np.nan, planes["nir"])
            with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                out[row] = ((nir - red) / (nir + red)).astype(np.float32)
    finally:
        for sources in files.values():
            for src in sources:
                src.close()
    return out


def compare_strips(path: Path, strips: dict[int, np.ndarray], var: str = "ndvi") -> str:
    """:func:`compare` of a Zarr series' rows with :func:`numpy_series_strips`' strips: ``identical`` or the first
    difference."""
    import xarray as xr

    with xr.open_zarr(path, consolidated=None) as ds:
        for row, expected in strips.items():
            found = compare(ds[var][:, row:row + expected.shape[1], :].values, expected)
            if found != "identical":
                return f"rows {row}+: {found}"
    return "identical"


def compare(actual: np.ndarray, expected: np.ndarray) -> str:
    """``identical`` (bit for bit, NaN where NaN), else the largest difference."""
    if actual.shape != expected.shape:
        return f"shape {actual.shape} != {expected.shape}"
    if not np.array_equal(np.isnan(actual), np.isnan(expected)):
        return f"NaN patterns differ ({int((np.isnan(actual) != np.isnan(expected)).sum())} px)"
    try:
        np.testing.assert_array_equal(actual, expected)
        return "identical"
    except AssertionError:
        diff = np.nanmax(np.abs(actual.astype(np.float64) - expected))
        return f"max |diff| {diff:.2e}"


def gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f} GB"


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])
