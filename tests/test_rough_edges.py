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
    old = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        return CliRunner().invoke(cli, list(args))
    finally:
        os.chdir(old)


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
