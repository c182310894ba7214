"""Load a spec file: YAML with positions -> validated :class:`Spec`, or every problem at once with file:line:col."""

from __future__ import annotations

import difflib
import hashlib
import os
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel, ValidationError

from rasterflow.errors import ExpressionError, SpecError, SpecIssue
from rasterflow.spec import models
from rasterflow.spec.yamlpos import MAX_SPEC_BYTES, LoadedYaml, Loc, YamlProblem, load_yaml_with_positions

__all__ = ["LoadedSpec", "load_spec", "load_spec_text"]

_SECTION_MODELS: dict[Loc, type[BaseModel]] = {
    (): models.Spec,
    ("source",): models.Source,
    ("source", "stac"): models.StacSource,
    ("grid",): models.Grid,
    ("chunks",): models.Chunks,
    ("reduce",): models.Reduce,
    ("output",): models.Output,
    ("output", "encoding"): models.OutputEncoding,
    ("output", "cog"): models.CogOptions,
    ("output", "tiling"): models.Tiling,
    ("source", "retry"): models.SourceRetry,
    ("cluster",): models.Cluster,
    ("cluster", "memory"): models.MemoryThresholds,
    ("budget",): models.Budget,
}

# Fields whose type is a union: pydantic reports one error per branch; say once what the field accepts instead.
_UNION_HINTS = {
    "q": "must be a number in 0..1 or a list of them",
    "memory_limit": "must be 'auto' or a size like '4GB'",
    "gdal_cachemax": "must be auto or a size like '256MB'",
    "n_workers": "must be 'auto' or a positive integer",
    "filter": "must be a CQL2 filter: a mapping (cql2-json) or a string (cql2-text)",
    "max_items": "must be a positive integer",
    "address": "must be a scheduler address like tcp://host:8786, or null",
    "bounds": "must be [minx, miny, maxx, maxy] in grid.crs, or null",
    "reduce": "must be a mapping with method (and optionally over, q, period), a list of at least 1 of them (several statistics from one read), or null",
    "query": 'must map properties to conditions, e.g. {"eo:cloud_cover": {lt: 40}}',
    "description": "must be a string",
    "mask": "must be an expression string",
    "period": "must be one of 'month', 'season', 'year', or null",
    "format": "must be 'zarr' or 'cog' (or omitted: taken from the path's extension)",
}

_TYPE_WORDS = {
    "int_type": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "bool_type": "true or false",
    "dict_type": "a mapping",
    "list_type": "a list",
    "model_type": "a mapping",
}


@dataclass(frozen=True)
class LoadedSpec:
    """A validated spec together with where it came from.

    Attributes
    ----------
    path : Path
        The spec file as given.
    spec : Spec
        The validated model.
    sha256 : str
        Hash of the file's bytes and of the values its ``${VAR}`` references got (the spec *after* variables), for
        the run report and the output's fingerprint.
    positions : LoadedYaml
        Key positions, so later stages (the budget check) can point at a line.
    variables : dict
        Each variable the spec used and its value.
    """

    path: Path
    spec: models.Spec
    sha256: str
    positions: LoadedYaml
    variables: dict[str, str] = field(default_factory=dict)

    @property
    def base_dir(self) -> Path:
        """Directory that relative paths in the spec are relative to."""
        return self.path.parent

    def resolve(self, path_or_url: str) -> str:
        """An absolute local path for a relative one; URLs (``scheme://``) and absolute paths pass through."""
        if "://" in path_or_url or os.path.isabs(path_or_url):
            return path_or_url
        return str((self.base_dir / path_or_url).resolve())

    def where(self, *loc: str | int) -> str:
        """``file:line:col`` of a field (or of its nearest parent when the key is absent)."""
        position = self.positions.position_of(tuple(loc))
        if position is None:
            return str(self.path)
        return f"{self.path}:{position.line}:{position.column}"


def load_spec(path: str | os.PathLike[str], *, variables: Mapping[str, str] | None = None,
              environ: Mapping[str, str] | None = None) -> LoadedSpec:
    """Read and validate a spec file.

    ``${VAR}`` / ``${VAR:-default}`` references are replaced from ``variables`` (``--var KEY=VALUE``), then from
    ``environ`` (default: the process environment).

    Raises
    ------
    SpecError
        Listing every problem found, each as ``file:line:col: field: message``.
    """
    path = Path(path)
    shown = str(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise SpecError(SpecIssue(shown, None, None, "", "no such file")) from None
    except OSError as err:
        raise SpecError(SpecIssue(shown, None, None, "", f"cannot read the file: {err.strerror}")) from None
    if path.is_dir():
        raise SpecError(SpecIssue(shown, None, None, "", "is a directory; give a spec .yaml file"))
    if size > MAX_SPEC_BYTES:
        raise SpecError(
            SpecIssue(shown, None, None, "", f"the file is {size / 1e6:.1f} MB; a spec is a few kB, refusing to parse it")
        )
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpecError(SpecIssue(shown, None, None, "", f"not UTF-8 text (byte {err.start}); save the spec as UTF-8")) from None
    return load_spec_text(text, path=path, sha256=hashlib.sha256(raw).hexdigest(), variables=variables,
                          environ=environ)


def load_spec_text(text: str, *, path: str | os.PathLike[str] = "<spec>", sha256: str | None = None,
                   variables: Mapping[str, str] | None = None,
                   environ: Mapping[str, str] | None = None) -> LoadedSpec:
    """Validate spec text; ``path`` is used in messages and to resolve relative paths; variables as in
    :func:`load_spec`."""
    path = Path(path)
    shown = str(path)
    sha256 = sha256 or hashlib.sha256(text.encode()).hexdigest()
    lookup = {**(os.environ if environ is None else environ), **(variables or {})}
    try:
        loaded = load_yaml_with_positions(text, lookup)
    except YamlProblem as problem:
        line = problem.position.line if problem.position else None
        column = problem.position.column if problem.position else None
        raise SpecError(SpecIssue(shown, line, column, problem.field, problem.message)) from None
    if loaded.data is None:
        raise SpecError(SpecIssue(shown, None, None, "", "the file is empty; a spec starts with 'version: 1'"))
    if not isinstance(loaded.data, dict):
        kind = "a list" if isinstance(loaded.data, list) else f"a single {type(loaded.data).__name__} value"
        raise SpecError(
            SpecIssue(shown, 1, 1, "", f"the top level must be a mapping of sections (version, name, source, ...), not {kind}")
        )
    try:
        spec = models.Spec.model_validate(loaded.data)
    except ValidationError as err:
        issues = _issues_from_validation(err, loaded, shown)
        if not any(issue.field.startswith(("bands", "mask")) for issue in issues):
            issues += _expression_issues(loaded, shown)
        issues.sort(key=lambda i: (i.line or 0, i.column or 0))
        raise SpecError(issues) from None
    _check_output_placeholders(spec, loaded, shown)
    spec = _read_intersects(spec, loaded, shown, path.parent)
    from rasterflow.spec.gridcheck import grid_problems

    grid_issues = [_issue(shown, loaded, loc, message) for loc, message in grid_problems(spec)]
    if grid_issues:
        raise SpecError(grid_issues)
    if spec.output.if_exists == "update" and not (spec.output.resolved_format == "cog" and spec.reduce_period):
        raise SpecError(_issue(shown, loaded, ("output", "if_exists"),
                               "update recomputes single periods, so it needs a COG output (one file per period) and "
                               "reduce.period; use skip to recompute the whole output when its inputs changed"))
    if loaded.variables_used:  # the same file with other values is another spec: another fingerprint
        sha256 = hashlib.sha256((sha256 + json.dumps(loaded.variables_used, sort_keys=True)).encode()).hexdigest()
    return LoadedSpec(path=path, spec=spec, sha256=sha256, positions=loaded, variables=dict(loaded.variables_used))


def _read_intersects(spec: models.Spec, loaded: LoadedYaml, shown: str, base_dir: Path) -> models.Spec:
    """``source.stac.intersects`` given as a GeoJSON file's path: read and checked now, so everything after
    holds the geometry (and ``validate`` finds a missing or broken file)."""
    stac = spec.source.stac
    if not isinstance(stac.intersects, str):
        return spec
    from rasterflow.aoi import parse_geometry

    where = ("source", "stac", "intersects")
    file = Path(stac.intersects) if os.path.isabs(stac.intersects) else base_dir / stac.intersects
    try:
        geometry = parse_geometry(file.read_text(encoding="utf-8"))
    except OSError as err:
        raise SpecError(_issue(shown, loaded, where, f"cannot read the GeoJSON file {file}: "
                                                     f"{err.strerror or err}; the path is relative to the spec's "
                                                     f"folder")) from None
    except ValueError as err:
        raise SpecError(_issue(shown, loaded, where, f"{file}: {err}")) from None
    new_stac = stac.model_copy(update={"intersects": geometry})
    return spec.model_copy(update={"source": spec.source.model_copy(update={"stac": new_stac})})


def _check_output_placeholders(spec: models.Spec, loaded: LoadedYaml, shown: str) -> None:
    """``{start}`` / ``{end}`` in output.path: checked now (validate), with any dates, not first at run time."""
    import datetime as dt

    from rasterflow.outputs import render_output_path, window_of

    path = spec.output.path
    if "{" not in path and "}" not in path:
        return
    start, end = window_of(spec.source.stac.datetime, dt.datetime.now(dt.timezone.utc))  # validated: parses
    try:
        render_output_path(path, start, end)
    except SpecError as err:
        message = err.issues[0].message
        raise SpecError(_issue(shown, loaded, ("output", "path"), message)) from None


def _issue(shown: str, loaded: LoadedYaml, loc: Loc, message: str, *, value_position: bool = False) -> SpecIssue:
    position = (loaded.value_positions.get(loc) if value_position else None) or loaded.position_of(loc)
    field = ".".join(str(part) for part in loc)
    return SpecIssue(shown, position.line if position else None, position.column if position else None, field, message)


def _issues_from_validation(err: ValidationError, loaded: LoadedYaml, shown: str) -> list[SpecIssue]:
    grouped: dict[Loc, list[Any]] = {}
    for error in _matching_branch(err.errors(include_url=False)):
        loc = tuple(error["loc"])
        located = error.get("ctx", {}).get("error")
        if isinstance(located, models.LocatedError):
            loc = _trim_to_data(loc, loaded) + located.loc
        elif error["type"] != "missing":
            loc = _trim_to_data(loc, loaded)
        grouped.setdefault(loc, []).append(error)
    return [_issue(shown, loaded, loc, _message(loc, errors, loaded)) for loc, errors in grouped.items()]


_WRONG_SHAPE = ("list_type", "model_type", "dict_type", "model_attributes_type")


def _matching_branch(errors: list[Any]) -> list[Any]:
    """For a field that takes a mapping or a list of them (``reduce``): drop the union branch whose shape the value
    does not have, so the message is about what is wrong inside the value given."""

    def wrong_shape(error: Any) -> bool:
        return error["type"] in _WRONG_SHAPE and len(error["loc"]) >= 2 and isinstance(error["loc"][-1], str) and (
            "[" in error["loc"][-1] or error["loc"][-1][:1].isupper())

    return [e for e in errors if not (wrong_shape(e) and any(
        o is not e and o["loc"][:1] == e["loc"][:1] and not wrong_shape(o) for o in errors))]


def _trim_to_data(loc: Loc, loaded: LoadedYaml) -> Loc:
    """Drop pydantic's union-branch parts (``"literal['auto']"``, ``"int"``,
    ``"function-after[_check_q(), Reduce]"``) so loc names a field of the file."""
    loc = tuple(part for part in loc if not (isinstance(part, str) and "[" in part))
    for end in range(len(loc), 0, -1):
        if loc[:end] in loaded.value_positions:
            return loc[:end]
    return loc


def _message(loc: Loc, errors: list[dict[str, Any]], loaded: LoadedYaml) -> str:
    first = errors[0]
    kind = first["type"]
    got = _got(first.get("input"))
    if kind == "missing":
        section = loc[:-1]
        if section == ():
            return f"required section '{loc[-1]}' is missing"
        return f"required key '{loc[-1]}' is missing"
    if kind == "extra_forbidden":
        return _unknown_key_message(loc)
    value_errors = [e for e in errors if e["type"] in ("value_error", "assertion_error")]
    if value_errors:
        return "; ".join(dict.fromkeys(_strip_value_error(e["msg"]) for e in value_errors))
    field = str(loc[-1]) if loc else ""
    if len(errors) > 1 or (field in _UNION_HINTS and kind not in ("too_short", "too_long")):
        if field in _UNION_HINTS:
            return f"{_UNION_HINTS[field]}{got}"
    if kind in _TYPE_WORDS:
        return f"must be {_TYPE_WORDS[kind]}{got}{_yaml_number_hint(kind, first.get('input'))}"
    if kind == "literal_error":
        expected = first.get("ctx", {}).get("expected", "")
        suggestion = _closest(first.get("input"), [e.strip(" '") for e in expected.replace(" or ", ",").split(",")])
        return f"must be one of {expected}{got}{suggestion}"
    if kind == "string_pattern_mismatch" and field == "name":
        return f"must use only lowercase letters, digits, '-' and '_'{got}"
    if kind in ("too_short", "too_long") and isinstance(first.get("input"), (list, dict)):
        length = len(first["input"])
        bounds = first.get("ctx", {})
        wanted = bounds.get("min_length") if kind == "too_short" else bounds.get("max_length")
        if field in ("bbox", "bounds"):
            return f"needs exactly 4 numbers (got {length})"
        return f"needs at least {wanted} entries (got {length})" if kind == "too_short" else f"allows at most {wanted} entries (got {length})"
    return f"{first['msg'][0].lower()}{first['msg'][1:]}{got}"


def _yaml_number_hint(kind: str, value: Any) -> str:
    """YAML 1.1 reads ``1e300`` (no dot, no exponent sign) as text: say how to write the number."""
    if kind not in ("float_type", "int_type") or not isinstance(value, str):
        return ""
    try:
        number = float(value)
    except ValueError:
        return ""
    return f"; YAML reads {value} as text: write it as {number:.1e}".replace("e+0", "e+").replace("e-0", "e-") \
        + " (a dot and a signed exponent) or without the exponent"


def _strip_value_error(message: str) -> str:
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            return message[len(prefix):]
    return message


def _got(value: Any) -> str:
    if isinstance(value, (dict, list)) or value is None:
        return ""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f" (got {text})"


def _closest(word: Any, choices: list[str]) -> str:
    if not isinstance(word, str):
        return ""
    match = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else ""


def _unknown_key_message(loc: Loc) -> str:
    key = str(loc[-1])
    model = _SECTION_MODELS.get(loc[:-1])
    if model is None:
        return f"unknown key {key!r}"
    allowed = list(model.model_fields)
    where = f"in {'.'.join(map(str, loc[:-1]))}" if loc[:-1] else "at the top level"
    return f"unknown key {key!r}{_closest(key, allowed)} (allowed {where}: {', '.join(allowed)})"


def _expression_issues(loaded: LoadedYaml, shown: str) -> list[SpecIssue]:
    """Check mask and band expressions even when other sections failed, so all problems show at once."""
    from rasterflow.expr import parse_expression

    data = loaded.data
    source = data.get("source")
    assets = source.get("assets") if isinstance(source, dict) else None
    if not isinstance(assets, dict) or not all(isinstance(k, str) for k in assets):
        return []
    issues = []
    known = list(assets)
    mask = data.get("mask")
    if isinstance(mask, str):
        try:
            parse_expression(mask, known, what="mask")
        except ExpressionError as err:
            issues.append(_issue(shown, loaded, ("mask",), str(err)))
    bands = data.get("bands")
    if isinstance(bands, dict):
        for name, text in bands.items():
            if not isinstance(text, str):
                continue
            try:
                parse_expression(text, known, what=f"band {name!r}")
            except ExpressionError as err:
                issues.append(_issue(shown, loaded, ("bands", name), str(err)))
            known.append(name)
    return issues
