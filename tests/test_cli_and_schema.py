"""Example pipelines, the committed JSON Schema, the CLI surface and the light import path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rasterflow import __version__
from rasterflow.cli import cli
from rasterflow.spec import load_spec
from rasterflow.spec.schema import schema_text

ROOT = Path(__file__).resolve().parent.parent
PIPELINES = sorted((ROOT / "pipelines").glob("*.yaml"))


def test_there_are_example_pipelines():
    names = {p.name for p in PIPELINES}
    assert {"demo.yaml", "berlin_ndvi_summer.yaml", "ndwi_monthly.yaml"} <= names


@pytest.mark.parametrize("path", PIPELINES, ids=[p.name for p in PIPELINES])
def test_example_validates_and_carries_the_schema_line(path):
    loaded = load_spec(path)
    assert loaded.spec.name
    assert path.read_text().splitlines()[0] == "# yaml-language-server: $schema=../schemas/rasterflow.schema.json"


def test_validate_all_examples_exit_0():
    result = CliRunner().invoke(cli, ["validate", *map(str, PIPELINES)])
    assert result.exit_code == 0, result.output
    assert result.output.count("ok   ") == len(PIPELINES)


def test_committed_schema_is_current():
    committed = (ROOT / "schemas" / "rasterflow.schema.json").read_text()
    assert committed == schema_text(), "schemas/rasterflow.schema.json is stale; regenerate it with: rasterflow schema --write"


def test_schema_documents_every_field():
    schema = json.loads(schema_text())
    missing = []
    for name, definition in [("Spec", schema), *schema["$defs"].items()]:
        for field, prop in definition.get("properties", {}).items():
            ref = prop.get("$ref", "").rsplit("/", 1)[-1]
            if "description" not in prop and "description" not in schema["$defs"].get(ref, {}):
                missing.append(f"{name}.{field}")
    assert not missing
    assert schema["additionalProperties"] is False


def test_schema_check_command(tmp_path):
    stale = tmp_path / "schema.json"
    stale.write_text("{}")
    runner = CliRunner()
    assert runner.invoke(cli, ["schema", "--check", str(stale)]).exit_code == 1
    assert runner.invoke(cli, ["schema", "--write", str(stale)]).exit_code == 0
    assert runner.invoke(cli, ["schema", "--check", str(stale)]).exit_code == 0


def test_version():
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_spec_import_does_not_load_heavy_libraries():
    code = (
        "import sys, rasterflow.spec, rasterflow.cli, rasterflow.planning, rasterflow.budget, rasterflow.expr; "
        "heavy = [m for m in ('dask', 'xarray', 'rasterio', 'stackstac', 'pystac_client', 'distributed') "
        "if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("catalog, words, code", [("items.csv", "unsupported catalog file", 2),
                                                  ("nowhere/items.json", "catalog file not found", 1)])
def test_a_catalog_file_of_an_unsupported_kind_is_an_invalid_spec(tmp_path, catalog, words, code):
    """An unsupported kind is an invalid spec (exit 2); a file that does not exist (yet) a failed run (exit 1: an
    upstream step may write it, ``rasterflow retry`` reruns it). Both name the spec's line, no output is made."""
    text = (ROOT / "pipelines" / "demo.yaml").read_text()
    lines = text.splitlines()
    line = next(i for i, each in enumerate(lines, 1) if each.strip().startswith("catalog:"))
    lines[line - 1] = lines[line - 1].split("catalog:")[0] + f"catalog: {catalog}"
    (tmp_path / "items.csv").write_text("id\n")
    spec = tmp_path / "bad.yaml"
    spec.write_text("\n".join(lines) + "\n")
    for verb in ("plan", "run"):
        result = CliRunner().invoke(cli, [verb, str(spec)])
        assert result.exit_code == code, (verb, result.output)
        assert f"bad.yaml:{line}" in result.output and words in result.output, result.output
        assert "Traceback" not in result.output
    assert not [p for p in tmp_path.iterdir() if p.suffix in (".zarr", ".tif")]
