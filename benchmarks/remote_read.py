"""The same job read over HTTP with added latency: rasterflow vs hand-written stackstac, side by side.

    python benchmarks/remote_read.py [--size 1024] [--latency 0.02]

The sample COGs (:func:`common.sample`) are served by the loopback range server of the tests
(``tests/http_faults.py``) with ``--latency`` seconds added to every request; the items file points at it. Each
variant runs in a fresh process on its own LocalCluster of 2 workers x 1 thread (the masked NDVI median of
:mod:`common`); printed: wall time, HTTP requests the server answered (by kind), and whether the result is the
local-file rasterflow result bit for bit.
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from common import (  # noqa: E402
    DATA, PYTHON, RASTERFLOW, check, compare, measure, read_result, sample, table, write_spec,
)
from http_faults import fault_server, http_items  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024, help="tile edge in pixels (default 1024)")
    parser.add_argument("--latency", type=float, default=0.02, help="seconds added to every request (0.02)")
    args = parser.parse_args()

    catalog = sample(args.size)
    work = DATA / f"remote-{args.size}"
    work.mkdir(parents=True, exist_ok=True)
    local_spec = write_spec(catalog, work / "local.zarr", name="bench-local")
    check(measure([RASTERFLOW, "run", str(local_spec)]), "rasterflow (local files)")
    expected = read_result(work / "local.zarr")

    rows = []
    with fault_server(catalog.directory, latency=args.latency) as server:
        items = http_items(catalog, server.url, work / "items-http.json")
        remote = types.SimpleNamespace(items_json=items, bounds=catalog.bounds, bbox_wgs84=catalog.bbox_wgs84)
        variants = [
            ("rasterflow", [RASTERFLOW, "run", str(write_spec(remote, work / "rasterflow.zarr", name="bench-http"))],
             work / "rasterflow.zarr"),
            ("stackstac (hand-written)", [PYTHON, str(HERE / "peers" / "stackstac_median.py"), str(items),
                                          str(work / "stackstac.zarr"), *map(str, catalog.bounds)],
             work / "stackstac.zarr"),
        ]
        for label, cmd, output in variants:
            server.reset_counts()
            m = check(measure(cmd), label)
            kinds = server.statuses()
            heads = sum(1 for method, *_ in server.log if method == "HEAD")
            rows.append([label, f"{m.wall:.1f} s", str(server.count()), str(heads),
                         ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items(), key=str)),
                         compare(read_result(output), expected)])
    print(f"masked NDVI median, 8 dates x {args.size}² px, 3 assets over HTTP (+{args.latency * 1000:.0f} ms per "
          "request), LocalCluster 2 x 1 thread")
    print(table(rows, ["reader", "wall", "requests", "HEAD", "answers", "vs local rasterflow"]))


if __name__ == "__main__":
    main()
