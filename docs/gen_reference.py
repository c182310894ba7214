"""Generated reference pages of the documentation site, so that they cannot drift from the code.

Used two ways:

* as an MkDocs hook (``hooks:`` in ``mkdocs.yml``): :func:`on_files` adds the pages below to the build, made from
  the code at build time (nothing is written into ``docs/``);
* from Python (``tests/test_docs.py``): the ``*_markdown`` functions return the same text.

Pages:

``reference/spec.md``
    Every key of the spec, from the JSON Schema that the pydantic models produce
    (:func:`rasterflow.spec.schema.spec_json_schema`, the same document ``rasterflow schema`` prints and
    ``schemas/rasterflow.schema.json`` holds): key path, type, default and the model's description.
``reference/cli.md``
    Every command of the ``rasterflow`` click group (``rasterflow.cli:cli``, installed as ``rasterflow``) with its
    ``--help`` text, plus ``python -m rasterflow.sample --help``.
``reference/run-report.md``
    The fields of the run report (:class:`rasterflow.report.RunReport`), with the docstring under each field.
``reference/exit-codes.md``
    :class:`rasterflow.errors.ExitCode` and the statuses of the run report.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import textwrap
from contextlib import redirect_stdout
from typing import Any

GENERATED_PAGES = ("reference/spec.md", "reference/cli.md", "reference/run-report.md", "reference/exit-codes.md")

_NOTE = ("<!-- Generated at build time by docs/gen_reference.py from the code; there is no file to edit. -->\n\n")


# ---- the spec ------------------------------------------------------------------------------------------------


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _branches(node: dict) -> list[dict]:
    return list(node.get("anyOf") or node.get("oneOf") or [])


def _model_ref(node: dict) -> str | None:
    """The ``$defs`` name a property refers to (directly or as one branch of a union), if any."""
    if "$ref" in node:
        return _ref_name(node["$ref"])
    for branch in _branches(node):
        if "$ref" in branch:
            return _ref_name(branch["$ref"])
    return None


def _map_ref(node: dict) -> str | None:
    """The ``$defs`` name of a mapping's values (``source.overrides.<name>``), if any."""
    for candidate in [node, *_branches(node)]:
        values = candidate.get("additionalProperties")
        if isinstance(values, dict) and "$ref" in values:
            return _ref_name(values["$ref"])
    return None


def _type_text(node: dict, defs: dict) -> str:
    """A short human reading of a JSON Schema node: ``integer ≥ 1``, ``"auto" | integer``, ``list of string``..."""
    if "const" in node:
        return json.dumps(node["const"])
    if "enum" in node:
        return " | ".join(json.dumps(v) for v in node["enum"])
    if "$ref" in node:
        target = defs.get(_ref_name(node["$ref"]), {})
        if "enum" in target:
            return _type_text(target, defs)
        return "mapping"
    branches = _branches(node)
    if branches:
        seen: list[str] = []
        for branch in branches:
            text = _type_text(branch, defs)
            if text not in seen:
                seen.append(text)
        if "number" in seen and "integer" in seen:  # pydantic's float | int: any number
            seen.remove("integer")
        return " | ".join(seen)
    kind = node.get("type")
    if isinstance(kind, list):
        return " | ".join(kind)
    if kind == "integer" and not any(k in node for k in ("minimum", "maximum", "exclusiveMinimum")):
        return "integer"
    if kind == "array":
        items = node.get("items")
        if isinstance(items, dict) and items:
            text = f"list of {_type_text(items, defs)}"
        elif "prefixItems" in node:
            text = "list of " + ", ".join(_type_text(i, defs) for i in node["prefixItems"])
        else:
            text = "list"
        lo, hi = node.get("minItems"), node.get("maxItems")
        if lo is not None and lo == hi:
            text += f" ({lo} items)"
        elif lo:
            text += f" (at least {lo})"
        return text
    if kind == "object":
        values = node.get("additionalProperties")
        if isinstance(values, dict) and values:
            return f"mapping of name → {_type_text(values, defs)}"
        return "mapping"
    if kind in ("integer", "number"):
        bounds = []
        for key, sign in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<")):
            if key in node:
                bounds.append(f"{sign} {node[key]}")
        return " ".join([kind, *bounds])
    if kind == "string":
        if "pattern" in node:
            return f"string matching `{node['pattern']}`"
        return "string"
    if kind == "null":
        return "null"
    if kind == "boolean":
        return "boolean"
    return kind or "any"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def spec_key_paths(schema: dict | None = None) -> list[str]:
    """Every key path of the spec, depth first in the models' order: ``version``, ``source``, ``source.stac``,
    ``source.stac.catalog``, ..., ``source.overrides.<name>.scale``, ..."""
    return [row[0] for row in _spec_rows(schema)]


def _spec_rows(schema: dict | None = None) -> list[tuple[str, dict, bool, str | None]]:
    """(path, property node, required, model name or None) for every key."""
    if schema is None:
        from rasterflow.spec.schema import spec_json_schema

        schema = spec_json_schema()
    defs = schema.get("$defs", {})
    rows: list[tuple[str, dict, bool, str | None]] = []

    def walk(model: dict, prefix: str, depth: int) -> None:
        if depth > 8:  # a recursive model would loop; the spec has none
            return
        required = set(model.get("required", []))
        for key, node in model.get("properties", {}).items():
            path = f"{prefix}{key}"
            ref = _model_ref(node)
            sub = ref if ref and "properties" in defs.get(ref, {}) else None
            rows.append((path, node, key in required, sub))
            if sub:
                walk(defs[sub], path + ".", depth + 1)
            values = _map_ref(node)
            if values and "properties" in defs.get(values, {}):
                walk(defs[values], path + ".<name>.", depth + 1)

    walk(schema, "", 0)
    return rows


def spec_reference_markdown(schema: dict | None = None) -> str:
    """The spec reference page: a section per top-level key, a table row per key below it."""
    if schema is None:
        from rasterflow.spec.schema import spec_json_schema

        schema = spec_json_schema()
    defs = schema.get("$defs", {})
    out = [
        "# Spec keys\n",
        _NOTE,
        "Every key a spec may have, generated from the pydantic models "
        "(`rasterflow.spec.models`) through their JSON Schema, the same document `rasterflow schema` prints and "
        "`schemas/rasterflow.schema.json` holds. Unknown keys are an error, with a did-you-mean.\n",
        "Point your editor at the schema for completion and checks while you type (the YAML language server, "
        "used by VS Code's YAML extension and others, reads this first-line comment):\n",
        "```yaml\n# yaml-language-server: $schema=../schemas/rasterflow.schema.json\n```\n",
        "Types: *mapping* is a YAML mapping (`{a: 1}` or indented keys), *list* a YAML sequence. "
        "A default of — means the key has none (required, or null/unset means \"not used\"). "
        "String values may hold `${VAR}` or `${VAR:-default}` (see [Variables](../how-to/cron.md#variables)).\n",
    ]
    rows = _spec_rows(schema)
    top_order = [path for path, *_ in rows if "." not in path]
    out.append("## Top-level keys\n")
    out.append("| key | type | required | default | description |\n|---|---|---|---|---|")
    for path, node, required, sub in rows:
        if "." in path:
            continue
        out.append(_row(path, node, required, defs, sub))
    out.append("")
    for top in top_order:
        section = [r for r in rows if r[0].startswith(top + ".")]
        if not section:
            continue
        model = next(r for r in rows if r[0] == top)
        title_node = model[1]
        out.append(f"## `{top}`\n")
        sub = model[3]
        description = title_node.get("description") or defs.get(sub or "", {}).get("description") or ""
        if description:
            out.append(_cell(description) + "\n")
        out.append("| key | type | required | default | description |\n|---|---|---|---|---|")
        for path, node, required, sub in section:
            out.append(_row(path, node, required, defs, sub))
        out.append("")
    return "\n".join(out) + "\n"


def _row(path: str, node: dict, required: bool, defs: dict, sub: str | None) -> str:
    kind = "mapping (below)" if sub else _type_text(node, defs)
    if sub and any(b.get("type") == "null" for b in _branches(node)):
        kind += " | null"
    if "default" in node:
        default = f"`{json.dumps(node['default'])}`"
    elif sub and not required:
        default = "its keys' defaults"
    else:
        default = "—"
    description = node.get("description") or defs.get(sub or "", {}).get("description") or ""
    return (f"| `{path}` | {_cell(kind)} | {'yes' if required else ''} | {_cell(default)} | "
            f"{_cell(description)} |")


# ---- the command line -------------------------------------------------------------------------------------------


def cli_reference_markdown() -> str:
    """Every command's ``--help``, from the click group itself."""
    import click

    from rasterflow.cli import cli

    out = [
        "# Command line\n",
        _NOTE,
        "The `rasterflow` command (installed by `pip install`; the click group `rasterflow.cli:cli`). "
        "The help of each command below is its `--help`, generated from the code at build time. "
        "Global options (`--debug`, `-v`, `-q`, `--log-format`) work before or after the subcommand. "
        "`SPECS...` may be files, folders (their `*.yaml`/`*.yml`) and globs (`'pipelines/**/*.yaml'`). "
        "Exit codes: [Exit codes](exit-codes.md).\n",
    ]
    settings = {**cli.context_settings, "terminal_width": 100, "max_content_width": 100}
    with click.Context(cli, info_name="rasterflow", **settings) as ctx:
        out.append("## `rasterflow`\n")
        out.append("```text\n" + cli.get_help(ctx).rstrip() + "\n```\n")
        for name in cli.list_commands(ctx):
            command = cli.get_command(ctx, name)
            if command is None or getattr(command, "hidden", False):
                continue
            with click.Context(command, info_name=name, parent=ctx) as sub:
                out.append(f"## `rasterflow {name}`\n")
                out.append("```text\n" + command.get_help(sub).rstrip() + "\n```\n")
    out.append("## `python -m rasterflow.sample`\n")
    out.append("Generates the synthetic Sentinel-2 L2A-like scenes and STAC items that the demo, the tests and the "
               "benchmarks use (COGs and an `items.json` ItemCollection in `DIRECTORY`; deterministic from `--seed`). "
               "`rasterflow demo` calls it for you.\n")
    out.append("```text\n" + _sample_help().rstrip() + "\n```\n")
    return "\n".join(out) + "\n"


def _sample_help() -> str:
    from rasterflow import sample

    buffer = io.StringIO()
    with redirect_stdout(buffer):
        try:
            sample.main(["--help"])
        except SystemExit:
            pass
    return buffer.getvalue()


# ---- the run report and exit codes -----------------------------------------------------------------------------------


def _field_docs(cls: type) -> dict[str, str]:
    """The string literal under each annotated field of a class (attribute docstrings), by field name."""
    source = textwrap.dedent(inspect.getsource(cls))
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for here, after in zip(body, body[1:]):
        if (isinstance(here, ast.AnnAssign) and isinstance(here.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[here.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _rst_to_md(text: str) -> str:
    return text.replace("``", "`").replace(":data:", "").replace(":class:", "").replace(":func:", "")


# What the fields without a docstring of their own hold (the field list itself comes from the code).
_REPORT_FIELDS = {
    "rasterflow_version": "The rasterflow that ran.",
    "spec_path": "The spec file as given.",
    "spec_sha256": "Hash of the spec file and of the values its `${VAR}`s got (the spec after variables).",
    "finished_at": "ISO 8601, UTC; null while running.",
    "exit_code": "The process exit code of this spec (see [Exit codes](exit-codes.md)).",
    "error": "The error message, when the run did not succeed.",
    "library_versions": "python, numpy, dask, distributed, xarray, rasterio, gdal, stackstac, pystac_client, zarr; "
                        "`compiled_kernels` (`rasterflow._native`, or null: the NumPy paths ran) and "
                        "`tile_decoder` (tifffile + imagecodecs, or null: GDAL decoded every read).",
    "catalog": "The catalog searched (URL or items file).",
    "item_ids": "The ids of the items used.",
    "chunks": "The chunk sizes used (time, y, x).",
    "task_count": "Tasks in the job.",
    "spilled_bytes": "Bytes the workers spilled to disk (should be 0).",
    "stage_seconds": "Wall time per stage, seconds: `search`, `plan`, `cluster start`, `graph`, `compute+write`, `stac`.",
}


def run_report_markdown() -> str:
    from rasterflow.report import RunReport

    docs = {**_REPORT_FIELDS, **_field_docs(RunReport)}
    out = [
        "# The run report\n",
        _NOTE,
        "Every run that got as far as knowing its output writes one JSON report, atomically: "
        "`<output>.report.json` next to the output (or `--report PATH`), or in `.rasterflow/reports/` when the run "
        "does not own the output (refused, up to date, locked out, failed before writing anything, or failed beside a "
        "good output), so an existing "
        "output's report is never replaced by a refusal. The fields below are those of "
        "`rasterflow.report.RunReport`, generated from the code; unknown keys from a newer rasterflow are ignored "
        "when a report is read back.\n",
        "| field | type | what |\n|---|---|---|",
    ]
    for f in dataclasses.fields(RunReport):
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        out.append(f"| `{f.name}` | `{_cell(kind)}` | {_cell(_rst_to_md(docs.get(f.name, '')))} |")
    out.append("")
    out.append("`status` follows the exit code (see [Exit codes](exit-codes.md)); "
               "`interrupted` for 128 + a signal number.\n")
    return "\n".join(out) + "\n"


def exit_codes_markdown() -> str:
    from rasterflow.errors import ExitCode
    from rasterflow.report import STATUS_BY_EXIT_CODE

    meaning = {
        0: "ok, or up to date (`if_exists: skip` and the fingerprint matches: nothing rewritten)",
        1: "the run failed (a read, the computation, the write; no items found)",
        2: "invalid spec, or the output exists and `if_exists` does not allow replacing it "
           "(or it is not a rasterflow output)",
        3: "over the memory budget",
        64: "usage error: unknown option, missing argument, bad `--var`, nothing selected, no results file to retry",
        75: "the output is locked by another run (the message names its host, pid and start time); nothing was "
            "touched, try later",
    }
    out = [
        "# Exit codes\n",
        _NOTE,
        "With several specs the exit code is the highest of theirs. The codes are "
        "`rasterflow.errors.ExitCode` (each `RasterflowError` subclass carries its `exit_code`); the "
        "run report's and the results file's `status` is derived from them.\n",
        "| code | name | status | meaning |\n|---|---|---|---|",
    ]
    for code in ExitCode:
        out.append(f"| {int(code)} | `{code.name}` | `{STATUS_BY_EXIT_CODE.get(int(code), '')}` | "
                   f"{meaning.get(int(code), _cell((code.__doc__ or '').strip()))} |")
    out += [
        "| 129 | | `interrupted` | stopped by SIGHUP (the terminal closed) |",
        "| 130 | | `interrupted` | stopped by SIGINT (Ctrl-C) |",
        "| 143 | | `interrupted` | stopped by SIGTERM (`timeout`, systemd, Kubernetes) |",
        "| 141 | | | stdout was closed by its reader (`rasterflow plan spec.yaml \\| head -3`); ends quietly |",
        "",
        "A stopped run exits 128 + the signal number, as shells report it. `up_to_date` (exit 0) is the status of "
        "a run that found its output up to date.\n",
    ]
    return "\n".join(out) + "\n"


PAGES = {
    "reference/spec.md": spec_reference_markdown,
    "reference/cli.md": cli_reference_markdown,
    "reference/run-report.md": run_report_markdown,
    "reference/exit-codes.md": exit_codes_markdown,
}


# ---- the MkDocs hook ---------------------------------------------------------------------------------------------


def on_files(files: Any, config: Any, **kwargs: Any) -> Any:
    """Add the generated pages to the build (MkDocs >= 1.6: ``File.generated``)."""
    from pathlib import Path

    from mkdocs.structure.files import File

    pages = dict(PAGES)
    changelog = Path(config.config_file_path).parent / "CHANGELOG.md"
    pages["changelog.md"] = lambda: changelog.read_text(encoding="utf-8")  # the repository's CHANGELOG, as a page
    for uri, make in pages.items():
        existing = files.get_file_from_path(uri)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, uri, content=make()))
    return files
