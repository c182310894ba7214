"""What a job reads and about how long it takes: the measured rates, the remote requests and the wall-time estimate."""

from __future__ import annotations

from dataclasses import dataclass

from rasterflow import budget
from rasterflow.planning.chunks import ChunkIndex
from rasterflow.planning.grid import GridPlan
from rasterflow.sizing import WorkerLayout
from rasterflow.sources import SourceTable
from rasterflow.units import format_bytes


DECODED_PX_PER_SECOND_PER_THREAD = 59e6
"""End-to-end rate of one worker thread in decoded source pixels per second (read + decode + mask + bands + median
+ Zarr write), from benchmarks/scaling.py (2026-12-03, 2 workers × 1 thread, masked NDVI median over 8 dates of
3 assets): each added 2048² × 8 dates × 3 assets (101 M decoded pixels) added 0.85 s of compute+write on 2
threads. The marginal rate: the fixed part (imports, first file opens, the Zarr template) is
:data:`STARTUP_SECONDS`."""

STARTUP_SECONDS = 3.0
"""Interpreter, imports, cluster start and the first tasks' imports and opens (scaling.py: 2.2 s of process around
the compute stage and ~0.7 s fixed inside it)."""

CLIENT_CPU_SECONDS_PER_GB = 0.9
"""The concurrent reader's own CPU per GB of compressed tiles it fetches (the socket's reads, the body's copies, the
event loop), taken from the cores the tasks run on: 0.90 s/GB over HTTP(S) with aiohttp, 0.69 s/GB with obstore's
client for ``s3://``, ``az://`` and ``gs://`` (``benchmarks/fetch_cpu.py``, 2026-12-07; the larger is counted)."""

SCHEDULER_SECONDS_PER_TASK = 1e-3
"""The Dask scheduler's cost per task (the budget's ~1 ms): serial, so a floor on the wall time of many tasks."""


@dataclass(frozen=True)
class RemoteProbe:
    """What ``plan`` measured of a remote source through the concurrent reader (one header request)."""

    round_trip: float
    """Seconds one request of 64 kB took (the first byte's latency, and the connection's set-up)."""
    bytes_per_pixel: float | None
    """The probed file's compressed tiles per pixel."""
    decodable: bool
    """The file is one the concurrent reader decodes itself (else GDAL reads it)."""


@dataclass(frozen=True)
class RemoteCost:
    """The remote reads of a job: requests, compressed bytes, and the time spent waiting on the network."""

    files: int
    requests: int
    """Header reads (one per file and worker process) plus one range request per file, chunk and row of tiles (and
    column of sub-blocks where they are taken down each column): an estimate from the chunk index and the
    tiling."""
    bytes: int
    """Compressed bytes of the tiles the chunks need (the probed file's ratio; uncompressed when unknown)."""
    round_trip: float | None
    concurrency: int
    processes: int
    network_seconds: float
    """``requests x round trip / (concurrency x processes)``: the waiting that overlaps with compute."""
    client_seconds: float = 0.0
    """CPU seconds the reader itself spends on the bytes (:data:`CLIENT_CPU_SECONDS_PER_GB`), on the tasks' cores:
    added to the compute of the wall estimate."""

    def summary(self) -> str:
        rtt = f"{self.round_trip * 1000:.0f} ms measured" if self.round_trip else "round trip not measured"
        return (f"~{self.requests:,} requests for {format_bytes(self.bytes)} from {self.files:,} files ({rtt}, "
                f"{self.concurrency} in flight per process x {self.processes}): ~{_duration(self.network_seconds)} "
                f"of waiting, overlapped with compute; ~{self.client_seconds:.0f} CPU-s of the reader's own, "
                "counted in the compute")


@dataclass(frozen=True)
class JobCost:
    """What the tasks read and about how long they take, from the items' declared grids (no file is opened)."""

    files: int
    """Source files (item × asset) whose footprint meets the output grid."""
    pixels_read: int
    """Source pixels inside the grid, summed over those files (what the reads decode, before tile rounding)."""
    bytes_read: int
    """``pixels_read`` in each file's data type (its declared one, else what the asset loads in)."""
    undeclared_files: int
    """Files without ``proj:`` metadata, counted as covering the whole grid at its resolution."""
    spatial_chunks: int
    tasks: int
    threads: int
    """Worker threads of the layout (all read in parallel)."""
    seconds_per_chunk: float
    """The average spatial chunk's decoded pixels at :data:`DECODED_PX_PER_SECOND_PER_THREAD`, on one thread."""
    wall_seconds: float
    """``max((chunks × seconds_per_chunk + the remote reader's CPU) / threads, tasks × scheduler cost, network) +
    startup``: an estimate, not a promise (other kernels and busy machines are slower)."""
    remote: RemoteCost | None = None
    """The network side, when the files are remote and read by the concurrent reader."""

    def summary(self) -> str:
        return (f"~{_duration(self.wall_seconds)}: {self.spatial_chunks:,} chunks × {self.seconds_per_chunk:.2g} s "
                f"per chunk on {self.threads} thread{'s' if self.threads != 1 else ''} (at "
                f"{DECODED_PX_PER_SECOND_PER_THREAD / 1e6:.0f} Mpx/s decoded per thread, measured) + "
                f"{STARTUP_SECONDS:g} s start-up")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def job_cost(sources: SourceTable, grid: GridPlan, report: budget.BudgetReport, layout: WorkerLayout,
             index: ChunkIndex | None = None, probe: RemoteProbe | None = None,
             concurrency: int = 32) -> JobCost:
    """Bytes the tasks read and the estimated wall time: each file's footprint on the grid (without the resampling
    margin) in its own pixels and data type; the time from the measured per-thread rate; for remote files read by
    the concurrent reader, the requests and the waiting (:class:`RemoteCost`)."""
    from rasterflow.units import dtype_itemsize

    height, width = grid.shape
    load = {a.name: dtype_itemsize(a.load_dtype) for a in sources.assets}
    grid_px_area = grid.resolution * grid.resolution
    files = pixels = nbytes = undeclared = 0
    for item_reads in sources.reads:
        for read in item_reads:
            itemsize = dtype_itemsize(read.data_type) if read.data_type else load[read.name]
            if read.footprint is None or read.transform is None:
                undeclared += 1
                files += 1
                pixels += height * width
                nbytes += height * width * itemsize
                continue
            r0, r1, c0, c1 = read.footprint
            if r0 >= r1 or c0 >= c1:
                continue
            # footprints carry a pixel of margin on each side (footprint_on_grid) unless clipped at the grid's
            # edge: take it off where it was added (a file ending one pixel short of the edge keeps one column)
            rows = r1 - r0 - (r0 > 0) - (r1 < height)
            cols = c1 - c0 - (c0 > 0) - (c1 < width)
            if rows <= 0 or cols <= 0:
                continue
            a, b, _, d, e, _ = read.transform
            src_area = abs(a * e - b * d) or grid_px_area
            # a file's pixels inside the grid, at most its own shape
            n = min(int(round(rows * cols * grid_px_area / src_area)),
                    read.shape[0] * read.shape[1] if read.shape else rows * cols)
            files += 1
            pixels += n
            nbytes += n * itemsize
    inputs = report.inputs
    chunks = inputs.n_spatial_chunks
    threads = max(1, layout.n_workers * layout.threads_per_worker)
    per_chunk = pixels / chunks / DECODED_PX_PER_SECOND_PER_THREAD if chunks else 0.0
    remote = remote_cost(sources, report, layout, index, probe, files, pixels, nbytes, concurrency) \
        if inputs.remote_fetch else None
    network = remote.network_seconds if remote is not None else 0.0
    compute = (chunks * per_chunk + (remote.client_seconds if remote is not None else 0.0)) / threads
    wall = max(compute, report.task_count * SCHEDULER_SECONDS_PER_TASK, network) + STARTUP_SECONDS
    return JobCost(files=files, pixels_read=pixels, bytes_read=nbytes, undeclared_files=undeclared,
                   spatial_chunks=chunks, tasks=report.task_count, threads=threads, seconds_per_chunk=per_chunk,
                   wall_seconds=wall, remote=remote)


def remote_cost(sources: SourceTable, report: budget.BudgetReport, layout: WorkerLayout, index: ChunkIndex | None,
                probe: RemoteProbe | None, files: int, pixels: int, nbytes: int, concurrency: int) -> RemoteCost:
    """The requests of the concurrent reader: a header per file and worker process, then per file and chunk one
    request per row of tiles the chunk spans (its sub-blocks taken across each row of them,
    :func:`~rasterflow.budget.sub_blocks_across`; else also one per column of sub-blocks, which fetch their tiles
    apart from their neighbours'); the waiting if ``concurrency`` requests are in flight per process."""
    inputs = report.inputs
    processes = max(1, layout.n_workers if layout.processes else 1)
    tile_y, tile_x = inputs.source_tile or (inputs.chunk_yx[0], inputs.chunk_yx[1])
    chunk_y, chunk_x = inputs.chunk_yx
    rows, cols = report.sub_block
    columns = -(-chunk_x // cols) if cols and not budget.sub_blocks_across(inputs) else 1
    per_file_chunk = (-(-chunk_y // tile_y)) * max(1, min(columns, -(-chunk_x // tile_x)))
    n_assets = max(1, len(sources.assets))
    if index is not None:
        file_chunks = int(index.offsets[-1]) * n_assets
    else:
        file_chunks = files * inputs.n_spatial_chunks
    requests = min(files, files * processes) + file_chunks * per_file_chunk
    compressed = int(pixels * probe.bytes_per_pixel) if probe is not None and probe.bytes_per_pixel else nbytes
    rtt = probe.round_trip if probe is not None else None
    network = requests * (rtt or 0.0) / (max(1, concurrency) * processes)
    return RemoteCost(files=files, requests=requests, bytes=compressed, round_trip=rtt, concurrency=concurrency,
                      processes=processes, network_seconds=network,
                      client_seconds=compressed / 1e9 * CLIENT_CPU_SECONDS_PER_GB)
