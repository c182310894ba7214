"""The pre-flight output check: refuse to start a run whose output exists (unless asked to replace it, or it is this
very job's interrupted Zarr write, which resumes).

Standard library at import time, so the orchestrator can check the output target before it builds a graph.
"""

from __future__ import annotations

from collections.abc import Sequence

from rasterflow.errors import OutputExistsError
from rasterflow.write.files import exists
from rasterflow.write.zarrstate import read_zarr_state

__all__ = ["check_output_target"]

_OVERWRITE_HINT = "set output.overwrite: true or choose another path"


def check_output_target(
    path: str,
    fmt: str,
    *,
    overwrite: bool,
    fingerprint: str | None = None,
    paths: Sequence[str] | None = None,
) -> None:
    """Refuse to start when the output exists and ``overwrite`` is false. Call it before any work.

    Parameters
    ----------
    path : str
        The output as the spec names it (a Zarr store, or the COG path before per-entry suffixes).
    fmt : {"zarr", "cog"}
    overwrite : bool
        ``output.overwrite``: when true, nothing is refused (the writers replace the output once the new one is
        complete).
    fingerprint : str, optional
        The run's fingerprint. An unfinished rasterflow Zarr store at ``path`` with this fingerprint (a previous
        in-place run that was interrupted) is not refused: the write resumes it.
    paths : sequence of str, optional
        For COG: every file the write would produce (:func:`cog_output_paths`); default ``[path]``.

    Raises
    ------
    OutputExistsError
        Naming the existing path(s).
    """
    fmt = fmt.lower()
    if fmt not in ("zarr", "cog"):
        raise ValueError(f"unknown output format {fmt!r}; expected 'zarr' or 'cog'")
    if overwrite:
        return
    if fmt == "zarr":
        if not exists(path):
            return
        state = read_zarr_state(path)
        if fingerprint is not None and state is not None and not state.complete and state.fingerprint == fingerprint:
            return  # an interrupted in-place write of this very job: resume it
        raise OutputExistsError(f"output {path} already exists; {_OVERWRITE_HINT}")
    existing = [p for p in (list(paths) if paths is not None else [path]) if exists(p)]
    if existing:
        shown = ", ".join(existing[:5]) + (f" and {len(existing) - 5} more" if len(existing) > 5 else "")
        what = "output" if len(existing) == 1 else "outputs"
        raise OutputExistsError(f"{what} {shown} already exist{'s' if len(existing) == 1 else ''}; {_OVERWRITE_HINT}")
