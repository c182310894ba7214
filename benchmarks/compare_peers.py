"""rasterflow against the code a user would otherwise write: masked NDVI median over 8 dates -> Zarr.

    python benchmarks/compare_peers.py [--sizes 2048 4096 8192] [--rounds 3]

Variants, each a fresh process, run interleaved (A B C A B C ...):

* ``rasterflow``: ``rasterflow run SPEC`` (LocalCluster 2 workers x 1 thread, as the spec says).
* ``stackstac``: ``peers/stackstac_median.py``, the tutorial code (LocalCluster 2 x 1, ``stackstac.stack``,
  ``xr.where``, ``.median("time")``, ``.to_zarr``).
* ``odc-stac``: ``peers/odc_median.py``, ``odc.stac.load`` and the same xarray code.

Measured: wall time of the whole process (interpreter start to exit: imports, cluster start and shutdown
included, the same for all), peak RSS of the process tree (the process and all its descendants: client, nanny
bookkeeping and workers), sampled every 50 ms from this process, bytes received by workers from other workers,
and tasks per worker. Results are compared with the stackstac peer's output (bit for bit).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from common import DATA, HERE, PYTHON, check, compare, gb, measure, read_result, run_rasterflow, sample, table, \
    write_spec

VARIANTS = ("rasterflow", "stackstac", "odc-stac")
PEER_SCRIPTS = {"stackstac": HERE / "peers" / "stackstac_median.py", "odc-stac": HERE / "peers" / "odc_median.py"}


def run_variant(variant: str, catalog, work: Path):
    output = work / f"{variant}.zarr"
    if variant == "rasterflow":
        m = run_rasterflow(write_spec(catalog, output), work / "worker-stats")
    else:
        cmd = [PYTHON, str(PEER_SCRIPTS[variant]), str(catalog.items_json), str(output),
               *(str(b) for b in catalog.bounds)]
        m = check(measure(cmd), variant)
    return m, output


def bench_size(size: int, rounds: int) -> dict:
    catalog = sample(size)
    work = DATA / "compare" / f"s{size}"
    runs: dict[str, list] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        for variant in VARIANTS:
            m, output = run_variant(variant, catalog, work)
            runs[variant].append(m)
            print(f"  {size}² round {r + 1} {variant:<10} {m.wall:6.2f} s  {gb(m.peak_rss)}  "
                  f"transfer {m.info.get('transfer_bytes', 0) / 1e6:.1f} MB  "
                  f"tasks/worker {[w['executed'] for w in m.info.get('workers', [])]}", flush=True)
    reference = read_result(work / "stackstac.zarr")
    summary = {}
    for variant in VARIANTS:
        ms = runs[variant]
        summary[variant] = {
            "wall": statistics.median(m.wall for m in ms),
            "walls": [round(m.wall, 2) for m in ms],
            "peak_rss": statistics.median(m.peak_rss for m in ms),
            "transfer": statistics.median(m.info.get("transfer_bytes", 0) for m in ms),
            "tasks": [w["executed"] for w in ms[-1].info.get("workers", [])],
            "result": compare(read_result(work / f"{variant}.zarr"), reference),
        }
    return summary


def report(results: dict[int, dict]) -> str:
    rows = []
    for size, summary in results.items():
        for variant, s in summary.items():
            rows.append([f"{size}²", variant, f"{s['wall']:.2f} s", " ".join(f"{w:.1f}" for w in s["walls"]),
                         gb(s["peak_rss"]), f"{s['transfer'] / 1e6:.1f} MB", "/".join(map(str, s["tasks"])),
                         s["result"]])
    lines = [table(rows, ["job", "variant", "wall (median)", "rounds", "peak RSS (tree)", "transfer",
                          "tasks/worker", "vs stackstac"])]
    ratio_rows = []
    for size, summary in results.items():
        rf = summary["rasterflow"]
        for peer in ("stackstac", "odc-stac"):
            p = summary[peer]
            ratio_rows.append([f"{size}²", f"rasterflow / {peer}", f"{rf['wall'] / p['wall']:.2f}",
                               f"{rf['peak_rss'] / p['peak_rss']:.2f}"])
    lines += ["", table(ratio_rows, ["job", "ratio", "wall", "peak RSS"]),
              "targets vs stackstac: wall <= 0.60, peak RSS <= 0.50, transfer 0, identical results"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    started = time.perf_counter()
    results = {}
    for size in args.sizes:
        results[size] = bench_size(size, args.rounds)
    print()
    print(f"masked NDVI median over {8} dates -> Zarr, 2 workers x 1 thread, {args.rounds} rounds interleaved "
          f"({time.perf_counter() - started:.0f} s in all)")
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps({str(k): v for k, v in results.items()}, indent=2))


if __name__ == "__main__":
    main()
