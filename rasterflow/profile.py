"""``rasterflow profile``: run one representative task in-process and compare its memory with the model.

One chunk (the middle one: edge chunks can be partial) goes through load -> mask -> bands -> reduce on Dask's
synchronous scheduler, so everything happens in this process where it can be measured: tracemalloc sees Python and
NumPy allocations; memray, when installed, also sees GDAL's native buffers and can draw a flame graph.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rasterflow.units import format_bytes

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.planning import JobPlan

__all__ = ["TaskProfile", "profile_one_task"]


@dataclass(frozen=True)
class TaskProfile:
    """What one task used, next to what the budget model predicted for it."""

    chunk_index: tuple[int, ...]
    chunk_shape: dict[str, int]
    predicted_task_bytes: int
    worst_stage: str
    tracemalloc_peak: int
    memray_peak: int | None
    seconds: float
    """Wall time of the task without a profiler attached."""
    top_sites: list[tuple[str, int]] = field(default_factory=list)
    flamegraph: str | None = None
    variables: tuple[str, ...] = ()
    """The output variables the task makes (every statistic of a list ``reduce``, a composite's variables)."""
    statistics: list[str] = field(default_factory=list)
    """``plan``'s per-statistic lines (:attr:`rasterflow.planning.JobPlan.statistics_cost`); empty for a single
    statistic."""

    def lines(self) -> list[str]:
        """The report printed by the CLI."""
        predicted = self.predicted_task_bytes
        out = [
            f"one task: chunk {self.chunk_index} of shape "
            + " x ".join(f"{k} {v}" for k, v in self.chunk_shape.items()) + f", {self.seconds:.2f} s",
            f"  predicted per task         {format_bytes(predicted):>10}  (worst stage: {self.worst_stage})",
            f"  measured, tracemalloc      {format_bytes(self.tracemalloc_peak):>10}  "
            f"measured/predicted {self.tracemalloc_peak / predicted:.2f}  (Python and NumPy buffers)",
        ]
        if self.memray_peak is not None:
            out.append(
                f"  measured, memray           {format_bytes(self.memray_peak):>10}  "
                f"measured/predicted {self.memray_peak / predicted:.2f}  (also GDAL's native buffers and cache)"
            )
        else:
            out.append("  memray is not installed: native (GDAL) allocations are not measured (pip install memray)")
        if len(self.variables) > 1:
            out.append(f"  variables of the task      {', '.join(self.variables)}")
        out += self.statistics
        if self.top_sites:
            out.append("  largest allocation sites alive at the peak (memray):")
            out += [f"    {format_bytes(size):>10}  {site}" for site, size in self.top_sites]
        if self.flamegraph:
            out.append(f"  flame graph: {self.flamegraph}")
        return out


def _middle_block(array: Any) -> tuple[int, ...]:
    return tuple(n // 2 for n in array.numblocks)


def profile_one_task(plan: JobPlan, *, use_memray: bool = True, flamegraph: str | None = None,
                     top: int = 8) -> TaskProfile:
    """Compute the middle chunk of the first output variable in this process and measure its peak memory (the
    fused task makes every statistic or composite variable of its chunk at once). The report also has ``plan``'s
    per-statistic lines (:attr:`~rasterflow.planning.JobPlan.statistics_cost`): the plan holds all it needs, the
    spec is not read."""
    import dask

    from rasterflow import graph
    from rasterflow.gdalenv import BlockCache

    from rasterflow.read.policy import current_policy, set_policy

    dataset = graph.build_dataset(plan)
    variable = dataset[next(iter(dataset.data_vars))].data
    index = _middle_block(variable)
    block = variable.blocks[index]
    # the task reads as a run's would: the spec's retries, on_read_error and signer, not the defaults
    if plan.read_policy is None:
        raise ValueError("profiling needs a plan made with the searched items")
    policy = plan.read_policy

    def compute() -> None:
        previous = current_policy()
        set_policy(policy)
        try:
            with dask.config.set(scheduler="synchronous"):
                block.compute()
        finally:
            set_policy(previous)

    # GDAL's block cache as a run's worker has it (what the budget counted), for this task only: set in this process's
    # environment it would outlive the profile (a notebook's, a test session's)
    cache = BlockCache(plan.gdal_cachemax)
    cache.apply()
    try:
        # A first, unmeasured run imports the readers and warms the file cache, so imports are not counted as the task.
        started = time.perf_counter()
        compute()
        seconds = time.perf_counter() - started
        tracemalloc.start(1)
        try:
            compute()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        memray_peak, flame = None, None
        sites: list[Any] = []
        if use_memray:
            memray_peak, flame, sites = _memray_peak(compute, flamegraph, top)
    finally:
        cache.restore()
    chunk_shape = dict(plan.chunks)
    costs = plan.statistics_cost
    return TaskProfile(
        variables=tuple(str(name) for name in dataset.data_vars),
        statistics=costs.lines() if costs is not None else [],
        chunk_index=index,
        chunk_shape=chunk_shape,
        predicted_task_bytes=plan.report.peak_task_bytes,
        worst_stage=plan.report.worst_stage.stage,
        tracemalloc_peak=peak,
        memray_peak=memray_peak,
        seconds=seconds,
        top_sites=sites,
        flamegraph=flame,
    )


def _memray_peak(compute: Any, flamegraph: str | None, top: int) -> tuple[int | None, str | None, list[Any]]:
    """Run ``compute`` under memray (native allocations included): the peak, a flame graph, and the largest
    allocation sites alive at the peak."""
    try:
        import memray
    except ImportError:
        return None, None, []
    with tempfile.TemporaryDirectory(prefix="rasterflow-profile-") as tmp:
        capture = Path(tmp) / "task.bin"
        with memray.Tracker(capture, native_traces=flamegraph is not None):
            compute()
        reader = memray.FileReader(capture)
        peak = int(reader.metadata.peak_memory)
        by_site: dict[str, int] = {}
        for record in reader.get_high_watermark_allocation_records(merge_threads=True):
            frames = record.stack_trace(max_stacks=1)
            site = f"{frames[0][1]}:{frames[0][2]} ({frames[0][0]})" if frames else "<native>"
            by_site[site] = by_site.get(site, 0) + record.size
        sites = sorted(by_site.items(), key=lambda kv: -kv[1])[:top]
        reader.close()
        if flamegraph:
            subprocess.run([sys.executable, "-m", "memray", "flamegraph", "-f", "-o", flamegraph, str(capture)],
                           check=True, capture_output=True)
    return peak, flamegraph, sites
