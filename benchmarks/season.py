"""A season on one machine (issue 13, step 1) -- FIRST CUT: one tile x many dates, rasterflow vs the peers vs the floor.

Generates (``rasterflow.sample``, once, into ``benchmarks/.data/season-<size>x<dates>/``) one ``size``² tile x
``dates`` dates (every 5 days: 36 dates = one 6-month season) of red / nir / SCL as tiled ZSTD COGs, then runs the
masked NDVI median of ``common.write_spec`` side by side, one fresh process per run, in this order per round:

- ``rasterflow`` to Zarr and to COG (the same spec, ``output.path`` ``.zarr`` / ``.tif``),
- the Dask peers of ``compare_peers.py`` (``--peers``, default the strongest: odc-stac time-whole + odc-algo),
- GDAL (``peers/gdal_median.py``) when its venv exists (``benchmarks/.data/gdal-venv``, see compare_peers.py),
- the read + decode floor of the same files (``read_limit.read_floor``: every block decoded once by 2 processes).

Reported per variant: wall time, peak RSS of the process tree (psutil, 50 ms), bytes moved between workers
(rasterflow: the worker-stats preload; peers: what their scripts print), spill (rasterflow's run report), peak per
worker (rasterflow's run report: the largest worker's), and the result against the NumPy reference
(``common.numpy_reference``, cached).
A variant that fails or times out is written into the table as such, not dropped.

Status: written and smoke-tested at small sizes only (``--size 1024 --dates 6``); the full 10980² x 36 run (inputs
~3 x 36 x 10980² samples, generation alone takes a long time on 2 cores) has NOT been run yet.

Usage::

    python benchmarks/season.py                                   # 10980² x 36 (long: hours on 2 busy cores)
    python benchmarks/season.py --size 2048 --dates 36 --no-peers # a quick look
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import DATA, RASTERFLOW, WORKER_STATS_PRELOAD, compare, gb, measure, numpy_reference, read_result, \
    table, write_spec  # noqa: E402
from compare_peers import DEFAULT_GDAL_PYTHON, DASK_PEERS, run_variant  # noqa: E402
from read_limit import _hrefs, read_floor  # noqa: E402

EVERY_DAYS = 5


def season_sample(size: int, dates: int):
    from rasterflow.sample import generate_sample

    started = time.perf_counter()
    catalog = generate_sample(DATA / f"season-{size}x{dates}", size=size, n_dates=dates, every_days=EVERY_DAYS)
    print(f"sample {size}² x {dates} dates ready ({time.perf_counter() - started:.0f} s)", flush=True)
    return catalog


def run_rasterflow(catalog, output: Path, timeout: float) -> dict:
    """``rasterflow run`` on the common spec with ``output`` (its suffix picks Zarr or COG)."""
    stats = output.parent / f"{output.stem}-worker-stats"
    stats.mkdir(parents=True, exist_ok=True)
    for old in stats.glob("*.json"):
        old.unlink()
    spec = write_spec(catalog, output, name=f"season-{output.suffix.lstrip('.')}")
    env = {"DASK_DISTRIBUTED__WORKER__PRELOAD": json.dumps([str(WORKER_STATS_PRELOAD)]),
           "RASTERFLOW_BENCH_STATS": str(stats)}
    m = measure([RASTERFLOW, "run", str(spec)], env=env, timeout=timeout)
    row = {"wall": m.wall, "peak_rss": m.peak_rss, "returncode": m.returncode, "output": output}
    if m.returncode != 0:
        row["status"] = f"failed (exit {m.returncode}): {(m.stderr.strip().splitlines() or [''])[-1][:120]}"
        return row
    workers = [json.loads(p.read_text()) for p in sorted(stats.glob("*.json"))]
    report = json.loads(Path(str(output) + ".report.json").read_text())
    row.update(transfer=sum(w["incoming_bytes"] for w in workers), spilled=report.get("spilled_bytes"),
               peak_per_worker=max((report.get("measured_peak_per_worker") or {}).values(), default=None),
               predicted_per_worker=report.get("predicted_peak_per_worker"))
    return row


def run_peer(variant: str, catalog, work: Path, gdal_python: Path | None) -> dict:
    try:
        m, output = run_variant(variant, catalog, work, gdal_python)
    except subprocess.TimeoutExpired as error:
        return {"status": f"timed out after {error.timeout:.0f} s"}
    except SystemExit as error:  # common.check: the peer exited non-zero (died, was killed, ran out of memory)
        return {"status": "failed: " + (str(error).strip().splitlines() or [""])[0][:120]}
    return {"wall": m.wall, "peak_rss": m.peak_rss, "transfer": m.info.get("transfer_bytes"), "output": output}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10980)
    parser.add_argument("--dates", type=int, default=36)
    parser.add_argument("--peers", nargs="*", default=["odc-stac+algo"], choices=sorted(DASK_PEERS))
    parser.add_argument("--no-peers", action="store_true", help="rasterflow and the floor only")
    parser.add_argument("--gdal-python", type=Path, default=DEFAULT_GDAL_PYTHON)
    parser.add_argument("--timeout", type=float, default=3 * 3600, help="seconds per run")
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args(argv)

    catalog = season_sample(args.size, args.dates)
    work = DATA / "season" / f"s{args.size}x{args.dates}"
    work.mkdir(parents=True, exist_ok=True)
    gdal_python = args.gdal_python if args.gdal_python.exists() and not args.no_peers else None
    rows: dict[str, dict] = {}
    for fmt in ("zarr", "tif"):
        rows[f"rasterflow -> {'COG' if fmt == 'tif' else 'Zarr'}"] = run_rasterflow(
            catalog, work / f"rasterflow-{fmt}.{fmt}", args.timeout)  # distinct names: write_spec puts NAME.yaml beside
        print(f"  done: rasterflow {fmt}", flush=True)
    for variant in ([] if args.no_peers else args.peers) + (["gdal"] if gdal_python else []):
        rows[variant] = run_peer(variant, catalog, work, gdal_python)
        print(f"  done: {variant}", flush=True)
    floor_seconds, floor_bytes = read_floor(_hrefs(catalog.items_json), args.size, cores=2)

    reference = numpy_reference(catalog)
    lines = []
    for name, row in rows.items():
        if "status" in row:
            result = row["status"]
        else:
            result = compare(read_result(row["output"]), reference)
        fmt_bytes = lambda v: gb(v) if isinstance(v, (int, float)) else "n/a"  # noqa: E731
        lines.append([name, f"{row['wall']:.1f} s" if "wall" in row else "-", fmt_bytes(row.get("peak_rss")),
                      fmt_bytes(row.get("peak_per_worker")), fmt_bytes(row.get("transfer")),
                      fmt_bytes(row.get("spilled")),
                      f"{row['wall'] / floor_seconds:.2f}x" if "wall" in row else "-", result])
    lines.append(["floor: read + decode, 2 processes", f"{floor_seconds:.1f} s", "", "", "", "", "1.00x",
                  f"{gb(floor_bytes)} decoded"])
    print(f"\nmasked NDVI median, {args.size}² x {args.dates} dates, chunks 1024², 2 workers x 1 thread")
    print(table(lines, ["variant", "wall", "peak RSS (tree)", "peak/worker", "transfer", "spilled", "vs floor",
                        "vs NumPy reference"]))
    if args.json:
        args.json.write_text(json.dumps({k: {a: (str(b) if isinstance(b, Path) else b) for a, b in v.items()}
                                         for k, v in rows.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
