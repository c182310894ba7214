"""The run report: JSON round trip, atomic write, the human summary, stage timing and the memory plot."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rasterflow import __version__
from rasterflow.report import (
    MAX_MEMORY_SAMPLES,
    RunReport,
    StageTimer,
    default_report_path,
    library_versions,
    memory_plot_data,
    plot_memory,
    thin_samples,
)

DOCUMENTED_KEYS = {
    "rasterflow_version", "spec_path", "spec_sha256", "started_at", "finished_at", "status", "exit_code", "error",
    "library_versions", "catalog", "item_ids", "grid", "chunks", "task_count", "predicted_peak_per_worker",
    "memory_limit", "measured_peak_per_worker", "spilled_bytes", "stage_seconds", "outputs", "memory_samples",
    "stage_marks", "cluster",
}
LIBRARIES = {"python", "numpy", "dask", "distributed", "xarray", "rasterio", "gdal", "stackstac", "pystac_client", "zarr",
             "compiled_kernels", "tile_decoder"}
W1, W2 = "tcp://127.0.0.1:40001", "tcp://127.0.0.1:40002"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def samples() -> list[dict]:
    rows = []
    for i in range(20):
        t = i * 0.25
        rows.append({"t": t, "worker": W1, "rss": int(150e6 + i * 20e6), "rss_peak": int(160e6 + i * 20e6),
                     "managed": int(i * 10e6), "spilled": 0, "spill_written": 0})
        rows.append({"t": t, "worker": W2, "rss": int(150e6), "rss_peak": int(150e6), "managed": 0, "spilled": 0,
                     "spill_written": 0})
        rows.append({"t": t, "worker": "client", "rss": int(120e6), "rss_peak": int(120e6), "managed": 0,
                     "spilled": 0, "spill_written": 0})
    return rows


def full_report() -> RunReport:
    report = RunReport.start(spec_path="pipelines/demo.yaml", spec_sha256="ab" * 32, catalog="data/items.ndjson",
                             name="demo-ndvi")
    report.item_ids = ["S2A_1", "S2B_2"]
    report.grid = {"crs": "EPSG:32633", "bounds": [0.0, 0.0, 20480.0, 20480.0], "shape": [2048, 2048],
                   "transform": [10.0, 0.0, 0.0, 0.0, -10.0, 20480.0]}
    report.chunks = {"time": -1, "y": 1024, "x": 1024}
    report.task_count = 48
    report.predicted_peak_per_worker = 800_000_000
    report.memory_limit = 2_000_000_000
    report.measured_peak_per_worker = {W1: 640_000_000, W2: 400_000_000}
    report.spilled_bytes = 0
    report.stage_seconds = {"search": 0.21, "plan": 0.01, "compute+write": 3.52}
    report.outputs = [{"path": "out/ndvi.zarr", "bytes": 12_345_678}]
    report.memory_samples = samples()
    report.stage_marks = [[0.0, "graph"], [1.5, "compute+write"]]
    report.cluster = {"address": "tcp://127.0.0.1:39999", "n_workers": 2, "threads_per_worker": 1,
                      "dashboard_link": None, "is_local": True}
    return report.finish(0)


def test_json_round_trip_with_the_documented_keys():
    report = full_report()
    data = json.loads(report.to_json())
    assert DOCUMENTED_KEYS <= set(data)
    assert set(data["library_versions"]) == LIBRARIES
    assert data["library_versions"]["dask"] and data["library_versions"]["gdal"]
    assert data["library_versions"]["compiled_kernels"] == "rasterflow._native"  # CI's machines compile it
    assert data["library_versions"]["tile_decoder"].startswith("tifffile 20")  # a dependency: always there
    assert data["rasterflow_version"] == __version__
    assert data["status"] == "ok" and data["exit_code"] == 0
    assert data["started_at"].endswith("Z") and data["finished_at"].endswith("Z")
    assert data["memory_samples"][0] == {"t": 0.0, "worker": W1, "rss": 150_000_000, "rss_peak": 160_000_000,
                                         "managed": 0, "spilled": 0, "spill_written": 0}
    assert data["stage_marks"] == [[0.0, "graph"], [1.5, "compute+write"]]
    assert RunReport.from_json(report.to_json()) == report


def test_tuples_and_nan_become_plain_json():
    report = RunReport(grid={"bounds": (1.0, 2.0, 3.0, 4.0)}, stage_seconds={"x": float("nan")})
    data = json.loads(report.to_json())
    assert data["grid"]["bounds"] == [1.0, 2.0, 3.0, 4.0]
    assert data["stage_seconds"]["x"] is None


@pytest.mark.parametrize(
    ("code", "status"), [(0, "ok"), (1, "failed"), (2, "invalid"), (3, "over_budget")]
)
def test_finish_sets_status_from_the_exit_code(code, status):
    report = RunReport.start(spec_path="a.yaml").finish(code)
    assert (report.status, report.exit_code) == (status, code)
    assert report.wall_seconds() is not None and report.wall_seconds() >= 0


def test_write_is_atomic(tmp_path):
    path = tmp_path / "sub" / "out.zarr.report.json"
    report = full_report()
    assert report.write(path) == path
    assert RunReport.read(path) == report
    first = path.read_text()

    report.status = "failed"
    report.write(path)  # replaces
    assert json.loads(path.read_text())["status"] == "failed"

    broken = full_report()
    broken.error = object()  # cannot be serialised: nothing may be touched
    with pytest.raises(TypeError):
        broken.write(path)
    assert json.loads(path.read_text())["status"] == "failed"
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary files left
    assert first != path.read_text()


def test_default_report_path():
    assert default_report_path("out/ndvi.zarr") == "out/ndvi.zarr.report.json"
    assert default_report_path("out/ndvi.zarr/") == "out/ndvi.zarr.report.json"
    assert default_report_path("/data/median.tif") == "/data/median.tif.report.json"
    assert default_report_path("s3://bucket/x.zarr/") == "s3://bucket/x.zarr.report.json"


def test_summary_lines():
    lines = full_report().summary_lines()
    text = "\n".join(lines)
    assert lines[0] == "status: ok (exit 0)"
    assert "output: out/ndvi.zarr (12.3 MB)" in lines
    assert "time: search 0.2 s, plan 0.0 s, compute+write 3.5 s (total 3.7 s)" in lines
    assert "peak per worker: measured 640 MB, predicted 800 MB (measured/predicted 0.80), limit 2 GB (32%)" in lines
    assert "127.0.0.1:40001 640 MB" in text and "127.0.0.1:40002 400 MB" in text
    assert "spilled to disk: 0 B" in lines


def test_summary_says_what_the_remote_reads_cost_and_the_longest_wait():
    """A run whose concurrent reader read remote files: its requests, bytes, in-flight peak, how long the tasks
    waited and for which request longest, and the tasks that found their reads started; none without it."""
    report = full_report()
    assert not any(line.startswith("remote reads:") for line in report.summary_lines())
    report.reads = {"files": 108, "io": {
        "requests": 7344, "bytes": 2_522_728_220, "in_flight_peak": 68, "wait_seconds": 0.306, "tasks": 36,
        "tasks_ahead": 35, "longest_waits": [{"href": "https://h/a/red.tif", "seconds": 0.111, "bytes": 645066}]}}
    assert ("remote reads: 7,344 requests, 2.52 GB, 68 in flight at most per process; the tasks waited 0.3 s for "
            "bytes (longest 0.11 s, https://h/a/red.tif); 35 of 36 tasks found their reads started") \
        in report.summary_lines()


def test_summary_of_a_failed_run_with_spill():
    report = RunReport.start(spec_path="a.yaml")
    report.predicted_peak_per_worker = 1_000_000_000
    report.measured_peak_per_worker = {W1: 1_500_000_000}
    report.spilled_bytes = 3_000_000_000
    report.finish(1, error="run failed: KilledWorker")
    lines = report.summary_lines()
    assert lines[0] == "status: failed (exit 1): run failed: KilledWorker"
    assert any("measured/predicted 1.50" in line for line in lines)
    assert any(line.startswith("spilled to disk: 3 GB") for line in lines)
    assert RunReport.start(spec_path="a.yaml").finish(2).summary_lines() == ["status: invalid (exit 2)"]


def test_stage_timer_accumulates_and_marks():
    seconds: dict[str, float] = {}
    marks: list[str] = []
    timer = StageTimer(seconds, on_start=marks.append)
    with timer("plan"):
        time.sleep(0.05)
    with timer("plan"):
        time.sleep(0.05)
    with pytest.raises(ValueError):
        with timer.stage("write"):
            raise ValueError
    assert marks == ["plan", "plan", "write"]
    assert 0.09 < seconds["plan"] < 1.0
    assert "write" in seconds


def test_thinning_keeps_the_peaks():
    rows = []
    for i in range(3000):
        for worker in (W1, W2):
            rows.append({"t": i * 0.01, "worker": worker, "rss": 100 + (5000 if (worker, i) == (W1, 1234) else 0),
                         "managed": 0, "spilled": 0})
    thinned = thin_samples(rows)
    assert len(thinned) <= MAX_MEMORY_SAMPLES
    assert max(s["rss"] for s in thinned if s["worker"] == W1) == 5100
    assert {s["worker"] for s in thinned} == {W1, W2}
    assert [s["t"] for s in thinned] == sorted(s["t"] for s in thinned)
    assert thin_samples(rows[:10]) == rows[:10]


def test_plot_data_is_the_report_samples():
    report = full_report()
    data = memory_plot_data(report)
    assert set(data["series"]) == {W1, W2, "client"}
    for worker, line in data["series"].items():
        mine = [s for s in report.memory_samples if s["worker"] == worker]
        assert line["t"] == [s["t"] for s in mine]
        assert line["rss"] == [s["rss"] for s in mine]
        assert line["rss_peak"] == [s["rss_peak"] for s in mine]
    assert data["thresholds"] == {"target": 1_200_000_000, "spill": 1_400_000_000, "pause": 1_600_000_000,
                                  "terminate": 1_900_000_000, "limit": 2_000_000_000}
    assert data["predicted"] == 800_000_000
    assert data["marks"] == [(0.0, "graph"), (1.5, "compute+write")]
    assert data["title"] == "demo-ndvi"


def test_plot_memory_writes_a_png_and_imports_matplotlib_only_then(tmp_path):
    full_report().write(tmp_path / "r.json")
    png = tmp_path / "plots" / "memory.png"
    script = f"""
import sys
import rasterflow.report as report
heavy = [m for m in ("matplotlib", "dask", "distributed", "numpy", "rasterio") if m in sys.modules]
assert not heavy, heavy
loaded = report.RunReport.read({str(tmp_path / "r.json")!r})
loaded.library_versions = report.library_versions()
assert "matplotlib" not in sys.modules and "rasterio" not in sys.modules and "dask" not in sys.modules
out = report.plot_memory(loaded, {str(png)!r})
assert "matplotlib" in sys.modules
print(out)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == png
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert png.stat().st_size > 10_000


def test_plot_memory_without_limit_or_samples(tmp_path):
    report = RunReport.start(spec_path="pipelines/x.yaml").finish(1)
    path = plot_memory(report, tmp_path / "empty.png")
    assert path.read_bytes()[:8] == PNG_MAGIC
    assert memory_plot_data(report)["title"] == "x"


def test_library_versions_are_metadata_only():
    versions = library_versions()
    assert set(versions) == LIBRARIES
    assert versions["python"].count(".") == 2


def test_a_tiled_runs_summary_counts_its_outputs_instead_of_listing_them_all():
    """A run with one output per tile (output.tiling) would print 1,000 output lines; the summary shows a few and
    the count and total size, the report keeps every one. A short list is shown whole."""
    from rasterflow.report import SHOWN_PER_LIST, shortened

    report = RunReport.start(spec_path="a.yaml")
    report.outputs = [{"path": f"out/tiles/{i // 40}_{i % 40}.tif", "bytes": 2_000_000} for i in range(1000)]
    report.outputs[7]["bytes"] = None
    report.finish(0)
    lines = report.summary_lines()
    outputs = [line for line in lines if line.startswith("output: ")]
    assert outputs == [f"output: out/tiles/0_{i}.tif (2 MB)" for i in range(SHOWN_PER_LIST)]
    assert f"... and {1000 - SHOWN_PER_LIST:,} more outputs (in the run report)" in lines
    assert "outputs: 1,000 in all, 2 GB (1 of unknown size)" in lines
    assert len(lines) < 15 and len(report.to_dict()["outputs"]) == 1000
    assert shortened(["a", "b"], "x", shown=1) == ["a", "b"]  # one more line would say no less than the entry
    assert shortened(["a", "b", "c"], "x", shown=1) == ["a", "... and 2 more x (in the run report)"]
