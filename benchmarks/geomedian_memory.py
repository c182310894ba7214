"""Peak working memory of ``rasterflow.geomedian.geomedian_block`` for one slab, measured, against the formula.

Each size runs in a fresh subprocess: it builds the input stack ``(time, band, y, x)`` float32 (reflectances with
30 % of the dates masked per pixel), makes a one-row warm-up call (imports, OpenMP start-up, NumPy caches), reads
``ru_maxrss``, runs the kernel on the whole block as one slab (``work_pixels=None``) and reads ``ru_maxrss`` again.
The delta minus the output array is the slab's peak as the OS sees it (what a Dask nanny acts on). A second
subprocess per size measures the same call with ``tracemalloc`` (NumPy's allocations, exactly; geomad's own C
buffers are O(band + time) per thread). The table printed is the one in ``rasterflow/geomedian.py``.

Usage::

    python benchmarks/geomedian_memory.py                    # the sizes of the table (a few minutes on 2 cores)
    python benchmarks/geomedian_memory.py --sizes 36x4x512   # time x band x side
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

_CHILD = r"""
import json, resource, sys, tracemalloc
import numpy as np
from rasterflow.geomedian import geomedian_block, geomedian_output_bytes

t, b, side, mode = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rng = np.random.default_rng(0)
stack = np.empty((t, b, side, side), dtype=np.float32)
for date in range(t):  # one date at a time: no temporary larger than a date may set the baseline's peak
    stack[date] = rng.uniform(0.02, 0.5, size=(b, side, side))
    stack[date][:, rng.random((side, side)) < 0.3] = np.nan
geomedian_block(stack[:, :, :1], work_pixels=None)      # warm-up
output = geomedian_output_bytes(b, side * side)
if mode == "rss":
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    geomedian_block(stack, work_pixels=None)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    peak = after - before - output
else:
    tracemalloc.start()
    geomedian_block(stack, work_pixels=None)
    peak = tracemalloc.get_traced_memory()[1] - output
    tracemalloc.stop()
print(json.dumps({"peak": peak}))
"""

SIZES = ("12x4x512", "24x4x512", "36x4x512", "72x4x512", "36x2x512", "36x6x512", "36x10x512",
         "36x4x256", "36x4x1024", "24x6x1024")


def measure(t: int, b: int, side: int, mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", _CHILD, str(t), str(b), str(side), mode],
                          capture_output=True, text=True, check=True)
    return int(json.loads(done.stdout.strip().splitlines()[-1])["peak"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="*", default=list(SIZES), help="time x band x side, e.g. 36x4x512")
    args = parser.parse_args()
    from rasterflow.geomedian import geomedian_work_bytes

    print("   time  band    pixels   RSS delta MB   tracemalloc MB   formula MB   RSS / formula")
    for size in args.sizes:
        t, b, side = (int(v) for v in size.split("x"))
        rss, traced = measure(t, b, side, "rss"), measure(t, b, side, "trace")
        formula = geomedian_work_bytes(t, b, side * side)
        print(f"  {t:5d} {b:5d} {side * side:9d} {rss / 1e6:14.1f} {traced / 1e6:16.1f} {formula / 1e6:12.1f}"
              f" {rss / formula:15.2f}", flush=True)


if __name__ == "__main__":
    main()
