"""The client's CPU per GB of remote tiles: the concurrent reader's HTTP path (aiohttp, tiles read apart as the
body arrives) against obstore's client (Rust: reqwest/hyper, the S3/Azure/GCS path), with and without copying the
range into per-tile bytes.

    python benchmarks/fetch_cpu.py [--size 2048] [--dates 12] [--season] [--rounds 3]

The requests are what a job's tasks ask for: each row of two 512² tiles of every file of the sample
(``common.sample``) as one range, 64 in flight, from ``latency_server.py`` with no latency (only the CPU is
measured). Each variant runs in a fresh process, interleaved per round; printed: requests, GB, wall, the process's
CPU seconds (user + system, every thread) and CPU seconds per GB, and minor page faults.

* ``aiohttp``: ``rasterflow.read.fetch.RangeClient`` on http(s) URLs, each row's tiles read apart (``pieces``);
* ``obstore``: obstore's ``HTTPStore`` (the client of rasterflow's ``s3://``, ``az://`` and ``gs://`` reads), the
  tiles views of obstore's buffer (no copy: the least CPU, but a row's bytes live until its last tile is done);
* ``obstore-pieces``: each tile copied out of obstore's buffer (what the concurrent reader does since 2026-12-07:
  each tile's bytes go after its last window);
* ``obstore-copy``: the range copied to ``bytes``, then each tile copied out (what it did before).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

VARIANTS = ("aiohttp", "obstore", "obstore-pieces", "obstore-copy")


def row_ranges(directory: Path) -> list[tuple[str, int, int, list[tuple[int, int]]]]:
    """``(path under directory, start, length, tiles as (offset in the range, length))`` per row of two tiles."""
    import tifffile

    jobs = []
    for path in sorted(directory.rglob("*.tif")):
        with tifffile.TiffFile(path) as tif:
            page = tif.pages[0]
            offsets, counts = page.dataoffsets, page.databytecounts
            across = -(-page.imagewidth // page.tilewidth)
        for first in range(0, len(offsets) - 1, 2):
            second = first + 1
            start, end = int(offsets[first]), int(offsets[second] + counts[second])
            if second % across == 0 or not 0 <= offsets[second] - offsets[first] - counts[first] <= 16:
                continue  # not two neighbours of one row, next to each other in the file (a COG's 4-byte leaders)
            jobs.append((path.relative_to(directory).as_posix(), start, end - start,
                         [(0, int(counts[first])), (int(offsets[second]) - start, int(counts[second]))]))
    return jobs


def _usage() -> tuple[float, int]:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime, used.ru_minflt


def child(variant: str, url: str, directory: Path) -> None:
    jobs = row_ranges(directory)
    total = sum(length for _, _, length, _ in jobs)
    cpu0, faults0 = _usage()
    started = time.perf_counter()
    if variant == "aiohttp":
        from rasterflow.read.fetch import RangeClient
        from rasterflow.retry import RetryPolicy

        from collections import deque

        reader = RangeClient(64)
        waiting: deque = deque()  # a consumer's: the oldest answer taken (and dropped) once 256 are asked for
        got = 0
        for path, start, length, tiles in jobs:
            waiting.append(reader.submit(path, f"{url}/{path}", [(start, length)], RetryPolicy(), "fetch-cpu",
                                         pieces=tiles))
            while len(waiting) > 256 or (waiting and waiting[0].done()):
                got += sum(len(part) for answer in waiting.popleft().result() for part in answer.parts)
        while waiting:
            got += sum(len(part) for answer in waiting.popleft().result() for part in answer.parts)
    else:
        got = asyncio.run(_obstore(url, jobs, copies=VARIANTS.index(variant) - 1))
    wall = time.perf_counter() - started
    cpu1, faults1 = _usage()
    assert got == sum(c for *_, tiles in jobs for _, c in tiles), (got, variant)
    print(json.dumps({"variant": variant, "requests": len(jobs), "gb": total / 1e9, "wall": wall, "cpu": cpu1 - cpu0,
                      "faults": faults1 - faults0}), flush=True)
    # obstore's runtime threads may take the GIL while the interpreter finalizes (seen: an abort 1 in 4 exits of a
    # script like this one): the measurement is printed, so leave without finalizing
    os._exit(0)


async def _obstore(url: str, jobs, copies: int) -> int:
    """``copies``: 0 views of obstore's buffer, 1 each tile copied out of it, 2 the range copied, then each tile."""
    import obstore
    from obstore.store import HTTPStore

    store = HTTPStore.from_url(url, client_options={"allow_http": True, "pool_max_idle_per_host": "256"})
    limit = asyncio.Semaphore(64)

    async def one(path: str, start: int, length: int, tiles: list[tuple[int, int]]) -> int:
        async with limit:
            body = await obstore.get_range_async(store, path, start=start, length=length)
        view = memoryview(bytes(body)) if copies == 2 else memoryview(body)
        parts = [bytes(view[offset:offset + count]) if copies else view[offset:offset + count]
                 for offset, count in tiles]
        return sum(len(part) for part in parts)

    return sum(await asyncio.gather(*(one(*job) for job in jobs)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--dates", type=int, default=12)
    parser.add_argument("--season", action="store_true", help="the season sample of season.py")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], Path(args.child[2]))
        return
    from common import PYTHON, sample, table
    from remote_read import latency_server

    if args.season:
        from season import season_sample

        local = season_sample(args.size, args.dates)
    else:
        local = sample(args.size, args.dates)
    directory = Path(local.directory)
    results: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    with latency_server(directory, 0.0, None) as url:
        for r in range(args.rounds):
            for variant in VARIANTS:
                done = subprocess.run([PYTHON, __file__, "--child", variant, url, str(directory)],
                                      capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(f"{variant} failed ({done.returncode}): {done.stderr[-2000:]}")
                result = json.loads(done.stdout.strip().splitlines()[-1])
                results[variant].append(result)
                print(f"  round {r + 1} {variant:<13} {result['wall']:.2f} s  cpu {result['cpu']:.2f} s "
                      f"({result['cpu'] / result['gb']:.2f} s/GB)  faults {result['faults']}", flush=True)
    rows = []
    for variant in VARIANTS:
        runs = sorted(results[variant], key=lambda x: x["cpu"])
        mid = runs[len(runs) // 2]
        rows.append([variant, str(mid["requests"]), f"{mid['gb']:.2f}", f"{mid['wall']:.2f} s",
                     f"{mid['cpu']:.2f} s", f"{mid['cpu'] / mid['gb']:.2f}",
                     f"{mid['cpu'] / mid['requests'] * 1000:.2f} ms", str(mid["faults"])])
    print(f"\nrows of two 512² tiles of the {args.size}² x {args.dates} {'season ' if args.season else ''}sample, "
          f"64 in flight, no latency; medians of {args.rounds} rounds (by CPU)")
    print(table(rows, ["client", "requests", "GB", "wall", "CPU", "CPU s/GB", "CPU per request", "minor faults"]))


if __name__ == "__main__":
    main()
