"""The documentation site: its spec snippets are valid, its generated reference covers the whole spec, it builds.

* Every fenced ```yaml block in ``docs/`` (and the README) that is a full spec (a line ``version: ...``) is loaded
  by rasterflow's own loader. A block meant as a fragment says so with ``<!-- not-a-spec -->`` on the line before
  its fence (it is then not checked); fragments without ``version:`` are not specs and are skipped anyway.
* Every key path of the JSON Schema (the committed file and the models' live one) appears in the generated spec
  reference (``docs/gen_reference.py``), found by a walker of its own here, not the generator's.
* ``mkdocs build --strict`` succeeds (slow; skipped when the ``docs`` extra is not installed).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NOT_A_SPEC = "<!-- not-a-spec -->"
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```yaml[ \t]*$")


def _load_generator():
    spec = importlib.util.spec_from_file_location("rasterflow_docs_gen_reference", DOCS / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def yaml_blocks(path: Path) -> list[tuple[int, str, bool]]:
    """(line of the fence, text, marked not-a-spec) of every fenced ```yaml block in a Markdown file."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent = len(match.group("indent"))
        start = i
        previous = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:])
            i += 1
        blocks.append((start + 1, "\n".join(body) + "\n", previous == NOT_A_SPEC))
        i += 1
    return blocks


def _markdown_files() -> list[Path]:
    return sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]


def _spec_snippets() -> list[tuple[str, str]]:
    snippets = []
    for path in _markdown_files():
        for line, text, skipped in yaml_blocks(path):
            if skipped or not re.search(r"^version:", text, re.MULTILINE):
                continue
            snippets.append((f"{path.relative_to(ROOT)}:{line}", text))
    return snippets


SNIPPETS = _spec_snippets()


def test_the_docs_show_full_specs():
    assert len(SNIPPETS) >= 6, [name for name, _ in SNIPPETS]
    assert any(name.startswith("README.md") for name, _ in SNIPPETS), "the README shows one spec"


def test_marked_fragments_are_marked_on_the_line_before_the_fence(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("a\n\n<!-- not-a-spec -->\n```yaml\nversion: 1\n```\n\n```yaml\nversion: 1\nname: x\n```\n")
    assert [(line, skipped) for line, _, skipped in yaml_blocks(page)] == [(4, True), (8, False)]


@pytest.mark.parametrize("name,text", SNIPPETS, ids=[name for name, _ in SNIPPETS])
def test_spec_snippet_is_valid(name, text, tmp_path):
    """Each full spec in the docs passes rasterflow's loader (paths are relative: the file is put in a temp dir;
    ``${VAR}``s without a default get a placeholder value)."""
    import rasterflow

    spec_file = tmp_path / "pipelines" / "spec.yaml"
    spec_file.parent.mkdir()
    spec_file.write_text(text, encoding="utf-8")
    needed = set(re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)\}", text))
    variables = {name: "placeholder" for name in needed}
    loaded = rasterflow.load_spec(spec_file, variables=variables, environ={})
    assert loaded.spec.version == 1


def _schema_key_paths(schema: dict) -> set[str]:
    """Every key path of a JSON Schema: properties, through $ref, anyOf/oneOf branches and mapping values."""
    defs = schema.get("$defs", {})
    paths: set[str] = set()

    def targets(node: dict) -> list[tuple[dict, str]]:
        found = []
        for candidate in [node, *node.get("anyOf", []), *node.get("oneOf", [])]:
            if "$ref" in candidate:
                found.append((defs[candidate["$ref"].rsplit("/", 1)[-1]], ""))
            values = candidate.get("additionalProperties")
            if isinstance(values, dict) and "$ref" in values:
                found.append((defs[values["$ref"].rsplit("/", 1)[-1]], "<name>."))
        return found

    def walk(model: dict, prefix: str) -> None:
        for key, node in model.get("properties", {}).items():
            path = prefix + key
            paths.add(path)
            for target, extra in targets(node):
                walk(target, f"{path}.{extra}")

    walk(schema, "")
    return paths


@pytest.fixture(scope="module")
def spec_reference() -> str:
    return _load_generator().spec_reference_markdown()


def test_every_key_of_the_live_schema_is_in_the_reference(spec_reference):
    from rasterflow.spec.schema import spec_json_schema

    paths = _schema_key_paths(spec_json_schema())
    assert len(paths) > 60
    assert "source.stac.catalog" in paths and "source.overrides.<name>.scale" in paths
    missing = sorted(p for p in paths if f"`{p}`" not in spec_reference)
    assert not missing, f"keys of the schema missing from the generated reference: {missing}"


def test_every_key_of_the_committed_schema_is_in_the_reference(spec_reference):
    committed = json.loads((ROOT / "schemas" / "rasterflow.schema.json").read_text())
    missing = sorted(p for p in _schema_key_paths(committed) if f"`{p}`" not in spec_reference)
    assert not missing, f"keys of schemas/rasterflow.schema.json missing from the generated reference: {missing}"


def test_the_reference_finds_keys_the_models_add():
    """The reference is generated: a key added to the schema appears without any docs change."""
    from rasterflow.spec.schema import spec_json_schema

    schema = spec_json_schema()
    source = schema["$defs"]["Source"]
    source["properties"]["docs_probe"] = {"$ref": "#/$defs/DocsProbe", "description": "A key only this test has."}
    schema["$defs"]["DocsProbe"] = {"properties": {"depth": {"type": "integer", "default": 3,
                                                             "description": "Nested."}}, "type": "object"}
    text = _load_generator().spec_reference_markdown(schema)
    assert "`source.docs_probe`" in text and "`source.docs_probe.depth`" in text and "`3`" in text


def test_generated_cli_reference_has_every_command():
    from rasterflow.cli import cli

    text = _load_generator().cli_reference_markdown()
    for name in cli.commands:
        assert f"## `rasterflow {name}`" in text
    assert "python -m rasterflow.sample" in text


def test_generated_exit_codes_and_report_fields():
    import dataclasses

    from rasterflow.errors import ExitCode
    from rasterflow.report import RunReport

    generator = _load_generator()
    codes = generator.exit_codes_markdown()
    for code in ExitCode:
        assert f"| {int(code)} | `{code.name}`" in codes
    report = generator.run_report_markdown()
    for field in dataclasses.fields(RunReport):
        assert f"| `{field.name}` |" in report


def test_every_page_is_in_the_nav():
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(node) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [p for item in node for p in pages(item)]
        if isinstance(node, dict):
            return [p for value in node.values() for p in pages(value)]
        return []

    in_nav = set(pages(config["nav"]))
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    generated = set(_load_generator().PAGES) | {"changelog.md"}
    assert on_disk | generated == in_nav


@pytest.mark.slow
def test_the_site_builds_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip('the docs extra is not installed (pip install -e ".[docs]"): mkdocs build --strict not run')
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**_env(), "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert (site / "reference" / "spec" / "index.html").is_file()
    assert "source.stac.catalog" in (site / "reference" / "spec" / "index.html").read_text()
    assert 'id="rasterflow.api.run"' in (site / "reference" / "python-api" / "index.html").read_text()


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)
