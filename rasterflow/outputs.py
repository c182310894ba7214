"""What a run may do with its output path: the ``if_exists`` policy, dated paths, and what counts as *ours*.

A rasterflow output is recognised by its fingerprint: a Zarr store carries ``rasterflow_fingerprint`` in its group
attributes, a COG is listed (with the fingerprint) in the run report beside it. Only such an output is ever replaced;
an input's href, a symlink, or anything else at the path is refused. Stdlib only (Zarr attributes are read through
:mod:`rasterflow.write.common`, which imports zarr only when a store is there).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from rasterflow.errors import OutputExistsError, OutputNotOursError, SpecError, SpecIssue

__all__ = [
    "POLICIES", "Existing", "render_output_path", "window_of", "inspect_existing", "decide",
    "leftover_temp_files", "report_may_replace", "foreign_reason",
]

POLICIES = ("error", "skip", "overwrite", "update")
"""``output.if_exists``: error = refuse (default); skip = leave it when up to date, recompute when not; update = as
skip, recomputing only the periods whose items changed; overwrite = always recompute and replace (only a rasterflow
output)."""

_DATE_FIELDS = ("start", "end")
_DEFAULT_DATE_FORMAT = "%Y-%m-%d"


def window_of(datetime_text: str, now: dt.datetime) -> tuple[dt.datetime | None, dt.datetime | None]:
    """The search window's UTC ``(start, end)``, a relative one ending at ``now``."""
    from rasterflow.spec.timeparse import parse_datetime_window

    return parse_datetime_window(datetime_text).resolve(now)


def render_output_path(template: str, start: dt.datetime | None, end: dt.datetime | None, *, where: str = "") -> str:
    """``output.path`` with ``{start}`` / ``{end}`` (optionally ``{start:%Y-%m}``) replaced by the window's dates.

    Only these two names are allowed, with no attribute or index access (``str.format`` could otherwise reach into
    objects); ``{{`` and ``}}`` are literal braces. A bare ``{start}`` is written ``YYYY-MM-DD``.

    Raises
    ------
    SpecError
        An unknown name, a bad format, or a date asked of an open-ended window.
    """
    if "{" not in template and "}" not in template:
        return template
    values = {"start": start, "end": end}
    out: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise _path_error(where, f"{exc} in {template!r}; use {{start:%Y-%m-%d}} or {{end}} (and {{{{ }}}} for "
                                 f"literal braces)") from None
    for literal, name, spec, conversion in parsed:
        out.append(literal)
        if name is None:
            continue
        if name not in _DATE_FIELDS or conversion:
            raise _path_error(where, f"unknown placeholder {{{name}}} in {template!r}; only {{start}} and {{end}} "
                                     f"(the search window's dates, e.g. {{start:%Y-%m-%d}}) are allowed")
        value = values[name]
        if value is None:
            raise _path_error(where, f"{{{name}}} is used but the search window has no {name} "
                                     f"(source.stac.datetime is open-ended)")
        out.append(value.strftime(spec or _DEFAULT_DATE_FORMAT))
    return "".join(out)


def _path_error(where: str, message: str) -> SpecError:
    path, _, rest = where.partition(":")
    line, _, column = rest.partition(":")
    return SpecError(SpecIssue(path or "<spec>", int(line) if line.isdigit() else None,
                               int(column) if column.isdigit() else None, "output.path", message))


# --------------------------------------------------------------------------------------------------------------------
# what is at the output path


@dataclass(frozen=True)
class Existing:
    """What is at an output's path(s) before the run writes.

    Attributes
    ----------
    paths : tuple of str
        The expected output paths that exist now.
    ours : bool
        Every existing path is a rasterflow output (fingerprint found).
    fingerprint : str or None
        The fingerprint recorded for them (None when not ours or not recorded).
    complete : bool
        Every expected path exists and is complete (a finished Zarr store; every COG file the report lists).
    why_not_ours : str
        When not ours: why (a symlink, an input file, no fingerprint).
    """

    paths: tuple[str, ...]
    ours: bool
    fingerprint: str | None
    complete: bool
    why_not_ours: str = ""

    @property
    def empty(self) -> bool:
        return not self.paths


def report_of(output_path: str) -> dict[str, Any]:
    from rasterflow.report import default_report_path

    from rasterflow.write.common import filesystem, is_remote

    path = default_report_path(output_path)
    try:
        if is_remote(path):  # uploaded beside a remote output when its run committed it
            fs, inner = filesystem(path)
            data = json.loads(fs.cat_file(inner).decode("utf-8"))
        else:
            data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def inspect_existing(output_path: str, fmt: str, expected: Sequence[str], input_hrefs: Iterable[str] = ()) -> Existing:
    """Look at the output path(s) without touching them."""
    from rasterflow.write.common import exists, read_zarr_state

    existing = tuple(p for p in expected if exists(p))
    if not existing:
        return Existing((), True, None, False)
    reason = foreign_reason(existing, input_hrefs)
    if reason:
        return Existing(existing, False, None, False, reason)
    if fmt == "zarr":
        state = read_zarr_state(output_path)
        if state is None or state.fingerprint is None:
            return Existing(existing, False, None, False,
                            f"{output_path} is not a rasterflow Zarr store (no rasterflow_fingerprint attribute)")
        return Existing(existing, True, state.fingerprint, state.complete)
    report = report_of(output_path)
    listed = {str(o.get("path")): o.get("bytes") for o in report.get("outputs", []) if isinstance(o, dict)}
    fingerprint = report.get("fingerprint") if report.get("status") == "ok" else None
    foreign = [p for p in existing if p not in listed]
    if foreign or not fingerprint:
        shown = foreign[0] if foreign else existing[0]
        return Existing(existing, False, None, False,
                        f"{shown} is not listed as written by rasterflow in {output_path}.report.json")
    from rasterflow.write.common import path_size

    complete = set(expected) <= set(listed) and all(
        exists(p) and (listed[p] is None or path_size(p) == listed[p]) for p in expected)
    return Existing(existing, True, str(fingerprint), complete)


def foreign_reason(existing: Sequence[str], input_hrefs: Iterable[str] = ()) -> str:
    """Why rasterflow must not replace one of the ``existing`` paths whatever records say (a symlink, an input of
    the job); empty when there is no such reason."""
    from rasterflow.write.common import is_remote

    local_inputs = [h[len("file://"):] if h.startswith("file://") else h for h in input_hrefs if not is_remote(h)]
    for path in existing:
        if not is_remote(path):
            if os.path.islink(path):
                return f"{path} is a symlink; rasterflow never writes through one (point output.path at the real place)"
            for href in local_inputs:
                if os.path.exists(href) and _same_file(path, href):
                    return f"{path} is an input of this job (an item's asset)"
    return ""


def decide(policy: str, existing: Existing, fingerprint: str, output_path: str) -> str:
    """What to do: ``"write"`` (nothing there, or replacing our own output) or ``"up_to_date"``.

    A Zarr staging store or an unfinished in-place store of this very job is resumed by the writer (``"write"``).

    Raises
    ------
    OutputExistsError
        ``policy == "error"`` and an output exists.
    OutputNotOursError
        ``skip``/``overwrite`` asked, but what is there is not a rasterflow output.
    """
    if existing.empty:
        return "write"
    if existing.ours and existing.fingerprint == fingerprint and not existing.complete:
        return "write"  # an interrupted write of this very job: resume it
    shown = ", ".join(existing.paths[:3]) + (f" and {len(existing.paths) - 3} more" if len(existing.paths) > 3 else "")
    if policy == "error":
        return _refuse_existing(shown, existing)
    if not existing.ours:
        raise OutputNotOursError(f"refusing to replace {shown}: {existing.why_not_ours}. Nothing was changed; "
                                 f"choose another output.path")
    if policy in ("skip", "update") and existing.complete and existing.fingerprint == fingerprint:
        return "up_to_date"
    return "write"


def _refuse_existing(shown: str, existing: Existing) -> str:
    what = "output" if len(existing.paths) == 1 else "outputs"
    verb = "exists" if len(existing.paths) == 1 else "exist"
    raise OutputExistsError(f"{what} {shown} already {verb}; set output.if_exists: skip (rerun only when inputs "
                            f"changed) or overwrite, pass --overwrite, or choose another path "
                            f"(output.overwrite: true is the old spelling)")


def leftover_temp_files(expected: Sequence[str]) -> list[str]:
    """Hidden temporary COG files of earlier runs (killed ones) beside the expected outputs.

    Only safe to delete while holding the output's lock: then no live run owns them.
    """
    found: list[str] = []
    for path in expected:
        if "://" in path and not path.startswith("file://"):
            continue
        directory, name = os.path.split(path)
        try:
            entries = os.listdir(directory or ".")
        except OSError:
            continue
        prefix = f".{name}.rasterflow-"
        found += [os.path.join(directory, e) for e in entries if e.startswith(prefix) and e.endswith(".tif")]
    return sorted(found)


def report_may_replace(report_path: str, *, committed: bool) -> bool:
    """Whether a run may write its report at ``report_path`` (beside the output).

    The report beside an output belongs to the run that made it: only a run that committed the output replaces it.
    Other runs (refused, up to date, failed, interrupted) write there only when no successful run's report is there
    whose outputs still exist; otherwise their report goes elsewhere (the results directory).
    """
    if committed:
        return True
    try:
        data = json.loads(Path(report_path).read_text())
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False  # unreadable: not ours to judge, keep it
    if not isinstance(data, dict) or data.get("status") not in ("ok", "up_to_date"):
        return True
    from rasterflow.write.common import exists

    outputs = [o.get("path") for o in data.get("outputs", []) if isinstance(o, dict)]
    return not any(p and exists(str(p)) for p in outputs)
