"""The command line: ``python -m rasterflow.sample DIR ...`` (run by :mod:`rasterflow.sample.__main__`)."""

from __future__ import annotations

import argparse

from rasterflow.sample.generate import generate_sample

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """``python -m rasterflow.sample DIR [--size N] [--dates N] [--tiles RxC] ...``"""
    parser = argparse.ArgumentParser(prog="python -m rasterflow.sample",
                                     description="Generate a synthetic Sentinel-2 L2A-like sample (COGs + STAC).")
    parser.add_argument("directory")
    parser.add_argument("--size", type=int, default=1024, help="pixels per tile side (default 1024)")
    parser.add_argument("--dates", type=int, default=8, help="number of dates (default 8)")
    parser.add_argument("--tiles", default="1x1", help="tile layout ROWSxCOLS (default 1x1)")
    parser.add_argument("--start", default="2024-06-03", help="first date (default 2024-06-03)")
    parser.add_argument("--every", type=int, default=10, help="days between dates (default 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--blocksize", type=int, default=512)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    try:
        rows, cols = (int(t) for t in args.tiles.lower().split("x"))
    except ValueError:
        parser.error(f"--tiles must look like 1x2, got {args.tiles!r}")
    import time

    t0 = time.perf_counter()
    try:
        cat = generate_sample(args.directory, size=args.size, n_dates=args.dates, tiles=(rows, cols),
                              start=args.start, every_days=args.every, seed=args.seed,
                              blocksize=args.blocksize, overwrite=args.overwrite)
    except ValueError as exc:
        parser.error(str(exc))
    elapsed = time.perf_counter() - t0
    print(f"{len(cat.item_ids)} items in {cat.directory} ({elapsed:.2f} s)")
    print(f"  items:      {cat.items_json}")
    print(f"  ndjson:     {cat.items_ndjson}")
    print(f"  collection: {cat.collection_json}")
    print(f"  bounds:     {cat.bounds} ({cat.crs})")
    print(f"  bbox:       {tuple(round(b, 5) for b in cat.bbox_wgs84)} (lon/lat)")
    return 0
