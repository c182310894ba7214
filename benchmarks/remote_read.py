"""Remote COGs against local files: the masked NDVI median served by a loopback server with an object store's
latency, rasterflow (one process and worker processes) next to odc-stac + odc-algo and GDAL on the same server.

    python benchmarks/remote_read.py [--size 2048] [--dates 12] [--season] [--latency 0.04 0.1] [--time-chunk N [--series]]
                                     [--bandwidth 50MB] [--rounds 1] [--variants ...] [--gdal-python PATH]

The sample (``common.sample``: one ``size``² tile x ``dates`` dates of 512² ZSTD COGs) is served by
``latency_server.py`` in a process of its own (plain asyncio and sendfile: ~0.2 ms of its CPU a request, taken from
the same cores), which waits ``--latency`` seconds before every answer and, with ``--bandwidth``, sends at most that
many bytes a second per connection. Variants, each a fresh
process, interleaved per round (A B C ... A B C ...):

* ``rf-local`` / ``rf-local-procs``: rasterflow on the local files, one process (``cluster.processes: false``, 2
  threads) / 2 worker processes x 1 thread;
* ``rf-remote`` / ``rf-remote-procs``: the same specs on the items whose hrefs point at the server;
* ``rf-remote-gdal``: ``rf-remote`` with ``source.io.reader: gdal`` (every read through GDAL's ``/vsicurl/``: the
  reader before issue 27);
* ``odc-stac+algo``: ``peers/odc_algo_median.py`` (time whole, odc-algo blockwise; LocalCluster 2 x 1) on the items
  over HTTP;
* ``gdal``: ``peers/gdal_median.py`` (GDAL 3.13 alone, one process) on the items over HTTP (``/vsicurl/``), with
  ``GDAL_CACHEMAX=64MB`` and GDAL's HTTP settings for COGs (``GDAL_DISABLE_READDIR_ON_OPEN=EMPTY_DIR``,
  ``GDAL_HTTP_MERGE_CONSECUTIVE_RANGES=YES``, ``GDAL_HTTP_MULTIPLEX=YES``, ``VSI_CACHE=TRUE``), as its docs advise.

Printed per latency: wall, rasterflow's compute+write (the run report's stage, without the start and stop both runs
pay), peak RSS of the process tree and the largest peak per worker of the rounds (the run
report's, what the targets compare), the requests the server answered, the most it had in
flight, bytes sent, the server's own CPU seconds (taken from the same 2 cores as the job), rasterflow's own counts
(header reads, seconds its compute threads waited for bytes), the wall against the same layout's local run, and
every result against the NumPy reference (``common.numpy_reference``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import types
import urllib.request
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from common import (  # noqa: E402
    DATA, GDAL_CACHEMAX, PYTHON, check, compare, compare_strips, gb, measure, numpy_reference, numpy_series_strips,
    read_result, run_rasterflow, sample, table, write_spec,
)
from http_faults import http_items  # noqa: E402

DEFAULT_GDAL_PYTHON = DATA / "gdal-venv" / "bin" / "python"
VARIANTS = ("rf-local", "rf-local-procs", "rf-remote", "rf-remote-procs", "rf-remote-gdal", "odc-stac+algo", "gdal")
GDAL_HTTP_ENV = {"GDAL_DISABLE_READDIR_ON_OPEN": "EMPTY_DIR", "GDAL_HTTP_MERGE_CONSECUTIVE_RANGES": "YES",
                 "GDAL_HTTP_MULTIPLEX": "YES", "VSI_CACHE": "TRUE", "CPL_VSIL_CURL_ALLOWED_EXTENSIONS": ".tif"}


@contextmanager
def latency_server(root: Path, latency: float, bandwidth: str | None):
    cmd = [PYTHON, str(HERE / "latency_server.py"), str(root), "--latency", str(latency)]
    if bandwidth:
        cmd += ["--bandwidth", bandwidth]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        url = json.loads(line)["url"]
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def server_stats(url: str) -> dict:
    with urllib.request.urlopen(url + "/_stats") as answer:
        return json.loads(answer.read())


def server_reset(url: str) -> None:
    urllib.request.urlopen(urllib.request.Request(url + "/_reset", method="POST")).close()


def with_io(spec: Path, line: str) -> Path:
    """``spec`` with ``line`` added to its ``source`` section (e.g. ``io: {reader: gdal}``)."""
    text = spec.read_text().replace("  assets:", f"  {line}\n  assets:", 1)
    spec.write_text(text)
    return spec


def run(variant: str, local, remote, work: Path, gdal_python: Path | None, time_chunk: int | None = None,
        series: bool = False):
    output = work / (f"{variant}.tif" if variant == "gdal" else f"{variant}.zarr")
    if variant.startswith("rf-"):
        catalog = local if variant.startswith("rf-local") else remote
        tree = {} if time_chunk is None else {"method": None if series else "mean", "time_chunk": time_chunk}
        spec = write_spec(catalog, output, name=variant, processes="true" if variant.endswith("procs") else "false",
                          **tree)
        if variant == "rf-remote-gdal":
            with_io(spec, "io: {reader: gdal}")
        return run_rasterflow(spec, work / "worker-stats"), output
    if variant == "gdal":
        cmd = [str(gdal_python), str(HERE / "peers" / "gdal_median.py"), str(remote.items_vsicurl), str(output)]
        return check(measure(cmd, env={"GDAL_CACHEMAX": GDAL_CACHEMAX, **GDAL_HTTP_ENV}), variant), output
    cmd = [PYTHON, str(HERE / "peers" / "odc_algo_median.py"), str(remote.items_json), str(output),
           *(str(b) for b in remote.bounds)]
    return check(measure(cmd, env=GDAL_HTTP_ENV), variant), output


def compute_seconds(measurement) -> float:
    """The run report's compute+write seconds (0 for a peer, which has no report)."""
    return float(((measurement.info.get("report") or {}).get("stage_seconds") or {}).get("compute+write") or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--season", action="store_true",
                        help="the season sample of season.py (every 5 days, 5 assets of which the job reads 3) "
                             "instead of common.sample")
    parser.add_argument("--dates", type=int, default=12)
    parser.add_argument("--latency", type=float, nargs="+", default=[0.04, 0.1])
    parser.add_argument("--bandwidth", default=None, help="per connection, e.g. 50MB (default: no cap)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--time-chunk", type=int, default=None,
                        help="rasterflow only: a mean with time in chunks of this many dates (the tree path; a "
                             "median needs time whole), against NumPy's nanmean")
    parser.add_argument("--series", action="store_true",
                        help="rasterflow only, with --time-chunk: the series itself (no reduction; the series path), "
                             "compared with NumPy's strip by strip")
    parser.add_argument("--gdal-python", type=Path, default=Path(os.environ.get("GDAL_PYTHON", DEFAULT_GDAL_PYTHON)))
    args = parser.parse_args()
    gdal_python = args.gdal_python if args.gdal_python.exists() else None
    names = [v for v in args.variants if (v != "gdal" or gdal_python) and (args.time_chunk is None
                                                                          or v.startswith("rf-"))]
    if "gdal" in args.variants and not gdal_python:
        print(f"(no GDAL venv at {args.gdal_python}: the gdal variant is skipped; see compare_peers.py)")

    if args.season:
        from season import season_sample

        local = season_sample(args.size, args.dates)
    else:
        local = sample(args.size, args.dates)
    work = DATA / (f"remote-{'season-' if args.season else ''}{args.size}x{args.dates}"
                   + (f"-{'series' if args.series else 'mean'}-t{args.time_chunk}" if args.time_chunk else ""))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if args.series and args.time_chunk is None:
        parser.error("--series needs --time-chunk (the dates of each band task)")
    strips = numpy_series_strips(local) if args.series else None
    reference = None if args.series else numpy_reference(local, method="median" if args.time_chunk is None
                                                         else "mean")
    print(f"NumPy reference ready ({time.perf_counter() - started:.0f} s)", flush=True)
    rows = []
    for latency in args.latency:
        with latency_server(Path(local.directory), latency, args.bandwidth) as url:
            items = http_items(local, url, work / "items-http.json")
            vsicurl = http_items(local, url, work / "items-vsicurl.json", rewrite=lambda h: "/vsicurl/" + h)
            remote = types.SimpleNamespace(items_json=items, items_vsicurl=vsicurl, bounds=local.bounds,
                                           bbox_wgs84=local.bbox_wgs84, directory=local.directory)
            results: dict[str, list] = {v: [] for v in names}
            for r in range(args.rounds):
                for variant in names:
                    server_reset(url)
                    m, output = run(variant, local, remote, work, gdal_python, args.time_chunk, args.series)
                    served = server_stats(url) if "remote" in variant or not variant.startswith("rf-") else {}
                    io = ((m.info.get("report") or {}).get("reads") or {}).get("io") or {}
                    same = compare_strips(output, strips) if strips is not None \
                        else compare(read_result(output), reference)
                    results[variant].append((m, served, io, same))
                    print(f"  {latency * 1000:.0f} ms round {r + 1} {variant:<16} {m.wall:6.2f} s  {gb(m.peak_rss)}"
                          f"  requests {served.get('requests', '-')}  in flight {served.get('in_flight_peak', '-')}"
                          f"  load {os.getloadavg()[0]:.1f}"
                          + (f"  waited {io.get('wait_seconds', 0):.1f} s (first windows "
                             f"{io.get('first_wait_seconds', 0):.1f} s), tasks started ahead "
                             f"{io.get('tasks_ahead', 0)}/{io.get('tasks', 0)}" if io else ""), flush=True)
                    slowest = (io.get("longest_waits") or [{}])[0]
                    if slowest.get("seconds", 0) >= 1.0:  # a stall: what the report says of it
                        print(f"    longest wait {slowest}", flush=True)
            walls = {v: sorted(x[0].wall for x in results[v])[len(results[v]) // 2] for v in names}
            # rasterflow's compute+write alone (the report's stage), without the start and stop both runs pay
            computes = {v: sorted(compute_seconds(x[0]) for x in results[v])[len(results[v]) // 2] for v in names}
            for variant in names:
                m, served, io, same = results[variant][-1]
                local_name = "rf-local-procs" if variant.endswith("procs") else "rf-local"
                ratio = f"{walls[variant] / walls[local_name]:.2f}x" if "remote" in variant and local_name in walls \
                    else ""
                per_worker = max((peak for x in results[variant]
                                  for peak in x[0].info.get("report", {}).get("measured_peak_per_worker", {}).values()),
                                 default=0)
                compute = computes[variant]
                compute_ratio = f" ({compute / computes[local_name]:.2f}x)" if ratio and compute \
                    and computes.get(local_name) else ""
                rows.append([f"{latency * 1000:.0f} ms", variant, f"{walls[variant]:.1f} s", ratio,
                             f"{compute:.1f} s{compute_ratio}" if compute else "-", gb(m.peak_rss),
                             f"{per_worker / 1e6:.0f} MB" if per_worker else "-",
                             str(served.get("requests", "-")), str(served.get("in_flight_peak", "-")),
                             f"{served['bytes'] / 1e6:.0f} MB" if served.get("bytes") else "-",
                             str(io.get("header_reads", "")), f"{io['wait_seconds']:.1f} s" if io else "",
                             f"{served['cpu_seconds']:.1f} s" if served else "-", same])
    job = "median" if args.time_chunk is None else (
        f"series, time in chunks of {args.time_chunk} dates (series path)," if args.series
        else f"mean, time in chunks of {args.time_chunk} dates (tree path),")
    print(f"\nmasked NDVI {job} {args.size}² x {args.dates} dates x 3 assets (512² ZSTD COGs), chunks 1024², "
          f"rounds {args.rounds}, bandwidth cap {args.bandwidth or 'none'}")
    print(table(rows, ["latency", "variant", "wall", "vs local", "compute+write (vs local)", "peak RSS",
                       "peak per worker", "requests", "most in flight", "bytes sent", "header reads", "compute waited", "server CPU", "vs NumPy reference"]))


if __name__ == "__main__":
    main()
