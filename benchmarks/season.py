"""A season on one machine (issue 13, step 1): one tile x many dates, rasterflow vs the peers vs the floor.

Generates (``rasterflow.sample``, once, into ``benchmarks/.data/season-<size>x<dates>/``) one ``size``² tile x
``dates`` dates (every 5 days: 36 dates = one 6-month season) of red / green / nir / swir16 / SCL as tiled (512²)
ZSTD COGs, then runs the masked NDVI median of ``common.write_spec`` (red, nir, scl; chunks 1024² x the whole time
axis; 2 workers x 1 thread) side by side, one fresh process per run, one run each, in this order:

- the read + decode floor of the same files (``read_limit.read_floor`` in a child process: every 1024² block of
  red / nir / scl of every date read and decoded once, one process per core, no arithmetic),
- ``rasterflow`` to Zarr and to COG (the same spec, ``output.path`` ``.zarr`` / ``.tif``),
- the Dask peers of ``compare_peers.py`` (``--peers``, default the strongest: odc-stac time-whole + odc-algo),
- GDAL (``peers/gdal_median.py``) when its venv exists (``benchmarks/.data/gdal-venv``, see compare_peers.py).

With ``--scaling`` (the default) the same rasterflow spec first runs on the 8-date samples of ``scaling.py`` (1x,
2x, 4x, 8x of ``--scaling-base``²), so that one table shows 1x, 2x, 4x, 8x and the season at the same chunking and
cluster shape, from the same run.

Reported per variant: wall time; peak RSS of the process tree (psutil, every 50 ms, summed over the process and
all its descendants); the largest single process's peak RSS (for the Dask variants a worker; rasterflow's own run
report's ``measured_peak_per_worker`` is shown beside it); bytes moved between workers (rasterflow: the
worker-stats preload; peers: what their scripts print); spill (every Dask variant gets its own
``DASK_TEMPORARY_DIRECTORY``, whose size is sampled once a second: the most that was on disk; rasterflow also
reports ``spilled_bytes``); what the workers logged about memory (pausing, spilling, restarts); and the result
against a NumPy reference. A variant that fails or times out (``--timeout``; its whole process group is killed) is
written into the table as such, not dropped.

The reference is computed blockwise (windows of 512 rows x 1024 columns, aligned to the COG tiles; two processes),
as ``common.numpy_reference`` computes it (rasterio reads, nodata -> NaN, ``raster:bands`` scale and offset in
float32, SCL 3/8/9/10 dropped, NDVI in float32, ``np.nanmedian`` over time), into a ``.npy`` memmap cached in the
sample's directory (``reference-median.npy``, the cache name ``common.numpy_reference`` uses); every result is
compared with it window by window, so the driver never holds a whole band.

Status: run on 2026-12-03 at the full tile, 10980² x 36 (commit d469468, quiet machine; benchmarks/README.md,
"Season on one machine"): every result identical to the reference (GDAL within 3.3e-7); rasterflow -> Zarr 314 s,
0.61x odc-stac+algo's and 0.45x GDAL's wall; peak per worker 0.39 GB vs 0.33 GB for the 4096² x 8 job (+19%, target
10%: not met, the open files grow with the dates); wall 9.0x the read + decode floor (target 1.5x: not met, the
per-pixel mask/NDVI/median is the cost).

Usage::

    python benchmarks/season.py                                    # 10980² x 36 (~1 h to generate, 32 min to run, quiet)
    python benchmarks/season.py --size 1024 --dates 12 --no-peers  # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import CHUNK, DATA, DROP_CLASSES, GDAL_CACHEMAX, PYTHON, RASTERFLOW, WORKER_STATS_PRELOAD, gb, sample, \
    physical_window, table, write_spec  # noqa: E402
from compare_peers import DASK_PEERS, DEFAULT_GDAL_PYTHON, GDAL_SCRIPT  # noqa: E402
from scaling import FACTORS, side  # noqa: E402

EVERY_DAYS = 5
ASSETS = ("red", "nir", "scl")
REF_ROWS, REF_COLS = 512, 1024
"""Reference / comparison window: whole 512² COG tiles, so every block is decoded once."""
MEMORY_WORDS = ("Pausing worker", "Unpausing worker", "Memory use is high", "Unmanaged memory use is high",
                "Restarting worker", "exceeded", "KilledWorker", "spill")


def season_sample(size: int, dates: int, compress: str | None = None):
    from rasterflow.sample import generate_sample

    started = time.perf_counter()
    suffix = f"-{compress.lower()}" if compress else ""
    catalog = generate_sample(DATA / f"season-{size}x{dates}{suffix}", size=size, n_dates=dates, every_days=EVERY_DAYS,
                              compress=compress)
    print(f"sample {size}² x {dates} dates ready ({time.perf_counter() - started:.0f} s)", flush=True)
    return catalog


# --------------------------------------------------------------------------------------------------------------------
# Measuring one child process: wall, peak RSS of the tree, the largest process, scratch (spill) on disk, a timeout
# that kills the whole process group.


def _dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def measure(cmd: list[str], *, env: dict | None = None, timeout: float, scratch: Path | None = None,
            interval: float = 0.05) -> dict:
    import psutil

    env = {**os.environ, **(env or {})}
    if scratch is not None:
        scratch.mkdir(parents=True, exist_ok=True)
        env["DASK_TEMPORARY_DIRECTORY"] = str(scratch)
    load_before = os.getloadavg()
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    root = psutil.Process(proc.pid)
    state = {"tree": 0, "process": 0, "scratch": 0}
    per_pid: dict[int, int] = {}
    done = threading.Event()

    def sampler() -> None:
        last_scratch = 0.0
        while not done.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            total = 0
            for p in procs:
                try:
                    rss = p.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                total += rss
                per_pid[p.pid] = max(per_pid.get(p.pid, 0), rss)
            state["tree"] = max(state["tree"], total)
            if scratch is not None and time.perf_counter() - last_scratch > 1.0:
                state["scratch"] = max(state["scratch"], _dir_bytes(scratch))
                last_scratch = time.perf_counter()
            done.wait(interval)

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    timed_out = False
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)  # our own child's process group (start_new_session above)
        stdout, stderr = proc.communicate()
    wall = time.perf_counter() - started
    done.set()
    thread.join()
    info = {}
    for line in stdout.splitlines():
        if line.startswith("{") and line.endswith("}"):
            info = json.loads(line)
    memory_log = sorted({w for w in MEMORY_WORDS for line in stderr.splitlines() if w in line})
    return {"wall": wall, "peak_rss": state["tree"], "peak_process": max(per_pid.values(), default=0),
            "scratch_peak": state["scratch"] if scratch is not None else None, "returncode": proc.returncode,
            "timed_out": timed_out, "timeout": timeout, "stdout": stdout, "stderr": stderr, "info": info,
            "memory_log": memory_log, "load": [load_before, os.getloadavg()]}


def _status(m: dict) -> str | None:
    if m["timed_out"]:
        return f"timed out after {m['timeout']:.0f} s (killed)"
    if m["returncode"] != 0:
        last = (m["stderr"].strip().splitlines() or [""])[-1][:140]
        return f"failed (exit {m['returncode']}): {last}"
    return None


# --------------------------------------------------------------------------------------------------------------------
# The variants


RASTERFLOW_FROM: list[str] = []
"""``--rasterflow-from``: a directory put first on ``PYTHONPATH`` of the rasterflow runs (client and workers)."""


def run_rasterflow(catalog, output: Path, timeout: float, name: str | None = None) -> dict:
    """``rasterflow run`` on the common spec with ``output`` (its suffix picks Zarr or COG)."""
    stats = output.parent / f"{output.stem}-worker-stats"
    stats.mkdir(parents=True, exist_ok=True)
    for old in stats.glob("*.json"):
        old.unlink()
    spec = write_spec(catalog, output, name=name or f"season-{output.suffix.lstrip('.')}")
    env = {"DASK_DISTRIBUTED__WORKER__PRELOAD": json.dumps([str(WORKER_STATS_PRELOAD)]),
           "RASTERFLOW_BENCH_STATS": str(stats)}
    if RASTERFLOW_FROM:
        env["PYTHONPATH"] = os.pathsep.join([*RASTERFLOW_FROM, *filter(None, [os.environ.get("PYTHONPATH")])])
    m = measure([RASTERFLOW, "run", str(spec)], env=env, timeout=timeout,
                scratch=output.parent / f"{output.stem}-scratch")
    m["output"] = output
    status = _status(m)
    if status:
        m["status"] = status
        return m
    workers = [json.loads(p.read_text()) for p in sorted(stats.glob("*.json"))]
    report = json.loads(Path(str(output) + ".report.json").read_text())
    m.update(transfer=sum(w["incoming_bytes"] for w in workers) if workers else None,
             spilled=report.get("spilled_bytes"),
             peak_per_worker=max((report.get("measured_peak_per_worker") or {}).values(), default=None),
             predicted_per_worker=report.get("predicted_peak_per_worker"),
             compute_write=report.get("stage_seconds", {}).get("compute+write"),
             tasks=[w["executed"] for w in workers], chunks=report.get("chunks"))
    return m


def run_peer(variant: str, catalog, work: Path, gdal_python: Path | None, timeout: float) -> dict:
    if variant == "gdal":
        output = work / "gdal.tif"
        cmd = [str(gdal_python), str(GDAL_SCRIPT), str(catalog.items_json), str(output)]
        m = measure(cmd, env={"GDAL_CACHEMAX": GDAL_CACHEMAX}, timeout=timeout)
    else:
        output = work / f"{variant}.zarr"
        cmd = [PYTHON, str(DASK_PEERS[variant]), str(catalog.items_json), str(output),
               *(str(b) for b in catalog.bounds)]
        m = measure(cmd, timeout=timeout, scratch=work / f"{variant}-scratch")
    m["output"] = output
    status = _status(m)
    if status:
        m["status"] = status
        return m
    m["transfer"] = m["info"].get("transfer_bytes")
    m["tasks"] = [w["executed"] for w in m["info"].get("workers", [])]
    return m


def run_floor(catalog, size: int, timeout: float, decoder: str = "gdal") -> dict:
    cmd = [PYTHON, str(Path(__file__).resolve()), "--_floor", str(catalog.items_json), str(size), decoder]
    m = measure(cmd, env={"GDAL_CACHEMAX": "64"}, timeout=timeout)
    status = _status(m)
    if status:
        m["status"] = status
    return m


def _floor_child(items_json: str, size: int, decoder: str) -> None:
    from read_limit import _hrefs, read_floor

    seconds, nbytes = read_floor(_hrefs(items_json), size, cores=os.cpu_count() or 1, decoder=decoder)
    print(json.dumps({"seconds": seconds, "bytes": nbytes}))


# --------------------------------------------------------------------------------------------------------------------
# Blockwise reference and comparison


_REF: dict = {}


def _ref_open(items_json: str) -> None:
    import rasterio

    items = json.loads(Path(items_json).read_text())["features"]
    items.sort(key=lambda item: (item["properties"]["datetime"], item["id"]))
    _REF["items"] = items
    _REF["files"] = {a: [rasterio.open(item["assets"][a]["href"]) for item in items] for a in ASSETS}


def _ref_window(window: tuple[int, int, int, int]) -> tuple[tuple[int, int, int, int], np.ndarray]:
    """The job over one window, as ``common.numpy_reference`` computes it (float32, ``np.nanmedian``)."""
    from rasterio.windows import Window

    row, col, height, width = window
    win = Window(col, row, width, height)
    planes = {}
    for asset, sources in _REF["files"].items():
        stack = np.empty((len(sources), height, width), dtype=np.float32)
        for t, (item, src) in enumerate(zip(_REF["items"], sources)):
            stack[t] = physical_window(src, item, asset, win)
        planes[asset] = stack
    drop = np.isin(planes.pop("scl"), DROP_CLASSES)
    red = np.where(drop, np.nan, planes.pop("red"))
    nir = np.where(drop, np.nan, planes.pop("nir"))
    del drop
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN pixels
        ndvi = ((nir - red) / (nir + red)).astype(np.float32)
        del red, nir
        return window, np.nanmedian(ndvi, axis=0)


def _windows(height: int, width: int) -> list[tuple[int, int, int, int]]:
    return [(r, c, min(REF_ROWS, height - r), min(REF_COLS, width - c))
            for r in range(0, height, REF_ROWS) for c in range(0, width, REF_COLS)]


def blockwise_reference(catalog, size: int) -> Path:
    """The reference median as a ``.npy`` file (computed once per sample, two processes, window by window)."""
    path = Path(catalog.directory) / "reference-median.npy"
    if path.exists():
        return path
    part = path.with_name(path.name + ".part")
    out = np.lib.format.open_memmap(part, mode="w+", dtype=np.float32, shape=(size, size))
    started = time.perf_counter()
    with ProcessPoolExecutor(os.cpu_count() or 1, initializer=_ref_open,
                             initargs=(str(catalog.items_json),)) as pool:
        for (r, c, h, w), block in pool.map(_ref_window, _windows(size, size)):
            out[r:r + h, c:c + w] = block
    out.flush()
    del out
    os.replace(part, path)
    print(f"NumPy reference ready ({time.perf_counter() - started:.0f} s)", flush=True)
    return path


def _result_reader(path: Path):
    """A function (row, col, height, width) -> float32 block of the result at ``path`` (Zarr ``ndvi`` or COG)."""
    if path.suffix.lower() in (".tif", ".tiff"):
        import rasterio
        from rasterio.windows import Window

        src = rasterio.open(path)
        return (lambda r, c, h, w: src.read(1, window=Window(c, r, w, h))), src.close, (src.height, src.width)
    import xarray as xr

    ds = xr.open_zarr(path, consolidated=None)
    var = ds["ndvi"]
    if var.ndim != 2:
        var = var.squeeze(drop=True)
    return (lambda r, c, h, w: var[r:r + h, c:c + w].values), ds.close, var.shape


def compare_blockwise(result: Path, reference: Path) -> str:
    """``identical`` (bit for bit, NaN where NaN), else the NaN mismatch count or the largest difference."""
    expected = np.load(reference, mmap_mode="r")
    read, close, shape = _result_reader(result)
    try:
        if tuple(shape) != expected.shape:
            return f"shape {tuple(shape)} != {expected.shape}"
        nan_mismatch, max_diff, differing = 0, 0.0, 0
        for r, c, h, w in _windows(*expected.shape):
            a = np.asarray(read(r, c, h, w))
            e = np.asarray(expected[r:r + h, c:c + w])
            an, en = np.isnan(a), np.isnan(e)
            nan_mismatch += int((an != en).sum())
            both = ~an & ~en
            if both.any():
                d = np.abs(a[both].astype(np.float64) - e[both])
                differing += int((d > 0).sum())
                max_diff = max(max_diff, float(d.max()))
    finally:
        close()
    if nan_mismatch:
        return f"NaN patterns differ ({nan_mismatch} px)"
    if differing == 0:
        return "identical"
    return f"max |diff| {max_diff:.2e} ({differing} px differ)"


# --------------------------------------------------------------------------------------------------------------------


def _bytes(v) -> str:
    return gb(v) if isinstance(v, (int, float)) else "n/a"


def _mb(v) -> str:
    return f"{v / 1e6:.0f} MB" if isinstance(v, (int, float)) else "n/a"


def _load(m: dict) -> str:
    (a, _, _), (b, _, _) = m["load"]
    return f"{a:.1f}->{b:.1f}"


def season_rows(rows: dict[str, dict], floor: dict, reference_results: dict[str, str]) -> list[list[str]]:
    floor_seconds = floor["info"].get("seconds") if "status" not in floor else None
    lines = []
    for name, m in rows.items():
        result = m.get("status") or reference_results.get(name, "not compared")
        spill = m.get("spilled") if m.get("spilled") is not None else m.get("scratch_peak")
        per_worker = _bytes(m.get("peak_process")) + (
            f" (report {_bytes(m['peak_per_worker'])})" if m.get("peak_per_worker") else "")
        note = ", ".join(m.get("memory_log", [])) or "-"
        lines.append([name, f"{m['wall']:.0f} s", _bytes(m["peak_rss"]), per_worker, _mb(m.get("transfer")),
                      _mb(spill) if spill is not None else "n/a (1 process)",
                      f"{m['wall'] / floor_seconds:.2f}x" if floor_seconds and "status" not in m else "-",
                      note, _load(m), result])
    if floor_seconds:
        lines.append(["floor: read + decode, 2 processes", f"{floor_seconds:.0f} s (whole: {floor['wall']:.0f} s)",
                      _bytes(floor["peak_rss"]), _bytes(floor["peak_process"]), "", "", "1.00x", "-", _load(floor),
                      f"{gb(floor['info']['bytes'])} decoded"])
    else:
        lines.append(["floor: read + decode, 2 processes", "-", "", "", "", "", "", "-", _load(floor),
                      floor.get("status", "?")])
    return lines


def scaling_rows(points: list[tuple[str, str, int, int, dict]]) -> tuple[list[list[str]], dict]:
    """points: (label, tile, side, dates, measurement of rasterflow -> Zarr)."""
    base_tile = next((tile for label, tile, *_ in points if label == "4x"), "4x")
    base = next((m for label, _, s, d, m in points if label == "4x" and "status" not in m), None)
    base_peak = base.get("peak_per_worker") if base else None
    first = next((m for *_, m in points if "status" not in m), None)
    lines, verdict = [], {}
    for label, tile, s, dates, m in points:
        decoded = s * s * dates * len(ASSETS)
        if "status" in m:
            lines.append([label, tile, str(dates), f"{decoded / 1e9:.2f} Gpx", m["status"], "", "", "", "", "", "",
                          _load(m)])
            continue
        peak = m.get("peak_per_worker")
        vs = f"{peak / base_peak - 1:+.0%}" if peak and base_peak else "n/a"
        lines.append([label, tile, str(dates), f"{decoded / 1e9:.2f} Gpx", f"{m['wall']:.1f} s",
                      f"{m['wall'] / decoded * 1e9:.1f} ns", f"{m['compute_write']:.1f} s",
                      f"{m['compute_write'] / decoded * 1e9:.1f} ns", _bytes(peak), vs, _bytes(m["peak_rss"]),
                      _load(m)])
        verdict[label] = {"peak_vs_4x": (peak / base_peak - 1) if peak and base_peak else None,
                          "cw_per_px_vs_1x": (m["compute_write"] / decoded) / (
                              first["compute_write"] / (points[0][2] ** 2 * points[0][3] * len(ASSETS)))}
    return lines, {"base": base_tile, **verdict}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10980)
    parser.add_argument("--dates", type=int, default=36)
    parser.add_argument("--peers", nargs="*", default=["odc-stac+algo"], choices=sorted(DASK_PEERS))
    parser.add_argument("--no-peers", action="store_true", help="rasterflow and the floor only")
    parser.add_argument("--no-scaling", dest="scaling", action="store_false",
                        help="skip the 1x..8x runs of scaling.py's samples")
    parser.add_argument("--scaling-base", type=int, default=2048)
    parser.add_argument("--gdal-python", type=Path, default=DEFAULT_GDAL_PYTHON)
    parser.add_argument("--timeout", type=float, default=3 * 3600, help="seconds per rasterflow run")
    parser.add_argument("--peer-timeout", type=float, default=3 * 3600, help="seconds per peer run")
    parser.add_argument("--json", type=Path, help="write the rows here too")
    parser.add_argument("--compress", help="the sample COGs' codec (default ZSTD; public Sentinel-2 COGs are DEFLATE)")
    parser.add_argument("--rasterflow-from", type=Path,
                        help="run rasterflow from this copy of the package's parent directory (e.g. `git archive "
                             "HEAD rasterflow | tar -x -C DIR`), not the shared working tree")
    parser.add_argument("--_floor", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._floor:
        _floor_child(args._floor[0], int(args._floor[1]), args._floor[2])
        return 0

    if args.rasterflow_from:
        RASTERFLOW_FROM[:] = [str(args.rasterflow_from.resolve())]
        print(f"rasterflow from {RASTERFLOW_FROM[0]}", flush=True)
    print(f"rasterflow: {RASTERFLOW} (see common.RASTERFLOW_VENV)", flush=True)
    started = time.perf_counter()
    catalog = season_sample(args.size, args.dates, args.compress)
    scaling_samples = {k: sample(side(args.scaling_base, k)) for k in FACTORS} if args.scaling else {}
    work = DATA / "season" / f"s{args.size}x{args.dates}"
    work.mkdir(parents=True, exist_ok=True)
    gdal_python = args.gdal_python if args.gdal_python.exists() and not args.no_peers else None
    if not args.no_peers and gdal_python is None:
        print(f"(no GDAL venv at {args.gdal_python}: the gdal variant is skipped)", flush=True)

    def say(name: str, m: dict) -> None:
        print(f"  {name}: {m.get('status') or 'ok'}, {m['wall']:.1f} s, tree {gb(m['peak_rss'])}, largest process "
              f"{gb(m['peak_process'])}, load {_load(m)}", flush=True)

    points = []
    for k, cat in scaling_samples.items():
        s = side(args.scaling_base, k)
        m = run_rasterflow(cat, DATA / "season" / "scaling" / f"rasterflow_{s}.zarr", args.timeout,
                           name=f"scaling-{s}")
        say(f"scaling {k}x ({s}²)", m)
        points.append((f"{k}x", f"{s}²", s, 8, m))

    floors = [run_floor(catalog, args.size, args.timeout)]
    say("floor", floors[0])
    rows: dict[str, dict] = {}
    for fmt in ("zarr", "tif"):
        name = f"rasterflow -> {'COG' if fmt == 'tif' else 'Zarr'}"
        rows[name] = run_rasterflow(catalog, work / f"rasterflow-{fmt}.{fmt}", args.timeout)
        say(name, rows[name])
    # the floor again, its files now as warm in the page cache as rasterflow's were: the faster run is the floor
    # (the first run of the day can read from disk; two runs of 2026-12-04 gave 38 s and 30 s on the same files)
    floors.append(run_floor(catalog, args.size, args.timeout))
    say("floor again", floors[1])
    timed_floors = [f for f in floors if "status" not in f]
    floor = min(timed_floors, key=lambda f: f["info"]["seconds"]) if timed_floors else floors[0]
    print("  floor runs: " + ", ".join(f"{f['info']['seconds']:.1f} s" for f in timed_floors)
          + " (the faster is the floor)", flush=True)
    # the same floor with the decoder rasterflow reads these files with (rasterflow.read.tiles: tifffile +
    # imagecodecs, ~2x GDAL's per-window reads): what "close to the floor" means for rasterflow's own reads
    tile_floor = run_floor(catalog, args.size, args.timeout, decoder="tiles")
    say("floor with rasterflow's tile decoder", tile_floor)
    for variant in ([] if args.no_peers else args.peers) + (["gdal"] if gdal_python else []):
        rows[variant] = run_peer(variant, catalog, work, gdal_python, args.peer_timeout)
        say(variant, rows[variant])

    reference = blockwise_reference(catalog, args.size)
    results = {}
    for name, m in rows.items():
        if "status" not in m:
            results[name] = compare_blockwise(m["output"], reference)
            print(f"  {name} vs reference: {results[name]}", flush=True)

    print(f"\nmasked NDVI median, {args.size}² x {args.dates} dates x red/nir/scl, chunks {CHUNK}² x all dates, "
          f"2 workers x 1 thread (GDAL: one process), one run each ({time.perf_counter() - started:.0f} s in all)")
    print(table(season_rows(rows, floor, results),
                ["variant", "wall", "peak RSS (tree)", "largest process", "transfer", "spill (peak on disk)",
                 "vs floor", "worker memory log", "load 1-min", "vs NumPy reference"]))
    tile_seconds = tile_floor["info"].get("seconds") if "status" not in tile_floor else None
    if tile_seconds:
        print(f"  floor with rasterflow's tile decoder (tifffile + imagecodecs), 2 processes: {tile_seconds:.1f} s, "
              f"tree {_bytes(tile_floor['peak_rss'])}")
    if "status" not in floor:
        for name, m in rows.items():
            if m.get("compute_write"):
                print(f"  {name}: compute+write {m['compute_write']:.1f} s = "
                      f"{m['compute_write'] / floor['info']['seconds']:.2f}x the floor; whole run "
                      f"{m['wall'] / floor['info']['seconds']:.2f}x"
                      + (f" (vs the tile-decoder floor: {m['compute_write'] / tile_seconds:.2f}x / "
                         f"{m['wall'] / tile_seconds:.2f}x)" if tile_seconds else ""))
    verdict = {}
    if points:
        zarr = rows["rasterflow -> Zarr"]
        points.append(("season", f"{args.size}²", args.size, args.dates, zarr))
        lines, verdict = scaling_rows(points)
        print(f"\nrasterflow -> Zarr, chunks {CHUNK}² x all dates, 2 workers x 1 thread, one run each "
              "(1x..8x: 8 dates; season: the row above)")
        print(table(lines, ["area", "tile", "dates", "decoded", "wall", "wall / decoded px", "compute+write",
                            "c+w / decoded px", "peak per worker (report)", "vs 4x", "peak RSS (tree)",
                            "load 1-min"]))
        for label, v in verdict.items():
            if isinstance(v, dict) and v["peak_vs_4x"] is not None:
                print(f"  {label}: peak per worker {v['peak_vs_4x']:+.1%} vs the {verdict['base']} job "
                      "(target within 10%), "
                      f"compute+write per decoded px {v['cw_per_px_vs_1x']:.2f}x the 1x job's")
    if args.json:
        keep = ("wall", "peak_rss", "peak_process", "scratch_peak", "returncode", "timed_out", "info", "memory_log",
                "load", "status", "transfer", "spilled", "peak_per_worker", "predicted_per_worker", "compute_write",
                "tasks", "chunks")
        dump = {"season": {k: {a: m.get(a) for a in keep} for k, m in rows.items()},
                "floor": {a: floor.get(a) for a in keep}, "floors": [{a: f.get(a) for a in keep} for f in floors],
                "tile_floor": {a: tile_floor.get(a) for a in keep},
                "results": results,
                "scaling": [{"label": p[0], "side": p[2], "dates": p[3], **{a: p[4].get(a) for a in keep}}
                            for p in points],
                "verdict": verdict, "args": {k: str(v) for k, v in vars(args).items()}}
        args.json.write_text(json.dumps(dump, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
