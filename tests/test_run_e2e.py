"""`rasterflow run` end to end on real COGs and real Dask processes, against an independent NumPy reference."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import rasterio
import xarray as xr
from click.testing import CliRunner

from conftest import sample_with_truncated_file
from rasterflow.cli import cli
from reference import assert_same, load_items, masked_ndvi, months, read_asset_stack, reduce_reference

pytestmark = pytest.mark.slow


def _run(spec: Path, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["run", str(spec), *extra])
    return result.exit_code, result.output


def _report(output: Path) -> dict:
    return json.loads(Path(str(output) + ".report.json").read_text())


def _open_zarr(path: Path) -> xr.Dataset:
    """The output, its periods indexed by their labels ("2024-06"; the stored coordinate holds their starts)."""
    import rioxarray  # noqa: F401

    ds = xr.open_zarr(path, consolidated=True)
    if "period_label" in ds.coords:
        ds = ds.assign_coords(period=ds["period_label"].values)
    return ds


def _expected_transform(sample):
    minx, _, _, maxy = sample.bounds
    return rasterio.Affine(10.0, 0.0, minx, 0.0, -10.0, maxy)


def _read_outputs(out_dir: Path, fmt: str, name: str, labels: list[str] | None):
    """The written result per period label (None without a period) and its transform, read back from disk."""
    if fmt == "zarr":
        ds = _open_zarr(out_dir / f"{name}.zarr")
        assert ds.attrs.get("rasterflow_complete") is True
        assert ds.rio.crs.to_epsg() == 32633
        if labels is None:
            return {None: ds["ndvi"].values}, ds.rio.transform()
        return {str(p): ds["ndvi"].sel(period=p).values for p in ds["period"].values}, ds.rio.transform()
    from rio_cogeo.cogeo import cog_validate

    found, transform = {}, None
    for label in labels or [None]:
        path = out_dir / (f"{name}.tif" if label is None else f"{name}_{label}.tif")
        valid, errors, warnings = cog_validate(str(path), strict=True)
        assert valid and not errors and not warnings, (path, errors, warnings)
        with rasterio.open(path) as src:
            assert src.crs.to_epsg() == 32633 and src.descriptions == ("ndvi",)
            found[label], transform = src.read(1), src.transform
    return found, transform


@pytest.mark.parametrize("fmt", ["zarr", "cog"])
@pytest.mark.parametrize("period", [None, "month"])
@pytest.mark.parametrize("method,q", [("median", None), ("mean", None), ("quantile", 0.25)])
def test_result_equals_numpy(write_spec, sample, tmp_path, fmt, period, method, q):
    reduce = f"{{method: {method}" + (f", q: {q}" if q is not None else "") + (f", period: {period}" if period else "")
    suffix = "zarr" if fmt == "zarr" else "tif"
    spec = write_spec(reduce=reduce + "}", output=f"out/r.{suffix}")
    code, output = _run(spec)
    assert code == 0, output
    items = load_items(sample, _report(tmp_path / "out" / f"r.{suffix}")["item_ids"])
    series = masked_ndvi(items)
    labels = np.array(months(items)) if period else None
    expected = ({None: reduce_reference(series, method, q)} if labels is None else
                {m: reduce_reference(series[labels == m], method, q) for m in sorted(set(labels))})
    actual, transform = _read_outputs(tmp_path / "out", fmt, "r", sorted(expected) if period else None)
    assert sorted(actual, key=str) == sorted(expected, key=str)
    assert len(expected) >= (3 if period else 1)
    for label, values in expected.items():
        assert_same(actual[label], values, rtol=1e-5 if method == "quantile" else 2e-6)
    assert transform == _expected_transform(sample)


def test_items_with_proj_code_only_land_on_the_same_grid(write_spec, sample, tmp_path):
    # pystac >= 1.12 writes proj:code instead of proj:epsg; stackstac 0.5.1 reads only proj:epsg and, given an
    # explicit epsg, silently shifts the grid. The catalog restores proj:epsg; the result must stay pixel-exact.
    items = json.loads(Path(sample.items_json).read_text())
    for item in items["features"]:
        item["properties"].pop("proj:epsg", None)
        for asset in item["assets"].values():
            asset.pop("proj:epsg", None)
        assert item["properties"]["proj:code"] == "EPSG:32633"
    rewritten = tmp_path / "proj_code_items.json"
    rewritten.write_text(json.dumps(items))
    spec = write_spec(catalog=str(rewritten), reduce="{method: median}", output="out/pc.zarr")
    code, output = _run(spec)
    assert code == 0, output
    ds = _open_zarr(tmp_path / "out" / "pc.zarr")
    assert ds.rio.transform() == _expected_transform(sample)
    items_used = load_items(sample, _report(tmp_path / "out" / "pc.zarr")["item_ids"])
    assert_same(ds["ndvi"].values, reduce_reference(masked_ndvi(items_used), "median"))


def test_zarr_quantiles_per_month_and_two_bands(write_spec, sample, tmp_path):
    spec = write_spec(
        reduce="{method: quantile, q: [0.1, 0.9], period: month}",
        bands='ndvi: "(nir - red) / (nir + red)"\nbright: "where(ndvi > 0.3, nir, red) * 2"',
        output="out/q.zarr",
    )
    code, output = _run(spec)
    assert code == 0, output
    out = tmp_path / "out" / "q.zarr"
    ds = _open_zarr(out)
    items = load_items(sample, _report(out)["item_ids"])
    ndvi, labels = masked_ndvi(items), np.array(months(items))
    red, nir, scl = (read_asset_stack(items, a) for a in ("red", "nir", "scl"))
    drop = np.isin(scl, (3, 8, 9, 10))
    red, nir = np.where(drop, np.nan, red), np.where(drop, np.nan, nir)
    bright = (np.where(ndvi > 0.3, nir, red) * 2).astype(np.float32)
    assert list(ds["period"].values) == sorted(set(labels))
    assert list(ds["quantile"].values) == [0.1, 0.9]
    for p, month in enumerate(ds["period"].values):
        for name, series in (("ndvi", ndvi), ("bright", bright)):
            expected = reduce_reference(series[labels == month], "quantile", [0.1, 0.9])
            assert_same(ds[name].isel(period=p).values, expected, rtol=1e-5, atol=1e-6)


def test_time_series_without_reduce(write_spec, sample, tmp_path):
    spec = write_spec(output="out/ts.zarr", chunks="{time: 2, y: 128, x: 128}")
    code, output = _run(spec)
    assert code == 0, output
    out = tmp_path / "out" / "ts.zarr"
    ds = _open_zarr(out)
    items = load_items(sample, _report(out)["item_ids"])
    assert ds["ndvi"].dims == ("time", "y", "x")
    assert_same(ds["ndvi"].values, masked_ndvi(items))


def test_mean_with_time_chunked_uses_a_tree_reduction(write_spec, sample, tmp_path):
    spec = write_spec(reduce="{method: mean}", output="out/m.zarr", chunks="{time: 3, y: 128, x: 128}")
    code, output = _run(spec)
    assert code == 0, output
    out = tmp_path / "out" / "m.zarr"
    items = load_items(sample, _report(out)["item_ids"])
    assert_same(_open_zarr(out)["ndvi"].values, reduce_reference(masked_ndvi(items), "mean"), rtol=1e-5)


def test_report_contents(write_spec, tmp_path):
    spec = write_spec(reduce="{method: median}", output="out/r.zarr")
    code, output = _run(spec)
    assert code == 0, output
    report = _report(tmp_path / "out" / "r.zarr")
    assert report["status"] == "ok" and report["exit_code"] == 0
    assert report["spec_sha256"] and report["item_ids"]
    assert report["grid"]["shape"] == [256, 256]
    assert report["predicted_peak_per_worker"] > 0
    assert report["measured_peak_per_worker"] and all(v > 0 for v in report["measured_peak_per_worker"].values())
    assert report["outputs"][0]["bytes"] > 0
    assert {"search", "plan", "compute+write"} <= set(report["stage_seconds"])
    assert "report:" in output


def test_no_items_exit_1_nothing_written(write_spec, tmp_path):
    spec = write_spec(reduce="{method: median}", output="out/none.zarr", query='{"eo:cloud_cover": {lt: -1}}')
    code, output = _run(spec)
    assert code == 1
    assert "no items" in output.lower()
    assert not (tmp_path / "out" / "none.zarr").exists()
    assert not (tmp_path / "out" / "none.zarr.partial").exists()


def test_existing_output_refused_exit_2_untouched(write_spec, tmp_path):
    out = tmp_path / "out" / "x.tif"
    out.parent.mkdir()
    out.write_bytes(b"precious")
    spec = write_spec(reduce="{method: median}", output="out/x.tif")
    code, output = _run(spec)
    assert code == 2, output
    assert "overwrite" in output
    assert out.read_bytes() == b"precious"


def test_cog_failing_midway_leaves_no_file(write_spec, sample, tmp_path):
    # A real fault: one input COG is truncated, so reading it fails in the middle of the computation.
    catalog, _victim = sample_with_truncated_file(sample, tmp_path, 3)
    spec = write_spec(catalog=str(catalog), reduce="{method: median}", output="out/fail.tif")
    code, output = _run(spec)
    assert code == 1, output
    left = {p.name for p in (tmp_path / "out").iterdir()}
    # what stays: the report, the output's hidden lock file, and the workers' log when they logged the read error
    assert left - {"fail.tif.workers.log"} == {"fail.tif.report.json", ".fail.tif.rasterflow-lock"}
    assert _report(tmp_path / "out" / "fail.tif")["status"] == "failed"


def test_sigkill_halfway_through_zarr_then_resume(sample, tmp_path):
    from conftest import spec_text

    def spec_at(name):
        path = tmp_path / name
        path.write_text(spec_text(sample, reduce="{method: median}", output=f"out/{name}.zarr",
                                  chunks="{time: -1, y: 32, x: 32}",
                                  cluster="{n_workers: 1, threads_per_worker: 1, memory_limit: 2GB}"))
        return path

    killed, clean = spec_at("killed"), spec_at("clean")
    staging = tmp_path / "out" / "killed.zarr.partial"
    proc = subprocess.Popen([sys.executable, "-m", "rasterflow", "run", str(killed)], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    done_dir = staging / ".rasterflow" / "done"
    while time.monotonic() < deadline:
        if done_dir.exists() and sum(1 for _ in done_dir.rglob("*") if _.is_file()) >= 3:
            break
        assert proc.poll() is None, proc.stdout.read().decode()
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert not (tmp_path / "out" / "killed.zarr").exists()
    assert staging.exists()
    import zarr

    state = dict(zarr.open_group(str(staging), mode="r").attrs)  # Zarr v2 (.zattrs) or v3 (zarr.json)
    assert state.get("rasterflow_complete") is not True
    finished_before = sum(1 for _ in done_dir.rglob("*") if _.is_file())
    assert 0 < finished_before < 64

    code, output = _run(killed)
    assert code == 0, output
    assert "skipped" in output or "resum" in output
    code, output = _run(clean)
    assert code == 0, output
    resumed = _open_zarr(tmp_path / "out" / "killed.zarr")["ndvi"].values
    uninterrupted = _open_zarr(tmp_path / "out" / "clean.zarr")["ndvi"].values
    np.testing.assert_array_equal(resumed, uninterrupted)


def test_plot_and_progress_lines(write_spec, tmp_path):
    spec = write_spec(reduce="{method: median}", output="out/p.tif")
    code, output = _run(spec, "--plot")
    assert code == 0, output
    png = tmp_path / "out" / "p.tif.memory.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "blocks written, 100%" in output  # plain progress lines when stdout is not a terminal
    report = _report(tmp_path / "out" / "p.tif")
    from rasterflow.report import RunReport, memory_plot_data

    data = memory_plot_data(RunReport.from_dict(report))
    workers = {s["worker"] for s in report["memory_samples"]} - {"client"}
    assert len(workers) == 2 and workers <= set(data["series"])
    for worker in workers:
        samples = [s for s in report["memory_samples"] if s["worker"] == worker]
        assert data["series"][worker]["rss"] == [s["rss"] for s in samples]
        assert max(s.get("rss_peak", s["rss"]) for s in samples) == report["measured_peak_per_worker"][worker]
    assert data["predicted"] == report["predicted_peak_per_worker"]
    assert data["thresholds"]["pause"] == int(report["memory_limit"] * 0.8)
    assert [name for _, name in data["marks"]] == ["graph", "compute+write"]


def test_plan_json_and_exit_codes(write_spec):
    spec = write_spec(reduce="{method: median}")
    result = CliRunner().invoke(cli, ["plan", "--json", str(spec)])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["items"] == 8 and plan["grid"]["shape"] == [256, 256]
    assert plan["budget"]["chunk_shape"] == {"time": 8, "y": 96, "x": 96}
    assert plan["budget"]["ok"] is True
    refused = write_spec("refused.yaml", reduce="{method: median}", chunks="{time: 2, y: 96, x: 96}")
    result = CliRunner().invoke(cli, ["plan", "--fix", str(refused)])
    assert result.exit_code == 3
    assert "chunks: {time: -1, y: 96, x: 96}" in result.output  # the complete section (issue 10)


def test_profile_prints_measured_vs_predicted(write_spec, tmp_path):
    # A whole-grid chunk: with tiny chunks GDAL's fixed per-read allocations would dominate the task.
    spec = write_spec(reduce="{method: median}", chunks="{time: -1, y: -1, x: -1}")
    flame = tmp_path / "flame.html"
    result = CliRunner().invoke(cli, ["profile", str(spec), "--flamegraph", str(flame)])
    assert result.exit_code == 0, result.output
    import re

    predicted = re.search(r"predicted per task\s+([\d.]+) (kB|MB)", result.output)
    measured = re.search(r"measured, memray\s+([\d.]+) (kB|MB)\s+measured/predicted ([\d.]+)", result.output)
    assert predicted and measured, result.output
    assert 0.3 < float(measured.group(3)) < 3.0  # the model is in the right range for one real task
    assert "largest allocation sites alive at the peak" in result.output
    assert flame.read_text().lstrip().lower().startswith("<!doctype html")
    result = CliRunner().invoke(cli, ["profile", str(spec), "--no-memray"])
    assert result.exit_code == 0, result.output
    assert re.search(r"measured, tracemalloc\s+[\d.]+ (kB|MB)\s+measured/predicted [\d.]+", result.output)
    # GDAL's block cache was sized for the task only: nothing left in this process's environment (a later
    # LocalCluster in the same process, a notebook's, would inherit it)
    assert "GDAL_CACHEMAX" not in os.environ


def test_existing_period_file_refused_before_the_cluster_starts(write_spec, sample, tmp_path):
    items = load_items(sample)
    first_month = months(items)[0]
    taken = tmp_path / "out" / f"m_{first_month}.tif"
    taken.parent.mkdir()
    taken.write_bytes(b"precious")
    spec = write_spec(reduce="{method: median, period: month}", output="out/m.tif")
    code, output = _run(spec)
    assert code == 2, output
    assert str(taken) in output
    assert taken.read_bytes() == b"precious"
    report = _report(tmp_path / "out" / "m.tif")
    assert "cluster start" not in report["stage_seconds"]
    assert sorted(p.name for p in taken.parent.iterdir()) == sorted([taken.name, "m.tif.report.json",
                                                                     ".m.tif.rasterflow-lock"])


def _mosaic_reference(sample) -> tuple[np.ndarray, list[str]]:
    """Masked NDVI per date, each date's tiles placed on the union grid (rasterio + NumPy only); where tiles of a
    pass overlap, a pixel takes the first tile (in item order) whose red and nir are both valid there."""
    items = load_items(sample)
    minx, _, maxx, maxy = sample.bounds
    width = int(round((maxx - minx) / 10))
    height = int(round((maxy - sample.bounds[1]) / 10))
    dates = sorted({item["properties"]["datetime"][:10] for item in items})
    out = np.full((len(dates), height, width), np.nan, dtype=np.float32)
    for item in items:
        ndvi = masked_ndvi([item])[0]
        with rasterio.open(item["assets"]["red"]["href"]) as src:
            col = int(round((src.transform.c - minx) / 10))
            row = int(round((maxy - src.transform.f) / 10))
        d = dates.index(item["properties"]["datetime"][:10])
        target = out[d, row:row + ndvi.shape[0], col:col + ndvi.shape[1]]
        np.copyto(target, ndvi, where=np.isnan(target))
    return out, dates


def test_group_by_solar_day_mosaics_the_tiles_of_a_pass(two_tile_sample, tmp_path):
    from conftest import spec_text

    sample = two_tile_sample
    grouped = tmp_path / "grouped.yaml"
    grouped.write_text(spec_text(sample, output="out/grouped.zarr", chunks="{time: -1, y: 64, x: 96}",
                                 group_by="solar_day"))
    per_item = tmp_path / "per_item.yaml"
    per_item.write_text(spec_text(sample, output="out/per_item.zarr", chunks="{time: -1, y: 64, x: 96}"))
    for spec in (grouped, per_item):
        code, output = _run(spec)
        assert code == 0, output
    expected, dates = _mosaic_reference(sample)
    ds = _open_zarr(tmp_path / "out" / "grouped.zarr")
    assert [str(t)[:10] for t in ds["time"].values] == dates  # 4 dates, not 8 items
    assert_same(ds["ndvi"].values, expected)
    assert _open_zarr(tmp_path / "out" / "per_item.zarr").sizes["time"] == 2 * len(dates)


def test_group_by_solar_day_median_per_month(two_tile_sample, tmp_path):
    from conftest import spec_text

    spec = tmp_path / "s.yaml"
    spec.write_text(spec_text(two_tile_sample, output="out/m.zarr", reduce="{method: median, period: month}",
                              group_by="solar_day"))
    code, output = _run(spec)
    assert code == 0, output
    expected, dates = _mosaic_reference(two_tile_sample)
    labels = np.array([d[:7] for d in dates])
    ds = _open_zarr(tmp_path / "out" / "m.zarr")
    assert list(ds["period"].values) == ["2024-06", "2024-07", "2024-08"]  # every month of the window
    for month in ds["period"].values:
        if not (labels == month).any():  # a month of the window without a pass: in the output, all NaN
            assert np.isnan(ds["ndvi"].sel(period=month).values).all()
            continue
        assert_same(ds["ndvi"].sel(period=month).values, reduce_reference(expected[labels == month], "median"))
    assert set(labels) < set(ds["period"].values)  # this sample leaves a month empty


def test_a_deep_chunk_is_reduced_in_sub_blocks_on_real_workers(sample, tmp_path):
    """A 2048² chunk of 8 dates (the sample warped to 1.25 m: every source pixel an 8 x 8 block) is over the
    per-task target, so ``plan`` cuts it into sub-blocks of whole source tiles; the run on a LocalCluster equals the
    NumPy median of the native pixels, repeated 8 x 8 (nearest neighbour), and its workers stay within the plan."""
    from conftest import spec_text

    text = spec_text(sample, reduce="{method: median, period: month}", chunks="{time: -1, y: 2048, x: 2048}",
                     output="out/deep.zarr").replace("resolution: 10", "resolution: 1.25")
    spec = tmp_path / "deep.yaml"
    spec.write_text(text)
    planned = CliRunner().invoke(cli, ["plan", str(spec), "--json"])
    assert planned.exit_code == 0, planned.output
    budget = json.loads(planned.output)["budget"]
    rows, cols = budget["sub_block"]
    assert 0 < rows < 2048 and 0 < cols <= 2048 and rows % 128 == 0 and cols % 128 == 0  # whole 128² source tiles
    assert budget["peak_task_bytes"] < 2048 * 2048 * 4 * 8  # below one band's whole 8-date series
    code, output = _run(spec)
    assert code == 0, output
    report = _report(tmp_path / "out" / "deep.zarr")
    items = load_items(sample, report["item_ids"])
    series = masked_ndvi(items)
    labels = np.array(months(items))
    ds = _open_zarr(tmp_path / "out" / "deep.zarr")
    assert len(ds["period"]) >= 3
    for label in ds["period"].values:
        native = reduce_reference(series[labels == str(label)], "median")
        expected = np.repeat(np.repeat(native, 8, axis=0), 8, axis=1)
        assert_same(ds["ndvi"].sel(period=label).values, expected)
    assert max(report["measured_peak_per_worker"].values()) <= report["predicted_peak_per_worker"] * 1.25
