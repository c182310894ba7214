"""Stage times of the fused per-chunk kernel, before and after a kernel change, side by side in one run.

One task's work without the read (issue 13, step 2): in-memory planes of one 1024 x 1024 chunk x 36 dates of
red / nir (uint16, scale 1e-4, offset -0.1, nodata 0) and SCL (uint8, ~30 % cloud, an always-cloudy corner of all-NaN
pixels), the mask (``--mask``, default the benchmarks' ``scl in (3, 8, 9, 10)``) and NDVI (``kernels._band_series``),
then the reduction over time of the float32 NDVI series for median, quantile (0.1, 0.5, 0.9) and mean, and the
whole fused task (``reduce_block``).

"before" runs with the compiled kernels (``rasterflow.compiled``) switched off: by default (``--before numpy``) the
working tree's ``kernels.py`` on its NumPy paths; with a git revision, ``rasterflow/kernels.py`` as of that revision
(922a3f2: before the per-value tables of ``rasterflow/lookup.py``; 58664af: before the pixel-major reduction),
loaded from git into its own module (a revision whose kernels.py imports other rasterflow modules than ``expr``
loads the working tree's, NumPy paths). "after" is the working tree's, with the compiled kernels where installed. The variants are interleaved round by round
(``--rounds``, medians reported; who goes first alternates) so a busy machine slows both alike. Every "after"
result is checked against "before" (median and mean: bit for bit; quantile: max difference, the float32 lerp became
NumPy's float64 one) and against NumPy (``np.nanmedian``, ``np.nanquantile`` with the list of quantiles, bit for
bit). Two floors for scale: one copy of the series (memory bandwidth) and one pixel-major transpose of it in
8192-pixel blocks.

Usage::

    python benchmarks/kernel_stages.py                 # 1024^2 x 36, 5 rounds (about a minute on 2 busy cores)
    python benchmarks/kernel_stages.py --size 512 --before 922a3f2
    python benchmarks/kernel_stages.py --size 512 --dates 16 --rounds 3
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rasterflow import compiled, fastreduce, kernels  # noqa: E402
from rasterflow.expr import parse_expression  # noqa: E402

BEFORE = "numpy"
QUANTILES = (0.1, 0.5, 0.9)


def load_before(revision: str):
    """``rasterflow/kernels.py`` at ``revision`` as a module of its own (it imports only rasterflow.expr)."""
    text = subprocess.run(["git", "-C", str(REPO), "show", f"{revision}:rasterflow/kernels.py"],
                          check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "kernels_before.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("kernels_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def make_task(size: int, dates: int, mask: str, seed: int = 0):
    """The raw planes of one chunk and the program's fields; :func:`planes_for` wraps the planes in a kernels
    module's own ``Planes`` class (each module checks ``isinstance`` against its own)."""
    rng = np.random.default_rng(seed)
    shape = (dates, size, size)
    red = rng.integers(200, 3000, shape, dtype=np.uint16)
    nir = rng.integers(1500, 6000, shape, dtype=np.uint16)
    red[rng.random(shape) < 0.02] = 0  # nodata
    scl = np.where(rng.random(shape) < 0.3, 9, 4).astype(np.uint8)
    scl[:, : size // 16, : size // 16] = 9  # always cloudy: all-NaN pixels
    raw = dict(raw=(red, nir, scl), covered=(None, None, None), nodata=np.zeros((dates, 3)),
               scale=np.full((dates, 3), 1e-4), offset=np.full((dates, 3), -0.1))
    common = dict(assets=("red", "nir", "scl"), mask=parse_expression(mask, ["scl"]),
                  masked_assets=("red", "nir"),
                  bands=(("ndvi", parse_expression("(nir - red) / (nir + red)", ["red", "nir"])),), dtype="float32")
    return raw, common


def planes_for(module, raw: dict):
    return module.Planes(**raw)


def timed(function) -> tuple[float, object]:
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


def floor_transpose(series: np.ndarray) -> None:
    t, height, width = series.shape
    rows = max(1, fastreduce.BLOCK_PIXELS // width)
    buffer = np.empty((rows, width, t), dtype=series.dtype)
    for y0 in range(0, height, rows):
        y1 = min(height, y0 + rows)
        np.copyto(buffer[: y1 - y0], series[:, y0:y1].transpose(1, 2, 0))


def differing(a: np.ndarray, b: np.ndarray) -> tuple[int, float]:
    """How many values differ, and the largest absolute difference."""
    valid = ~np.isnan(a) & ~np.isnan(b)
    diff = np.abs(a[valid].astype(np.float64) - b[valid])
    return int(np.count_nonzero(diff)), float(diff.max(initial=0))


def bitwise(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.array_equal(np.isnan(a), np.isnan(b)) and np.array_equal(a[~np.isnan(a)], b[~np.isnan(b)])
                and np.array_equal(a[~np.isnan(a)].view(np.uint32), b[~np.isnan(b)].view(np.uint32)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--dates", type=int, default=36)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", default=BEFORE, help="git revision of the 'before' kernels.py")
    parser.add_argument("--mask", default="scl in (3, 8, 9, 10)", help="the mask (on the uint8 SCL)")
    args = parser.parse_args(argv)

    before = kernels if args.before == "numpy" else load_before(args.before)
    raw, common = make_task(args.size, args.dates, args.mask)
    planes_of = {before: planes_for(before, raw), kernels: planes_for(kernels, raw)}
    planes = planes_of[kernels]
    series = kernels._band_series(planes, kernels.Program(**common))["ndvi"]  # the float32 (t, y, x) NDVI series
    nan_share = float(np.isnan(series).mean())
    empty_share = float(np.isnan(series).all(axis=0).mean())
    programs = {m: kernels.Program(**common, reduce_method=m, quantiles=QUANTILES if m == "quantile" else ())
                for m in ("median", "quantile", "mean")}

    stages = [
        ("mask + NDVI series (_band_series)",
         lambda k: k._band_series(planes_of[k], kernels.Program(**common))["ndvi"]),
        ("reduce median", lambda k: k.reduce_time(series, "median")),
        ("reduce quantile 0.1/0.5/0.9", lambda k: k.reduce_time(series, "quantile", QUANTILES)),
        ("reduce mean", lambda k: k.reduce_time(series, "mean")),
        ("fused task, median (reduce_block)", lambda k: k.reduce_block(planes_of[k], programs["median"])),
        ("fused task, quantile (reduce_block)", lambda k: k.reduce_block(planes_of[k], programs["quantile"])),
    ]
    times: dict[tuple[str, str], list[float]] = {}
    results: dict[tuple[str, str], object] = {}
    floors: dict[str, list[float]] = {"copy of the series": [], "pixel-major transpose (8192-px blocks)": []}
    scratch = np.empty_like(series)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for round_index in range(args.rounds):
            order = (("before", before), ("after", kernels))
            for label, run in stages:
                for name, module in order if round_index % 2 == 0 else order[::-1]:  # alternate who goes first
                    compiled.set_enabled(name == "after")
                    seconds, result = timed(lambda: run(module))
                    times.setdefault((label, name), []).append(seconds)
                    results[(label, name)] = result
                    del result
            compiled.set_enabled(True)
            floors["copy of the series"].append(timed(lambda: np.copyto(scratch, series))[0])
            floors["pixel-major transpose (8192-px blocks)"].append(timed(lambda: floor_transpose(series))[0])

        # correctness of this very run: after vs before vs NumPy
        median_after = results[("reduce median", "after")][0]
        quantile_after = results[("reduce quantile 0.1/0.5/0.9", "after")]
        quantile_before = results[("reduce quantile 0.1/0.5/0.9", "before")]
        checks = {
            "mask + NDVI series after == before (bitwise)": bitwise(
                results[("mask + NDVI series (_band_series)", "after")],
                results[("mask + NDVI series (_band_series)", "before")]),
            "median after == before (bitwise)": bitwise(median_after, results[("reduce median", "before")][0]),
            "median after == np.nanmedian (bitwise)": bitwise(median_after, np.nanmedian(series, axis=0)),
            "mean after == before (bitwise)": bitwise(results[("reduce mean", "after")][0],
                                                      results[("reduce mean", "before")][0]),
            "fused median after == before (bitwise)": bitwise(results[("fused task, median (reduce_block)", "after")],
                                                              results[("fused task, median (reduce_block)", "before")]),
        }
        sample = np.ascontiguousarray(series[:, :64, :])  # np.nanquantile loops per pixel in Python: a strip
        expected = np.nanquantile(sample, list(QUANTILES), axis=0, method="linear").astype(np.float32)
        checks["quantile after == np.nanquantile (bitwise, 64-row strip)"] = bitwise(
            quantile_after[:, :64].reshape(-1), expected.reshape(-1))
    n_diff, largest = differing(quantile_after, quantile_before)

    print(f"kernel stages: {args.size}x{args.size} px x {args.dates} dates, mask {args.mask!r}, float32 NDVI, {nan_share:.0%} NaN, "
          f"{empty_share:.1%} all-NaN pixels; before = kernels.py@{args.before} without compiled kernels, after = working "
          f"tree{' with' if compiled.available() else ' WITHOUT'} compiled kernels; "
          f"median of {args.rounds} interleaved rounds, one process")
    print()
    print("| stage | before | after | speed-up |")
    print("|---|---:|---:|---:|")
    for label, _run in stages:
        b, a = statistics.median(times[(label, "before")]), statistics.median(times[(label, "after")])
        print(f"| {label} | {b * 1000:.0f} ms | {a * 1000:.0f} ms | {b / a:.2f}x |")
    for label, values in floors.items():
        print(f"| floor: {label} | | {statistics.median(values) * 1000:.0f} ms | |")
    print()
    for label, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {label}")
    print(f"     quantile after vs before: {n_diff} of {quantile_after.size} values differ, by at most "
          f"{largest:.1e} (float32 eps {np.finfo(np.float32).eps:.1e}; NDVI is within [-1, 1])"
          + (": against 58664af, the float32 lerp became NumPy's float64 lerp, rounded once" if n_diff else ""))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
