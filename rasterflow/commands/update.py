"""``if_exists: update``: each period's files and fingerprints, and the plan of the stale periods only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rasterflow.commands.planjob import fingerprint, plan_with_items
from rasterflow.planning import JobPlan

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.sizing import WorkerLayout
    from rasterflow.spec import LoadedSpec


def _items_by_period(plan: JobPlan) -> dict[str, list[dict[str, Any]]]:
    """The items of each output period, exactly as the plan groups them (passes included)."""
    program = plan.program
    if program is None or not plan.period_labels:
        return {}
    per_time = program.steps or tuple((index,) for index in range(len(plan.items)))
    return {str(label): [plan.items[i] for t in group for i in per_time[t]]
            for label, group in zip(plan.period_labels, program.groups)}


def file_fingerprints(plan: JobPlan, output_path: str) -> dict[str, dict[str, str]]:
    """Per COG file of a per-period output: its period and that period's fingerprint (recorded in the report)."""
    from rasterflow.write.common import cog_entries

    by_period = _items_by_period(plan)
    out: dict[str, dict[str, str]] = {}
    for _positions, labels, path in cog_entries(output_path, _leading_coords(plan)):
        period = str(labels.get("period"))
        if period in by_period:
            out[path] = {"period": period, "fingerprint": fingerprint(plan, by_period[period])}
    return out


def update_plan(loaded: LoadedSpec, plan: JobPlan, output_path: str, files: dict[str, dict[str, str]],
                 layout: WorkerLayout) -> tuple[JobPlan, list[dict[str, Any]]]:
    """``if_exists: update``: the plan of the periods whose files are missing or stale, and the report entries of
    the files kept. Falls back to the whole plan when the existing report does not say enough."""
    from rasterflow.outputs import report_of
    from rasterflow.write.common import exists, path_size

    listed = {str(o.get("path")): o for o in report_of(output_path).get("outputs", []) if isinstance(o, dict)}
    kept, stale = [], set()
    for path, info in files.items():
        old = listed.get(path)
        if (old and old.get("fingerprint") == info["fingerprint"] and exists(path)
                and (old.get("bytes") is None or path_size(path) == old.get("bytes"))):
            kept.append(dict(old))
        else:
            stale.add(info["period"])
    if not kept or not stale:  # nothing to keep (or, with the whole fingerprint changed, nothing known stale)
        return plan, []
    by_period = _items_by_period(plan)
    subset_ids = {id(item) for period in stale for item in by_period[period]}
    subset = [item for item in plan.items if id(item) in subset_ids]
    partial = plan_with_items(loaded, subset, layout)
    if partial.program is None:
        return plan, []
    # every period of the window is in a plan; the partial one writes only the stale periods (the others' files
    # are kept as they are)
    keep = [k for k, label in enumerate(partial.period_labels) if label in stale]
    if {partial.period_labels[k] for k in keep} != stale:  # the subset must make exactly those periods, or do all
        return plan, []
    from dataclasses import replace

    program = replace(partial.program, groups=tuple(partial.program.groups[k] for k in keep))
    partial = replace(partial, program=program, period_labels=tuple(partial.period_labels[k] for k in keep),
                      period_bounds=tuple(partial.period_bounds[k] for k in keep))
    return partial, kept


def _leading_coords(plan: JobPlan) -> dict[str, list[str] | list[float]]:
    """The output's leading dimensions (period, quantile) as the writers will name them (one rule: the STAC
    writer's)."""
    from rasterflow.write.stac import leading_coords

    return leading_coords(plan)
