"""Out-of-core check: the same spec with the input area grown 1x, 2x, 4x, 8x.

    python benchmarks/scaling.py [--base 2048] [--rounds 2] [--png benchmarks/scaling.png]

One tile of ``base * sqrt(k)`` pixels per side (k = 1, 2, 4, 8; rounded to 16 px), 8 dates, the rasterflow spec of
the other benchmarks (1024² chunks, 2 workers x 1 thread). Wall time should grow about linearly with the area (plus
the fixed cost of starting the process and the cluster) and the peak RSS of the process tree should stay flat
(within 10 %): memory is set by the chunk, not by the job.

The area grows with one larger tile, not with more tiles: rasterflow stacks every item it finds along time and
does not mosaic the tiles of one date, so with k tiles per date a chunk would hold k x 8 dates (mostly empty).

The table of issue 13 (1x, 2x, 4x, 8x and the full season in one table, from one run, with rasterflow's peak per
worker and the wall time per decoded pixel) is printed by ``season.py``, which runs these four samples (``side``,
``FACTORS``) with the same spec right before the season.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

from common import DATA, HERE, gb, run_rasterflow, sample, table, write_spec

FACTORS = (1, 2, 4, 8)


def side(base: int, factor: int) -> int:
    return int(round(base * math.sqrt(factor) / 16)) * 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--png", type=Path, default=HERE / "scaling.png")
    args = parser.parse_args()
    started = time.perf_counter()
    sizes = {k: side(args.base, k) for k in FACTORS}
    specs = {k: write_spec(sample(size), DATA / "scaling" / f"rasterflow_{size}.zarr") for k, size in sizes.items()}
    runs: dict[int, list] = {k: [] for k in FACTORS}
    for r in range(args.rounds):
        for k in FACTORS:
            m = run_rasterflow(specs[k], DATA / "scaling" / "worker-stats")
            runs[k].append(m)
            print(f"  round {r + 1} {k}x ({sizes[k]}²): {m.wall:.2f} s, {gb(m.peak_rss)}, "
                  f"tasks/worker {m.info['executed']}", flush=True)

    wall = {k: statistics.median(m.wall for m in runs[k]) for k in FACTORS}
    job = {k: statistics.median(m.info["report"]["stage_seconds"]["compute+write"] for m in runs[k]) for k in FACTORS}
    peak = {k: statistics.median(m.peak_rss for m in runs[k]) for k in FACTORS}
    mean_peak = statistics.mean(peak.values())
    rows = [[f"{k}x", f"{sizes[k]}²", f"{sizes[k] ** 2 * 8 / 1e6:.0f} Mpx", f"{wall[k]:.2f} s",
             f"{wall[k] / wall[1]:.2f}", f"{job[k]:.2f} s", f"{job[k] / job[1]:.2f}",
             f"{sizes[k] ** 2 * 8 / job[k] / 1e6:.0f} Mpx/s", gb(peak[k]), f"{peak[k] / mean_peak - 1:+.0%}"]
            for k in FACTORS]
    print()
    print(f"rasterflow, masked NDVI median over 8 dates, median of {args.rounds} rounds "
          f"({time.perf_counter() - started:.0f} s in all)")
    print(table(rows, ["area", "tile", "input", "wall", "wall / 1x", "compute+write", "c+w / 1x", "throughput",
                       "peak RSS (tree)", "vs mean"]))
    spread = (max(peak.values()) - min(peak.values())) / mean_peak
    print(f"peak RSS spread {spread:.0%} of the mean (target: within ±10%)")
    plot(sizes, wall, job, peak, args.png)
    print(f"plot: {args.png}")


def plot(sizes, wall, job, peak, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    factors = list(sizes)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(factors, [wall[k] for k in factors], "o-", label="whole process")
    left.plot(factors, [job[k] for k in factors], "s-", label="compute+write stage")
    left.plot(factors, [job[factors[0]] * k for k in factors], ":", color="grey", label="linear from 1x")
    left.set(xlabel="input area (x the 1x job)", ylabel="seconds", title="wall time", xticks=factors)
    left.legend()
    right.plot(factors, [peak[k] / 1e9 for k in factors], "o-", color="tab:red")
    mean = sum(peak.values()) / len(peak) / 1e9
    right.axhspan(mean * 0.9, mean * 1.1, color="tab:red", alpha=0.1, label="mean ±10%")
    right.set(xlabel="input area (x the 1x job)", ylabel="GB", title="peak RSS, process tree", xticks=factors,
              ylim=(0, max(peak.values()) / 1e9 * 1.3))
    right.legend()
    fig.suptitle(f"rasterflow scaling: {sizes[factors[0]]}² to {sizes[factors[-1]]}², 8 dates, 2 workers x 1 thread")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
