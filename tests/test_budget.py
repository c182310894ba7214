"""The static memory model: hand-computed arithmetic, refusals with exit code 3, fixes that pass when applied."""

from __future__ import annotations

import json
import textwrap

import pytest
import yaml
from click.testing import CliRunner

from rasterflow import budget
from rasterflow.cli import cli
from rasterflow.errors import BudgetExceededError
from rasterflow.planning import make_plan, static_check
from rasterflow.sizing import MachineInfo, WorkerLayout, size_local_cluster
from rasterflow.spec import load_spec, load_spec_text
from rasterflow.spec.models import Spec

MB = 10**6
GB = 10**9

BASE = textwrap.dedent(
    """\
    version: 1
    name: budget-case
    source:
      stac:
        catalog: items.json
        collections: [c]
        bbox: [13.0, 52.3, 13.8, 52.7]
        datetime: 2024-06-01/2024-08-31
        max_items: 1
      assets: {red: red, nir: nir, scl: scl}
    grid: {crs: "EPSG:32633", resolution: 10, bounds: [0, 0, 81920, 81920], dtype: float32}
    chunks: {time: -1, y: 1024, x: 1024}
    bands:
      ndvi: "(nir - red) / (nir + red)"
    output: {path: out/x.zarr}
    cluster: {n_workers: 1, threads_per_worker: 4, memory_limit: 4GB, gdal_cachemax: 0}
    """
)


def _spec(overrides: dict | None = None) -> Spec:
    data = yaml.safe_load(BASE)
    for section, values in (overrides or {}).items():
        if isinstance(values, dict) and isinstance(data.get(section), dict):
            data[section] = {**data[section], **values}
        else:
            data[section] = values
    return Spec.model_validate(data)


def _layout(spec: Spec) -> WorkerLayout:
    c = spec.cluster
    return size_local_cluster(MachineInfo(cores=8, memory_bytes=64 * 2**30), n_workers=c.n_workers,
                              threads_per_worker=c.threads_per_worker, memory_limit=c.memory_limit)


def test_ndvi_1024_float32_four_threads_hand_computed():
    # One date (max_items 1), 1024 × 1024 px × 4 B = 4.19 MB a plane. While NDVI is evaluated, red and nir in the
    # working dtype, nir-red and nir+red are alive and the quotient is written into the output series
    # (kernels._band_series: evaluate(out=)): 4 planes = 16.8 MB per task (expr.py counts 5 live arrays, the
    # quotient among them; budget.band_temporaries). On top, each task holds the loaded block (2 assets) and the
    # ndvi output series (1); 7 planes in all; each thread also keeps 2 files open (2 × OPEN_FILE_BYTES). No
    # reduction, so this is the time-series path; with time whole and one band, each chunk's one write follows its
    # band task on the same thread, so no finished block waits (budget.series_held; budget_accuracy.py rows 18 and
    # 25).
    spec = _spec()
    plan = make_plan(spec, layout=_layout(spec))
    report = plan.report
    plane = 1024 * 1024 * 4
    assert report.inputs.plane_bytes == plane
    assert report.worst_stage.stage == "band ndvi"
    assert report.path == "series"
    assert budget.pipeline_shape(spec).bands[0][1].live_arrays == 5
    assert report.worst_stage.planes == 2 + 1 + 4
    assert report.peak_task_bytes == 7 * plane
    assert report.held_bytes == 0
    assert report.open_files_bytes == 2 * budget.OPEN_FILE_BYTES
    assert report.concurrent_tasks == 4  # 64 chunks for 1 worker: every thread gets tasks
    # the largest task at its peak, the 3 others with their block (2 planes) and 0.6 of the rest (5 planes): their
    # series fill while they run, so 4 peaks do not coincide (budget.CONCURRENT_RAMP)
    others = 3 * int(2 * plane + budget.CONCURRENT_RAMP * 5 * plane)
    assert report.tasks_bytes == 7 * plane + others + report.held_bytes
    assert report.peak_per_worker == 7 * plane + others + 4 * 2 * budget.OPEN_FILE_BYTES \
        + budget.WORKER_BASELINE_BYTES
    assert report.ok


def test_masked_median_over_twelve_dates_hand_computed():
    # plane = 12 dates × 512 × 512 × 4 B = 12.58 MB; the reader hands the kernel one item at a time and the kernel
    # works one date at a time, so the loaded planes and the temporaries are one-date planes (1/12 of a plane each).
    # load: red, nir, scl of one item (floats: the static check cannot know the source dtype) = 3/12 = 0.25.
    # held for the whole task: that item (0.25) + the ndvi output series (1) = 1.25 planes.
    # mask "scl in (3, 8, 9, 10)" on float scl (no per-value table): the OR-chain's 3 temporaries and the NaN addend
    #   it becomes = 4 one-date planes (then the addend and red, nir in the working dtype: 3) -> 1.25 + 4/12.
    # ndvi: red and nir + nir-red and nir+red (the quotient is written into the series) = 4 -> 1.25 + 4/12.
    # median: 1.25 + 0.1 (the median copies no series, only the (y, x) result is new;
    #   budget.REDUCTION_EXTRA_PLANES) + the (group, quantile, band, y, x) result, 1 one-date plane = 1.433 planes.
    # write: the result + budget.ZARR_WRITE_PLANES one-date planes.
    # The worst stage is 19/12 planes = 19.9 MB per task: under budget.STRIP_TARGET_BYTES, so the chunk is whole.
    spec = _spec({
        "source": {"stac": {**yaml.safe_load(BASE)["source"]["stac"], "max_items": 12},
                   "assets": {"red": "red", "nir": "nir", "scl": "scl"}},
        "chunks": {"time": -1, "y": 512, "x": 512},
        "mask": "scl in (3, 8, 9, 10)",
        "reduce": {"method": "median"},
        "cluster": {"n_workers": 1, "threads_per_worker": 2, "memory_limit": "4GB", "gdal_cachemax": "256MB"},
    })
    report = make_plan(spec, layout=_layout(spec)).report
    one = 512 * 512 * 4
    plane = 12 * one
    stages = {s.stage: s.planes for s in report.stages}
    assert budget.pipeline_shape(spec).mask.live_arrays == 4  # scl + (scl==3) | (scl==8) ... as expr.py counts
    assert report.sub_block == (0, 0)
    assert stages["load"] == 0.25
    assert stages["mask"] == pytest.approx(19 / 12, abs=1e-3)
    assert stages["band ndvi"] == pytest.approx(19 / 12, abs=1e-3)
    assert stages["reduce median"] == pytest.approx(1.35 + 1 / 12, abs=1e-3)
    assert stages["write"] == pytest.approx((1 + budget.ZARR_WRITE_PLANES) / 12, abs=1e-3)
    assert report.peak_task_bytes == 19 * one
    files = 12 * 3 * budget.OPEN_FILE_BYTES
    # 8192² / 512² = 256 chunks for one worker: both threads busy; the reads fill the 256 MB GDAL cache (a chunk
    # decodes 12 × 512² × 3 assets × 4 B = 37.7 MB)
    assert report.concurrent_tasks == 2 and report.gdal_cache_bytes == 256 * MB
    # no finished result waits for its write: the Zarr writer runs a chunk's reduction and its write as one task
    assert report.held_bytes == 0
    item = int(0.25 * plane)
    second = int(item + budget.CONCURRENT_RAMP * (19 * one - item))  # its item + 0.6 of the rest
    assert report.peak_per_worker == 19 * one + second + 2 * files + 256 * MB + budget.WORKER_BASELINE_BYTES


def test_unused_assets_are_not_loaded():
    spec = _spec({"source": {"stac": yaml.safe_load(BASE)["source"]["stac"],
                             "assets": {"red": "red", "nir": "nir", "scl": "scl", "blue": "blue"}}})
    shape = budget.pipeline_shape(spec)
    assert shape.assets_loaded == ("red", "nir")


def test_float64_doubles_the_estimate():
    small = make_plan(_spec(), layout=_layout(_spec())).report
    big_spec = _spec({"grid": {"crs": "EPSG:32633", "resolution": 10, "bounds": [0, 0, 81920, 81920],
                               "dtype": "float64"}})
    big = make_plan(big_spec, layout=_layout(big_spec)).report
    assert big.peak_task_bytes == 2 * small.peak_task_bytes
    assert any("float64" in w for w in big.warnings)


def test_task_count_grows_with_smaller_chunks():
    a = make_plan(_spec(), layout=_layout(_spec())).report.task_count
    spec = _spec({"chunks": {"time": -1, "y": 512, "x": 512}})
    b = make_plan(spec, layout=_layout(spec)).report.task_count
    assert b > 3.5 * a


def test_too_many_tasks_refused_with_a_chunk_that_fixes_it():
    spec = _spec({"grid": {"crs": "EPSG:32633", "resolution": 10, "bounds": [0, 0, 1_500_000, 1_500_000]},
                  "chunks": {"time": -1, "y": 64, "x": 64}})
    report = make_plan(spec, layout=_layout(spec)).report
    assert not report.ok
    assert any("tasks" in r and "chunks.y = chunks.x =" in r for r in report.refusals)


CLASSIC_TIME_CHUNKED = BASE.replace("max_items: 1", "max_items: 40").replace(
    "chunks: {time: -1, y: 1024, x: 1024}", "chunks: {time: 10, y: 1024, x: 1024}"
) + "reduce: {method: median}\n"

CLASSIC_FLOAT64 = (
    BASE.replace("max_items: 1", "max_items: 10").replace("memory_limit: 4GB", "memory_limit: 1GB")
    .replace("dtype: float32", "dtype: float64")
    .replace("chunks: {time: -1, y: 1024, x: 1024}", "chunks: {time: -1, y: 4096, x: 4096}")
    + "reduce: {method: median}\n"
)


@pytest.mark.parametrize("text,needle", [
    (CLASSIC_TIME_CHUNKED, "chunks.time=10 splits time"),
    # the write of a 4096² float64 result (1 + budget.ZARR_WRITE_PLANES one-date planes) outweighs the sub-blocked
    # reduction
    (CLASSIC_FLOAT64, "over budget: the write stage holds 0.26 planes"),
])
def test_classic_failures_exit_3_before_anything_is_read(tmp_path, text, needle):
    # The catalog points at a file that does not exist: exit 3 proves nothing was searched or read.
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 3, result.output
    assert needle in result.output
    assert "fixes (each passes the check" in result.output
    assert "Traceback" not in result.output
    assert f"{path}:12:1" in result.output  # points at the chunks line


def test_float64_refusal_names_formula_with_numbers(tmp_path):
    loaded = load_spec_text(CLASSIC_FLOAT64, path=tmp_path / "s.yaml")
    with pytest.raises(BudgetExceededError) as info:
        static_check(loaded)
    message = str(info.value)
    # 10 dates × 4096² × 8 B = 1.34 GB a plane
    assert "10×4096×4096 float64 (1.34 GB)" in message
    assert "for 4 task(s) at once" in message
    assert "0.5 × 1 GB limit = 500 MB" in message


@pytest.mark.parametrize("text", [CLASSIC_TIME_CHUNKED, CLASSIC_FLOAT64])
def test_each_suggested_fix_passes_when_applied(tmp_path, text):
    loaded = load_spec_text(text, path=tmp_path / "s.yaml")
    plan = make_plan(loaded.spec)
    assert not plan.report.ok
    assert plan.report.fixes
    for fix in plan.report.fixes:
        # the sections as `plan --fix` prints them, each replacing the spec's own section whole
        data = loaded.spec.model_dump(mode="json", exclude_unset=True)
        data.update(budget.complete_patch(loaded.spec, fix.patch))
        fixed = Spec.model_validate(data)
        report = make_plan(fixed).report
        assert report.ok, (fix.description, report.refusals)
        assert report.peak_per_worker == fix.peak_per_worker


def test_largest_square_chunk_is_the_largest():
    loaded = load_spec_text(CLASSIC_FLOAT64)
    plan = make_plan(loaded.spec)
    chunk_fix = next(f for f in plan.report.fixes if "largest square" in f.description)
    side = chunk_fix.patch["chunks"]["y"]
    assert side % 256 == 0
    data = loaded.spec.model_dump(mode="json", exclude_unset=True)
    data["chunks"].update(y=side + 256, x=side + 256, time=-1)
    bigger = make_plan(Spec.model_validate(data)).report
    # over budget with the assumed float64 loads (fixes are solved for that): refused, or let through by validate
    # only because narrower loads could fit, which it says
    assert any(r.startswith("over budget") for r in bigger.refusals) \
        or any(w.startswith("over budget if the assets load as float64") for w in bigger.warnings)


def test_plan_json_shape_is_stable():
    report = make_plan(_spec(), layout=_layout(_spec())).report
    keys = set(report.to_dict())
    assert keys == {
        "ok", "grid_shape", "n_time", "time_source", "chunk_shape", "dtype", "plane_bytes", "task_count", "stages",
        "worst_stage", "peak_task_bytes", "open_files_bytes", "threads_per_worker", "n_workers", "gdal_cachemax", "baseline_bytes",
        "peak_per_worker", "memory_limit", "limit_source", "max_fraction", "fraction_of_limit", "refusals",
        "warnings", "fixes", "path", "concurrent_tasks", "tasks_bytes", "gdal_cache_bytes", "client_peak",
        "assumptions", "held_bytes", "sub_block",
    }
    json.dumps(report.to_dict())


def test_on_exceed_warn_runs_with_a_warning(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(CLASSIC_FLOAT64 + "budget: {on_exceed: warn}\n")
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "over budget" in result.output


def test_sizing_rule():
    machine = MachineInfo(cores=8, memory_bytes=64 * 2**30)
    layout = size_local_cluster(machine, threads_per_worker=2)
    # reserve = 20% of 64 GiB = 12.8 GiB; usable 51.2 GiB over 4 workers (8 cores / 2 threads)
    assert layout.n_workers == 4
    assert layout.memory_limit == pytest.approx(64 * 2**30 * 0.8 / 4, rel=1e-6)
    small = size_local_cluster(MachineInfo(cores=16, memory_bytes=4 * 2**30))
    # 4 GiB - 1 GiB reserve = 3 GiB: at most 3 workers of >= 1 GiB, not 16
    assert small.n_workers == 3
    assert small.memory_limit >= 2**30


def test_every_example_pipeline_passes_the_static_check():
    from pathlib import Path

    for path in sorted(Path(__file__).parent.parent.joinpath("pipelines").glob("*.yaml")):
        report = static_check(load_spec(path))
        assert report.ok, (path, report.refusals)


def test_under_used_cluster_warning_only_when_chunks_are_fewer_than_threads():
    big = {"source": {"stac": {**yaml.safe_load(BASE)["source"]["stac"], "max_items": 100},
                      "assets": {"red": "red", "nir": "nir"}},
           "grid": {"crs": "EPSG:32633", "resolution": 10, "bounds": [0, 0, 40960, 40960]}}
    # 4096² px × 100 dates × 2 assets × 4 B = 13.4 GB of input.
    few = _spec({**big, "chunks": {"time": -1, "y": 2048, "x": 2048},
                 "cluster": {"n_workers": 4, "threads_per_worker": 2, "memory_limit": "64GB"}})
    report = make_plan(few, layout=_layout(few)).report
    assert report.inputs.n_spatial_chunks == 4  # fewer than 2 × 8 threads
    assert any("under-used" in w for w in report.warnings)
    enough = _spec({**big, "chunks": {"time": -1, "y": 512, "x": 512},
                    "cluster": {"n_workers": 4, "threads_per_worker": 2, "memory_limit": "64GB"}})
    report = make_plan(enough, layout=_layout(enough)).report
    assert report.inputs.n_spatial_chunks == 64
    assert not any("under-used" in w for w in report.warnings)


def test_validate_with_a_cluster_address_says_the_limit_is_local(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(BASE.replace("cluster: {n_workers: 1,", "cluster: {address: 'tcp://127.0.0.1:9', n_workers: 1,"))
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "plan checks the cluster's" in result.output
