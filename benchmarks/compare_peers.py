"""rasterflow against the code a user would otherwise write: masked NDVI median over 8 dates.

    python benchmarks/compare_peers.py [--sizes 2048 4096 8192] [--rounds 3] [--gdal-python PATH]

Variants, each a fresh process, run interleaved (A B C D E A B C D E ...):

* ``rasterflow``: ``rasterflow run SPEC`` with ``cluster: {n_workers: 2, threads_per_worker: 1, processes: false}``:
  the job in the run's own process on 2 threads (no worker processes) -> Zarr.
* ``rasterflow-procs``: the same spec with ``processes: true``: a LocalCluster of 2 worker processes x 1 thread
  (what every rasterflow run was before ``cluster.processes``), to show what the worker processes cost.
* ``stackstac``: ``peers/stackstac_median.py``, the tutorial code (LocalCluster 2 x 1, ``stackstac.stack``,
  ``xr.where``, ``.median("time")``, ``.to_zarr``; one date per chunk).
* ``odc-stac``: ``peers/odc_median.py``, ``odc.stac.load`` (one date per chunk) and the same xarray code.
* ``odc-stac+algo``: ``peers/odc_algo_median.py``, as odc-stac's experts write it: ``chunks={"time": -1, ...}``,
  mask and NDVI blockwise with odc-algo (numexpr), xarray's median on the time-whole chunks; same LocalCluster.
* ``gdal``: ``peers/gdal_median.py``, GDAL 3.13 alone in one process (VRT pixel functions + ``gdal raster calc
  --dialect builtin --calc median`` -> COG), run with the Python of a venv holding ``gdal-wheel`` (``--gdal-python``,
  ``$GDAL_PYTHON``, default ``benchmarks/.data/gdal-venv/bin/python``; skipped, and said so, when there is none),
  with ``GDAL_CACHEMAX`` = ``common.GDAL_CACHEMAX`` (64MB; rasterflow runs with its default ``gdal_cachemax: auto``).
  Make that venv with: ``python3.12 -m venv benchmarks/.data/gdal-venv &&
  benchmarks/.data/gdal-venv/bin/pip install 'gdal-wheel>=3.13,<3.14' 'numpy>=2,<3'``.

Measured: wall time of the whole process (interpreter start to exit: imports, cluster start and shutdown
included, the same for all), peak RSS of the process tree (the process and all its descendants: client, nanny
bookkeeping and workers), sampled every 50 ms from this process, bytes received by workers from other workers,
and tasks per worker. Every result is compared with an independent NumPy reference (``common.numpy_reference``:
rasterio reads, float32 arithmetic, ``np.nanmedian``): ``identical`` means bit for bit, NaN where NaN.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from common import DATA, GDAL_CACHEMAX, HERE, PYTHON, RASTERFLOW, check, compare, gb, measure, numpy_reference, read_result, \
    run_rasterflow, sample, table, write_spec

DASK_PEERS = {
    "stackstac": HERE / "peers" / "stackstac_median.py",
    "odc-stac": HERE / "peers" / "odc_median.py",
    "odc-stac+algo": HERE / "peers" / "odc_algo_median.py",
}
GDAL_SCRIPT = HERE / "peers" / "gdal_median.py"
DEFAULT_GDAL_PYTHON = DATA / "gdal-venv" / "bin" / "python"


RASTERFLOW_VARIANTS = {"rasterflow": "false", "rasterflow-procs": "true"}
"""rasterflow's variants and their ``cluster.processes``."""


def variants(gdal_python: Path | None) -> tuple[str, ...]:
    return (*RASTERFLOW_VARIANTS, *DASK_PEERS, *(("gdal",) if gdal_python else ()))


def output_of(variant: str, work: Path) -> Path:
    return work / (f"{variant}.tif" if variant == "gdal" else f"{variant}.zarr")


def run_variant(variant: str, catalog, work: Path, gdal_python: Path | None):
    output = output_of(variant, work)
    if variant in RASTERFLOW_VARIANTS:
        spec = write_spec(catalog, output, processes=RASTERFLOW_VARIANTS[variant])
        return run_rasterflow(spec, work / "worker-stats"), output
    if variant == "gdal":
        # GDAL's block cache as in rasterflow's spec, not GDAL's default of 5% of RAM (2026-12-03, 4096², one run
        # each: 64MB 9.9 s / 0.22 GB, 256MB 9.1 s / 0.52 GB; with the default 1.26 GB the peak was 0.95 GB)
        cmd = [str(gdal_python), str(GDAL_SCRIPT), str(catalog.items_json), str(output)]
        return check(measure(cmd, env={"GDAL_CACHEMAX": GDAL_CACHEMAX}), variant), output
    cmd = [PYTHON, str(DASK_PEERS[variant]), str(catalog.items_json), str(output),
           *(str(b) for b in catalog.bounds)]
    return check(measure(cmd), variant), output


def bench_size(size: int, rounds: int, gdal_python: Path | None, only: list[str] | None = None) -> dict:
    catalog = sample(size)
    work = DATA / "compare" / f"s{size}"
    work.mkdir(parents=True, exist_ok=True)
    names = tuple(v for v in variants(gdal_python) if not only or v in only)
    runs: dict[str, list] = {v: [] for v in names}
    loads = []
    for r in range(rounds):
        for variant in names:
            m, output = run_variant(variant, catalog, work, gdal_python)
            runs[variant].append(m)
            loads.append(os.getloadavg()[0])
            print(f"  {size}² round {r + 1} {variant:<16} {m.wall:6.2f} s  {gb(m.peak_rss)}  load {loads[-1]:.1f}  "
                  f"transfer {m.info.get('transfer_bytes', 0) / 1e6:.1f} MB  "
                  f"tasks/worker {[w['executed'] for w in m.info.get('workers', [])]}", flush=True)
    started = time.perf_counter()
    reference = numpy_reference(catalog)
    print(f"  {size}² NumPy reference ready ({time.perf_counter() - started:.0f} s)", flush=True)
    summary = {}
    for variant in names:
        ms = runs[variant]
        summary[variant] = {
            "wall": statistics.median(m.wall for m in ms),
            "walls": [round(m.wall, 2) for m in ms],
            "peak_rss": statistics.median(m.peak_rss for m in ms),
            "transfer": statistics.median(m.info.get("transfer_bytes", 0) for m in ms),
            "tasks": [w["executed"] for w in ms[-1].info.get("workers", [])],
            "result": compare(read_result(output_of(variant, work)), reference),
        }
    summary["_load"] = {"min": min(loads), "max": max(loads), "median": statistics.median(loads)}
    return summary


def report(results: dict[int, dict]) -> str:
    rows = []
    for size, summary in results.items():
        for variant, s in _variants(summary).items():
            rows.append([f"{size}²", variant, f"{s['wall']:.2f} s", " ".join(f"{w:.1f}" for w in s["walls"]),
                         gb(s["peak_rss"]), f"{s['transfer'] / 1e6:.1f} MB",
                         "/".join(map(str, s["tasks"])) or ("(1 process)" if variant == "gdal" else "n/a"),
                         s["result"]])
    lines = [table(rows, ["job", "variant", "wall (median)", "rounds", "peak RSS (tree)", "transfer",
                          "tasks/worker", "vs NumPy reference"])]
    ratio_rows = []
    for size, summary in results.items():
        peers = {k: v for k, v in _variants(summary).items() if k not in RASTERFLOW_VARIANTS}
        if not peers:  # rasterflow's variants alone (--variants): nothing to hold them against
            continue
        fastest = min(peers, key=lambda k: peers[k]["wall"])
        leanest = min(peers, key=lambda k: peers[k]["peak_rss"])
        for name in (name for name in RASTERFLOW_VARIANTS if name in summary):
            rf = summary[name]
            for peer, p in peers.items():
                ratio_rows.append([f"{size}²", f"{name} / {peer}", f"{rf['wall'] / p['wall']:.2f}",
                                   f"{rf['peak_rss'] / p['peak_rss']:.2f}"])
            ratio_rows.append([f"{size}²", f"{name} vs fastest ({fastest}) / leanest ({leanest})",
                               f"{rf['wall'] / peers[fastest]['wall']:.2f}",
                               f"{rf['peak_rss'] / peers[leanest]['peak_rss']:.2f}"])
    lines += ["", table(ratio_rows, ["job", "ratio", "wall", "peak RSS"]),
              "targets (issue 13, at 4096²): wall <= 0.5x the fastest peer, peak RSS <= the leanest peer's, "
              "results identical"]
    lines += [f"load average (1 min) after each run at {size}²: median {s['median']:.1f}, "
              f"{s['min']:.1f}-{s['max']:.1f}" for size, s in ((size, summary["_load"])
                                                            for size, summary in results.items())]
    return "\n".join(lines)


def _variants(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if not k.startswith("_")}


def find_gdal_python(given: str | None) -> Path | None:
    candidate = Path(given or os.environ.get("GDAL_PYTHON") or DEFAULT_GDAL_PYTHON)
    if candidate.exists():
        return candidate
    print(f"(no GDAL venv at {candidate}: the gdal variant is skipped; see this script's docstring)", flush=True)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gdal-python", help="the Python of a venv with gdal-wheel (default: $GDAL_PYTHON, "
                                              "then benchmarks/.data/gdal-venv/bin/python)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--variants", nargs="+", choices=variants(Path("gdal")),
                        help="run only these variants (default: all; both rasterflow variants are always run)")
    args = parser.parse_args()
    only = sorted({*args.variants, *RASTERFLOW_VARIANTS}) if args.variants else None
    gdal_python = find_gdal_python(args.gdal_python)
    print(f"rasterflow: {RASTERFLOW} (see common.RASTERFLOW_VENV)", flush=True)
    started = time.perf_counter()
    results = {}
    for size in args.sizes:
        results[size] = bench_size(size, args.rounds, gdal_python, only)
    print()
    print(f"masked NDVI median over {8} dates, 2 threads (rasterflow: one process; rasterflow-procs and the Dask "
          f"peers: 2 workers x 1 thread; GDAL: one process), {args.rounds} round(s) interleaved "
          f"({time.perf_counter() - started:.0f} s in all, {os.cpu_count()} cores)")
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps({str(k): v for k, v in results.items()}, indent=2))


if __name__ == "__main__":
    main()
