"""``rasterflow plan`` at continental scale (issue 13, step 4): plan time and client memory for many tiles × a year.

Generates a local items file (NDJSON) of synthetic Sentinel-2 L2A-like items with the structure of
:mod:`rasterflow.sample`'s (red/nir/scl, ``raster:bands``, ``proj:*`` per asset, each tile in its own UTM zone), a
spec whose grid (EPSG:3035, 10 m) covers all tiles, and runs ``rasterflow plan`` on it in a fresh process: wall
time and peak RSS of that process. The hrefs point into a directory that does not exist: plan must take every
number it prints from the declared metadata, and the one header it tries (the tile-shape advice) fails at once.

Usage::

    python benchmarks/plan_scale.py                 # 1x1 .. 1000 tiles × 73 dates (one year, 5-day revisit)
    python benchmarks/plan_scale.py --tiles 100 --profile   # cProfile of the planning, in this process

Data goes to ``benchmarks/.data/plan_scale/`` (git-ignored).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / ".data" / "plan_scale"
RASTERFLOW = str(Path(sys.executable).with_name("rasterflow"))

TILE_PX = 10980
"""Pixels per side of an MGRS tile at 10 m."""
RES = 10.0
GRID_CRS = "EPSG:3035"
GRID_ORIGIN = (3_500_000.0, 2_000_000.0)
"""Lower-left corner of the tile layout in EPSG:3035 (central Europe's west/south)."""
START = dt.date(2024, 1, 1)
REVISIT_DAYS = 5
MISSING_ROOT = "/nonexistent/rasterflow-plan-scale"
"""Where the hrefs point: no file exists there (plan must not need any)."""


def tile_layout(n_tiles: int) -> tuple[int, int]:
    """(rows, cols) of a near-2:3 layout with at least ``n_tiles`` tiles (1000 -> 25 × 40)."""
    rows = max(1, round(math.sqrt(n_tiles * 2 / 3)))
    cols = math.ceil(n_tiles / rows)
    return rows, cols


def _tiles(rows: int, cols: int) -> list[dict]:
    """Per tile: UTM zone, UTM transform (snapped to 10 m), WGS84 bbox/geometry, centre longitude."""
    from pyproj import Transformer

    to_wgs = Transformer.from_crs(GRID_CRS, "EPSG:4326", always_xy=True)
    step = TILE_PX * RES * 0.9  # tiles overlap by 10%, as MGRS tiles do
    out = []
    for r in range(rows):
        for c in range(cols):
            x0, y0 = GRID_ORIGIN[0] + c * step, GRID_ORIGIN[1] + r * step
            x1, y1 = x0 + TILE_PX * RES, y0 + TILE_PX * RES
            west, south, east, north = to_wgs.transform_bounds(x0, y0, x1, y1, densify_pts=5)
            lon = (west + east) / 2
            zone = min(60, max(1, int((lon + 180) // 6) + 1))
            epsg = 32600 + zone
            to_utm = Transformer.from_crs("EPSG:4326", f"EPSG:{epsg}", always_xy=True)
            ux, uy = to_utm.transform((west + east) / 2, (south + north) / 2)
            ux = math.floor((ux - TILE_PX * RES / 2) / RES) * RES
            uy = math.ceil((uy + TILE_PX * RES / 2) / RES) * RES
            out.append({
                "mgrs": f"{zone:02d}T{r:02d}{c:02d}", "epsg": epsg, "transform": [RES, 0.0, ux, 0.0, -RES, uy],
                "bbox": [round(v, 6) for v in (west, south, east, north)], "lon": lon,
                "geometry": {"type": "Polygon", "coordinates": [[[west, south], [east, south], [east, north],
                                                                 [west, north], [west, south]]]},
            })
    return out


def make_items(n_tiles: int, n_dates: int) -> list[dict]:
    """``n_tiles`` × ``n_dates`` items, in the structure of :func:`rasterflow.sample.items.item_dict` (three
    assets)."""
    rows, cols = tile_layout(n_tiles)
    tiles = _tiles(rows, cols)[:n_tiles]
    items = []
    for d in range(n_dates):
        for tile in tiles:
            # neighbouring orbits pass on different days: a tile's column decides its day within the revisit
            day = START + dt.timedelta(days=d * REVISIT_DAYS + int(tile["mgrs"][-2:]) % REVISIT_DAYS)
            item_id = f"S2X_{tile['mgrs']}_{day:%Y%m%d}"
            proj = {"proj:epsg": tile["epsg"], "proj:shape": [TILE_PX, TILE_PX], "proj:transform": tile["transform"]}
            assets = {}
            for key, dtype, wavelength in (("red", "uint16", 0.665), ("nir", "uint16", 0.842), ("scl", "uint8", None)):
                asset = {"href": f"{MISSING_ROOT}/{item_id}/{key}.tif",
                         "type": "image/tiff; application=geotiff; profile=cloud-optimized", "roles": ["data"], **proj}
                if wavelength is not None:
                    asset["eo:bands"] = [{"name": key, "common_name": key, "center_wavelength": wavelength}]
                    asset["raster:bands"] = [{"nodata": 0, "data_type": dtype, "scale": 0.0001, "offset": -0.1}]
                else:
                    asset["raster:bands"] = [{"nodata": 0, "data_type": dtype}]
                assets[key] = asset
            items.append({
                "type": "Feature", "stac_version": "1.0.0", "id": item_id, "collection": "sentinel-2-l2a",
                "geometry": tile["geometry"], "bbox": tile["bbox"],
                "properties": {"datetime": f"{day.isoformat()}T10:30:00Z", "s2:mgrs_tile": tile["mgrs"],
                               "s2:processing_baseline": "05.10", "eo:cloud_cover": 10.0, **proj},
                "links": [], "assets": assets,
            })
    return items


def grid_bounds(n_tiles: int) -> tuple[float, float, float, float]:
    """The EPSG:3035 bounds that cover the layout's tiles."""
    rows, cols = tile_layout(n_tiles)
    step = TILE_PX * RES * 0.9
    cols = min(cols, n_tiles)
    rows = math.ceil(n_tiles / cols)
    return (GRID_ORIGIN[0], GRID_ORIGIN[1], GRID_ORIGIN[0] + (cols - 1) * step + TILE_PX * RES,
            GRID_ORIGIN[1] + (rows - 1) * step + TILE_PX * RES)


def spec_text(items_path: Path, n_tiles: int, n_dates: int, *, chunk: int = 2048, resolution: float = RES,
              name: str = "plan-scale") -> str:
    """A masked NDVI median over the layout, grouped by solar day, to Zarr."""
    bounds = grid_bounds(n_tiles)
    end = START + dt.timedelta(days=n_dates * REVISIT_DAYS + REVISIT_DAYS)
    return f"""\
version: 1
name: {name}
source:
  stac:
    catalog: {items_path}
    collections: [sentinel-2-l2a]
    bbox: [-30, 20, 60, 80]
    datetime: {START.isoformat()}/{end.isoformat()}
  assets: {{red: red, nir: nir, scl: scl}}
  group_by: solar_day
grid:
  crs: {GRID_CRS}
  resolution: {resolution:g}
  bounds: [{", ".join(f"{b:.0f}" for b in bounds)}]
  dtype: float32
chunks: {{time: -1, y: {chunk}, x: {chunk}}}
mask: "scl in (0, 3, 8, 9, 10)"
bands:
  ndvi: "(nir - red) / (nir + red)"
reduce:
  over: time
  method: median
output:
  path: {items_path.parent / 'out.zarr'}
budget:
  on_exceed: warn
"""


def write_job(folder: Path, n_tiles: int, n_dates: int, **spec_kw) -> Path:
    """Items file and spec for ``n_tiles`` × ``n_dates`` in ``folder`` (reused when present); the spec's path."""
    folder.mkdir(parents=True, exist_ok=True)
    items_path = folder / "items.ndjson"
    if not items_path.exists():
        tmp = items_path.with_suffix(".tmp")
        with tmp.open("w", encoding="utf-8") as fh:
            for item in make_items(n_tiles, n_dates):
                fh.write(json.dumps(item, separators=(",", ":")) + "\n")
        tmp.replace(items_path)
    spec = folder / "spec.yaml"
    spec.write_text(spec_text(items_path, n_tiles, n_dates, **spec_kw), encoding="utf-8")
    return spec


def run_plan(spec: Path) -> dict:
    """``rasterflow plan --json`` in a fresh process: wall seconds, peak RSS (MB), exit code, the payload."""
    import psutil

    started = time.perf_counter()
    proc = subprocess.Popen([RASTERFLOW, "plan", "--json", str(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        p = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                peak = max(peak, p.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - started
    done.set()
    watcher.join()
    payload = json.loads(out) if out.strip().startswith("{") else {}
    return {"wall": wall, "peak_mb": peak / 1e6, "code": proc.returncode, "payload": payload, "stderr": err}


def profile(spec: Path, top: int = 25) -> None:
    """cProfile of ``plan_command`` in this process (the CLI's work without the interpreter start)."""
    import cProfile
    import pstats

    from rasterflow.commands import plan_command
    from rasterflow.spec import load_spec

    loaded = load_spec(spec)
    prof = cProfile.Profile()
    started = time.perf_counter()
    prof.runcall(plan_command, loaded)
    print(f"plan_command: {time.perf_counter() - started:.2f} s")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(top)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiles", type=int, nargs="*", default=[10, 100, 1000])
    parser.add_argument("--dates", type=int, default=73, help="dates per tile (73: a year at 5-day revisit)")
    parser.add_argument("--chunk", type=int, default=2048)
    parser.add_argument("--profile", action="store_true", help="cProfile the planning of the largest job")
    args = parser.parse_args(argv)
    rows = []
    for n in args.tiles:
        t0 = time.perf_counter()
        spec = write_job(DATA / f"t{n}_d{args.dates}", n, args.dates, chunk=args.chunk)
        made = time.perf_counter() - t0
        if args.profile:
            profile(spec)
            continue
        result = run_plan(spec)
        budget = result["payload"].get("budget", {})
        print(f"{n} tiles x {args.dates} dates: items file ready in {made:.1f} s; plan exit {result['code']} in "
              f"{result['wall']:.2f} s, peak {result['peak_mb']:.0f} MB", flush=True)
        if result["code"] not in (0, 3):
            print(result["stderr"][-2000:])
        stages = budget.get("stages") or [{}]
        print(f"  per task: {stages[0].get('detail', '?')}; peak per worker {budget.get('peak_per_worker', 0) / 1e9:.2f} "
              f"GB of {budget.get('memory_limit', 0) / 1e9:.2f} GB", flush=True)
        for refusal in budget.get("refusals", []):
            print(f"  refused: {refusal}", flush=True)
        rows.append((n * args.dates, n, result["wall"], result["peak_mb"], budget.get("task_count"),
                     result["payload"].get("grid", {}).get("shape")))
    if rows:
        print("| items | tiles | grid (px) | tasks | plan wall (s) | client peak RSS (MB) |")
        print("|------:|------:|----------:|------:|--------------:|---------------------:|")
        for items, tiles, wall, peak, tasks, shape in rows:
            grid = f"{shape[0]:,} × {shape[1]:,}" if shape else "?"
            print(f"| {items:,} | {tiles:,} | {grid} | {tasks or 0:,} | {wall:.2f} | {peak:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
