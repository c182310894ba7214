"""Issue 31, "Rough edges": a newcomer's usual mistakes end in a clear error (file:line, what to change), the
documented exit code, nothing lost and no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rasterflow.cli import cli

from conftest import spec_text


def _invoke(*args: str, cwd: Path | None = None):
    from rasterflow.cli import ConsoleState

    old = os.getcwd()
    state = (ConsoleState.debug, ConsoleState.verbosity, ConsoleState.log_format)  # global options outlive one invocation
    if cwd is not None:
        os.chdir(cwd)
    try:
        return CliRunner().invoke(cli, list(args))
    finally:
        os.chdir(old)
        ConsoleState.debug, ConsoleState.verbosity, ConsoleState.log_format = state


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


# 2. an unknown EPSG code --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_bounds", [True, False])
def test_unknown_epsg_is_invalid_at_validate_with_file_and_line(tmp_path, sample, with_bounds):
    text = spec_text(sample).replace("EPSG:32633", "EPSG:326333")
    if not with_bounds:
        text = "\n".join(line for line in text.splitlines() if "bounds:" not in line) + "\n"
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    result = _invoke("validate", str(spec))
    assert result.exit_code == 2, result.output
    assert f"{spec}:{_line_of(spec, 'EPSG:326333')}:" in result.output
    assert "grid.crs" in result.output and "EPSG:326333" in result.output
    assert "internal error" not in result.output and "Traceback" not in result.output


def test_unknown_epsg_plan_json_is_a_spec_error(tmp_path, sample):
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(sample).replace("EPSG:32633", "EPSG:326333"))
    result = _invoke("plan", "--json", str(spec))
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)["error"]
    assert error["type"] == "SpecError" and error["exit_code"] == 2


# 3. absurd grids ----------------------------------------------------------------------------------------------------


def test_resolution_typo_is_refused_with_size_tasks_and_fix(tmp_path, sample):
    spec = tmp_path / "spec.yaml"
    text = spec_text(sample)
    minx, miny = sample.bounds[:2]
    # a 20 km box at 0.001 m: 20 million pixels wide (10 was meant)
    text = text.replace(f"bounds: [{sample.bounds[0]}, {sample.bounds[1]}, {sample.bounds[2]}, {sample.bounds[3]}]",
                        f"bounds: [{minx}, {miny}, {minx + 20000}, {miny + 20000}]")
    spec.write_text(text.replace("resolution: 10", "resolution: 0.001"))
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = _invoke("validate", str(spec))
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert result.exit_code == 2, result.output
    assert f"{spec}:{_line_of(spec, 'resolution: 0.001')}:" in result.output
    assert "20,000,000 × 20,000,000 pixels" in result.output
    assert "tasks" in result.output and "did you mean 10?" in result.output
    assert grown_kb < 200_000  # nothing allocated per task


def test_huge_resolution_is_refused_at_validate(tmp_path, sample):
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(sample).replace("resolution: 10", "resolution: 1.0e+300"))
    result = _invoke("validate", str(spec))
    assert result.exit_code == 2, result.output
    assert f"{spec}:{_line_of(spec, 'resolution:')}:" in result.output
    assert "one pixel" in result.output
    spec.write_text(spec_text(sample).replace("resolution: 10", "resolution: 1e300"))  # YAML 1.1: text
    result = _invoke("validate", str(spec))
    assert result.exit_code == 2 and "YAML reads 1e300 as text: write it as 1.0e+300" in result.output


# 1. an unwritable output location; 6. a run that fails before writing leaves nothing beside its output ---------------


def _no_items_spec(sample, tmp_path: Path, output: str = "out/result.zarr", name: str = "spec.yaml") -> Path:
    spec = tmp_path / name
    spec.write_text(spec_text(sample, output=output).replace("2024-06-01/2024-08-31", "2020-06-01/2020-08-31"))
    return spec


@pytest.mark.parametrize("where", ["proc", "file"])
def test_unwritable_output_location_is_invalid_and_the_report_is_kept(tmp_path, sample, where):
    if where == "proc":
        output = "/proc/rasterflow-test/result.zarr"
    else:
        (tmp_path / "afile").write_text("not a folder")
        output = "afile/result.zarr"
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(sample, output=output))
    result = _invoke("run", str(spec), cwd=tmp_path)
    assert result.exit_code == 2, result.output
    assert f"{spec}:{_line_of(spec, 'output:')}:" in result.output and "output.path" in result.output
    assert "another run" not in result.output and "internal error" not in result.output
    assert "Change output.path" in result.output
    reports = list((tmp_path / ".rasterflow" / "reports").glob("*.report.json"))
    assert len(reports) == 1 and json.loads(reports[0].read_text())["exit_code"] == 2
    retried = _invoke("retry", cwd=tmp_path)
    assert retried.exit_code == 0 and "nothing to retry" in retried.output  # not re-queued forever


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_output_folder_is_invalid(tmp_path, sample):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        spec = tmp_path / "spec.yaml"
        spec.write_text(spec_text(sample, output="ro/result.zarr"))
        result = _invoke("run", str(spec), cwd=tmp_path)
        assert result.exit_code == 2, result.output
        assert "no permission" in result.output and "OSError" not in result.output
        assert list((tmp_path / ".rasterflow" / "reports").glob("*.report.json"))
    finally:
        folder.chmod(0o755)


def test_failed_before_writing_leaves_no_report_or_lock_beside_the_output(tmp_path, sample):
    spec = _no_items_spec(sample, tmp_path)
    result = _invoke("run", str(spec), cwd=tmp_path)
    assert result.exit_code == 1, result.output
    assert not (tmp_path / "out").exists()  # no lock file, no report, not even the folder
    reports = list((tmp_path / ".rasterflow" / "reports").glob("*-failed.report.json"))
    assert len(reports) == 1
    assert f"report: {Path('.rasterflow') / 'reports' / reports[0].name}" in result.output


def test_a_failed_run_keeps_what_an_existing_folder_holds(tmp_path, sample):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "other.txt").write_text("kept")
    result = _invoke("run", str(_no_items_spec(sample, tmp_path)), cwd=tmp_path)
    assert result.exit_code == 1
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["other.txt"]


# 5. every invocation keeps its results; the state folder is pruned --------------------------------------------------


def test_two_invocations_keep_both_results_and_retry_finds_the_failure(tmp_path, sample):
    failing = _no_items_spec(sample, tmp_path, name="failing.yaml")
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text("version: 1\nname: broken\n")
    assert _invoke("run", str(failing), cwd=tmp_path).exit_code == 1
    assert _invoke("run", str(invalid), cwd=tmp_path).exit_code == 2
    state = tmp_path / ".rasterflow"
    kept = sorted((state / "results").glob("*.json"))
    assert len(kept) == 2
    last = json.loads((state / "run_results.json").read_text())
    assert last["results_file"] == str(Path(".rasterflow") / "results" / kept[-1].name)
    assert last["results"][0]["status"] == "invalid"
    retried = _invoke("retry", cwd=tmp_path)
    assert "retrying 1 spec(s)" in retried.output, retried.output
    assert retried.exit_code == 1  # the failing spec ran again (and failed again)


def test_state_reports_and_results_are_pruned(tmp_path, sample):
    from rasterflow.batch import KEEP_RESULTS, KEEP_STATE_REPORTS

    reports = tmp_path / ".rasterflow" / "reports"
    results = tmp_path / ".rasterflow" / "results"
    reports.mkdir(parents=True)
    results.mkdir(parents=True)
    for index in range(KEEP_STATE_REPORTS + 20):
        path = reports / f"old-{index:04d}.report.json"
        path.write_text("{}")
        os.utime(path, (1_000_000 + index, 1_000_000 + index))
    for index in range(KEEP_RESULTS + 5):
        path = results / f"2020{index:04d}.json"
        path.write_text('{"results": []}')
        os.utime(path, (1_000_000 + index, 1_000_000 + index))
    _invoke("run", str(_no_items_spec(sample, tmp_path)), cwd=tmp_path)
    left = sorted(p.name for p in reports.iterdir())
    assert len(left) == KEEP_STATE_REPORTS
    assert "old-0000.report.json" not in left and any(name.startswith("test-run-") for name in left)
    assert len(list(results.iterdir())) == KEEP_RESULTS


# 8. interrupts, progress, the summary; a missing catalog and a swapped bbox ------------------------------------------


def test_an_interrupt_is_not_reported_as_an_error_and_the_progress_line_reads_well():
    import io

    from rasterflow.cluster import CountingProgress
    from rasterflow.errors import RunInterrupted

    stream = io.StringIO()
    with pytest.raises(RunInterrupted):
        with CountingProgress(label="blocks", stream=stream, interactive=False) as progress:
            progress.update(3, 8)
            raise RunInterrupted(2)
    assert stream.getvalue().splitlines()[-1].startswith("3/8 blocks written, 37%")
    assert stream.getvalue().rstrip().endswith("interrupted by SIGINT")
    assert "error" not in stream.getvalue() and "done" not in stream.getvalue()


def test_the_run_summary_says_how_many_items_were_used():
    from rasterflow.report import RunReport

    report = RunReport.start(spec_path="s.yaml", spec_sha256="0", catalog="items.json", name="n")
    report.item_ids = ["a", "b", "c"]
    report.grid = {"crs": "EPSG:32633", "bounds": [0, 0, 10, 10], "shape": [1, 1], "transform": [10, 0, 0, 0, -10, 10]}
    report.finish(0)
    assert "items: 3 used (ids in the report's item_ids)" in report.summary_lines()


def test_missing_catalog_file_names_the_spec_line(tmp_path, sample):
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(sample, catalog="data/missing.json"))
    result = _invoke("plan", str(spec))
    assert result.exit_code == 1, result.output  # a failed run: the file may come later (rasterflow retry)
    assert f"{spec}:{_line_of(spec, 'catalog:')}:" in result.output and "source.stac.catalog" in result.output
    assert "relative to the spec file" in result.output


def test_swapped_bbox_names_the_line_the_items_extent_and_the_swap(tmp_path, sample):
    west, south, east, north = sample.bbox_wgs84
    text = spec_text(sample)
    start = text.index("bbox: [")
    end = text.index("]", start) + 1
    spec = tmp_path / "spec.yaml"
    spec.write_text(text[:start] + f"bbox: [{south - 0.01}, {west - 0.01}, {north + 0.01}, {east + 0.01}]" + text[end:])
    result = _invoke("plan", str(spec))
    assert result.exit_code == 1, result.output
    assert f"{spec}:{_line_of(spec, 'bbox:')}:" in result.output and "source.stac.bbox" in result.output
    assert f"the items' extent (WGS84 lon/lat): [{west:.4f}, {south:.4f}" in result.output
    assert "looks like lat/lon" in result.output


# 7. the memory plot: scaled to the curves, stage labels apart ---------------------------------------------------------


def test_memory_plot_fits_the_curves_and_keeps_close_labels_apart(tmp_path):
    from rasterflow.report import RunReport, mark_rows, memory_plot_data, plot_memory, plot_y_top

    report = RunReport.start(spec_path="s.yaml", spec_sha256="0", catalog="items.json", name="n")
    report.memory_limit = 10 * 10**9
    report.predicted_peak_per_worker = 150 * 10**6
    report.memory_samples = [{"worker": "tcp://127.0.0.1:1", "t": t / 10, "rss": (60 + 8 * t) * 10**6}
                             for t in range(11)]
    report.stage_marks = [[0.0, "graph"], [0.01, "compute+write"], [0.02, "stac"], [0.9, "done"]]
    report.finish(0)
    top = plot_y_top(memory_plot_data(report))
    assert 150 * 10**6 < top < 300 * 10**6  # not the 10 GB limit
    rows = mark_rows([(float(t), str(n)) for t, n in report.stage_marks], 0.0, 1.0)
    assert rows[:3] == [0, 1, 2] and rows[3] == 0  # close labels on their own rows, a far one back on the first
    png = plot_memory(report, tmp_path / "m.png")
    assert png.stat().st_size > 10_000


# 4. the Python API in a script without a main guard --------------------------------------------------------------


@pytest.mark.slow
def test_api_in_a_plain_script_without_main_guard(tmp_path, sample):
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(sample, cluster="{n_workers: 1, threads_per_worker: 1, memory_limit: 2GB, "
                                              "processes: true}"))
    script = tmp_path / "job.py"
    script.write_text(f"import rasterflow\nresult = rasterflow.run({str(spec)!r})\nprint('STATUS', result.status)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("STATUS ok") == 1  # the workers did not run the script again
    assert "Traceback" not in done.stderr and "Nanny failed" not in done.stderr
    assert "__spec__" not in done.stderr


# 9. the API takes a mapping or a Spec; JSON error events are structured -------------------------------------------


def test_api_takes_a_mapping_and_a_spec(tmp_path, sample, monkeypatch):
    import yaml

    import rasterflow
    from rasterflow.errors import SpecError

    monkeypatch.chdir(tmp_path)
    data = yaml.safe_load(spec_text(sample))
    job = rasterflow.plan(data)
    assert job.grid.shape == (256, 256) and len(job.items) == 8
    loaded = rasterflow.load_spec(data)
    again = rasterflow.load_spec(loaded.spec)
    assert again.spec == loaded.spec
    assert rasterflow.plan(loaded.spec).grid == job.grid
    data["grid"]["crs"] = "EPSG:326333"
    with pytest.raises(SpecError, match=r"^<spec dict>: grid\.crs: EPSG:326333"):
        rasterflow.load_spec(data)
    with pytest.raises(SpecError, match="a path to a YAML file, a mapping or a rasterflow Spec"):
        rasterflow.run(42)


def _json_errors(output: str) -> list[dict]:
    events = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    return [e for e in events if e["event"] == "error"]


def test_json_error_events_carry_file_line_and_exit_code(tmp_path, sample):
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(sample).replace("EPSG:32633", "EPSG:326333"))
    result = _invoke("--log-format", "json", "validate", str(spec))
    (event,) = _json_errors(result.output)
    assert event["exit_code"] == 2 and event["type"] == "SpecError"
    assert (event["file"], event["line"], event["field"]) == (str(spec), _line_of(spec, "EPSG:326333"), "grid.crs")
    assert event["issues"][0]["line"] == event["line"]

    missing = tmp_path / "missing.yaml"
    missing.write_text(spec_text(sample, catalog="nope.json"))
    result = _invoke("--log-format", "json", "run", str(missing), cwd=tmp_path)
    assert result.exit_code == 1
    (event,) = _json_errors(result.output)
    assert event["exit_code"] == 1 and event["type"] == "CatalogError"
    assert (event["file"], event["line"], event["field"]) == (str(missing), _line_of(missing, "catalog:"),
                                                               "source.stac.catalog")


# 10. warnings are errors ----------------------------------------------------------------------------------------


def test_warnings_are_errors_in_the_test_configuration():
    import tomllib

    config = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    filters = config["tool"]["pytest"]["ini_options"]["filterwarnings"]
    assert filters[0] == "error"
    assert all(f.startswith("ignore:") and f.count(":") >= 3 for f in filters[1:])  # each names its module


def test_our_code_warns_nothing_where_it_used_to():
    import gc
    import warnings

    import numpy as np

    from rasterflow.fastreduce import nanmedian_time, nanquantile_sorted
    from rasterflow.sizing import local_machine

    values = np.array([[[np.inf, 1.0]], [[-np.inf, np.nan]], [[np.inf, 3.0]], [[-np.inf, 5.0]]], np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        local_machine()
        gc.collect()
        median = nanmedian_time(values, native=False)
        nanquantile_sorted(values, [0.25, 0.5], native=False)
    assert [str(w.message) for w in caught] == []
    assert np.isnan(median[0, 0]) and median[0, 1] == 3.0  # inf + -inf is NaN, as np.nanmedian says (warning)
