"""Outputs behind one interface: a Zarr store, COG files, or a grid of tiles, each owning its files, its resume, its
commit and its STAC documents.

The run (:mod:`rasterflow.commands`) asks an :class:`Output` made by :func:`output_for` what files it makes, what is
there already, to write a lazy Dataset, to write its STAC documents and what an interrupted write leaves; it does
not branch on the format. Everything comes from the plan (:class:`rasterflow.planning.JobPlan`), never the spec.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from rasterflow.planning import JobPlan
from rasterflow.write.describe import RunDescription, leading_coords
from rasterflow.write.encoding import Encoding
from rasterflow.write.result import WriteResult

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from distributed import Client

    from rasterflow.outputs import Existing
    from rasterflow.tiling import TileLayout, TilesResult

__all__ = ["Output", "ZarrOutput", "CogOutput", "TiledOutput", "WriteContext", "output_for", "leading_coords"]

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class WriteContext:
    """What every write of a run shares: the description, the resolved encoding and the writer options made from
    the plan (:func:`rasterflow.commands.output_options`), the software versions for STAC."""

    description: RunDescription
    encoding: Encoding
    options: dict[str, Any]
    """Keyword arguments of the format's writer (``write_zarr`` / ``write_cog``)."""
    software: Mapping[str, str | None]


class Output(Protocol):
    """One output of a run."""

    plan: JobPlan
    path: str

    def files(self) -> list[str]:
        """Every file (or store) the output consists of once complete."""
        ...

    def inspect(self, input_hrefs: Sequence[str]) -> Existing:
        """What is there already (:class:`rasterflow.outputs.Existing`), touching nothing."""
        ...

    def write(self, dataset: xr.Dataset, context: WriteContext, *, job_id: str, replace: bool, redo_all: bool,
              client: Client | None, progress: Progress) -> WriteResult:
        """Compute ``dataset`` and commit it; returns the writer's result (``WriteResult`` / ``TilesResult``)."""
        ...

    def write_stac(self, result: WriteResult, context: WriteContext) -> WriteResult:
        """The STAC documents of a committed output (after the data: an Item's presence means it is complete);
        returns the result with any file it adds."""
        ...

    def what_is_left(self, job_id: str, counts: Sequence[int]) -> str:
        """What an interrupted write leaves, in a sentence for the report."""
        ...


@dataclass
class _Single:
    plan: JobPlan
    path: str

    def files(self) -> list[str]:
        raise NotImplementedError

    def inspect(self, input_hrefs: Sequence[str]) -> Existing:
        from rasterflow.outputs import inspect_existing

        return inspect_existing(self.path, self.plan.output.format, self.files(), input_hrefs)

    def write_stac(self, result: WriteResult, context: WriteContext) -> WriteResult:
        from rasterflow.write.stac import write_stac

        write_stac(result, self.plan, context.description, output_path=self.path, encoding=context.encoding,
                   software=context.software, catalog=self.plan.output.catalog)
        return result


@dataclass
class ZarrOutput(_Single):
    """One Zarr store, staged and resumed block by block (:func:`rasterflow.write.write_zarr`)."""

    def files(self) -> list[str]:
        return [self.path]

    def write(self, dataset: xr.Dataset, context: WriteContext, *, job_id: str, replace: bool, redo_all: bool,
              client: Client | None, progress: Progress) -> WriteResult:
        from rasterflow.write import write_zarr

        return write_zarr(dataset, self.path, overwrite=replace, compression=self.plan.output.compression,
                          fingerprint=job_id, client=client, progress=progress,
                          fused=self.plan.code_path == "fused", place_reads=self.plan.code_path == "tree",
                          lead_groups=series_units(self.plan), **context.options)

    def what_is_left(self, job_id: str, counts: Sequence[int]) -> str:
        done, total = counts
        if not total:
            return "no block was finished; rerunning the same command starts it again"
        from rasterflow.write.common import zarr_staging_path

        return (f"{done} of {total} blocks are kept in {zarr_staging_path(self.path)}; rerunning the same command "
                f"resumes from there")


@dataclass
class CogOutput(_Single):
    """Cloud-Optimized GeoTIFFs, one per leading entry (period, quantile), committed together
    (:func:`rasterflow.write.write_cog`)."""

    def files(self) -> list[str]:
        from rasterflow.write.common import cog_output_paths

        return cog_output_paths(self.path, leading_coords(self.plan))

    def write(self, dataset: xr.Dataset, context: WriteContext, *, job_id: str, replace: bool, redo_all: bool,
              client: Client | None, progress: Progress) -> WriteResult:
        from rasterflow.write import write_cog

        return write_cog(dataset, self.path, overwrite=replace, compression=self.plan.output.compression,
                         gdal_cachemax=self.plan.writer_cachemax, client=client, progress=progress,
                         fused=self.plan.code_path == "fused", place_reads=self.plan.code_path == "tree",
                         **context.options)

    def what_is_left(self, job_id: str, counts: Sequence[int]) -> str:
        done, total = counts
        if not total:
            return "no block was finished; rerunning the same command starts it again"
        return (f"{done} of {total} blocks were computed; the temporary files were removed and rerunning the same "
                f"command writes the COG again (COG writes do not resume)")


@dataclass
class TiledOutput:
    """``output.tiling``: a grid of tiles, each a Zarr store or COGs of its own with its marker and STAC Items,
    resumed tile by tile; a Collection and a VRT per COG entry when all are done (:mod:`rasterflow.tiling`)."""

    plan: JobPlan
    path: str
    tiles: TileLayout

    def files(self) -> list[str]:
        return list(self.tiles.files())

    def inspect(self, input_hrefs: Sequence[str]) -> Existing:
        from rasterflow.tiling import inspect_tiles

        return inspect_tiles(self.tiles, list(input_hrefs))

    def write(self, dataset: xr.Dataset, context: WriteContext, *, job_id: str, replace: bool, redo_all: bool,
              client: Client | None, progress: Progress) -> TilesResult:
        from rasterflow.tiling import tiles_to_write, write_tiles
        from rasterflow.write.stac import StacContext

        options = {k: v for k, v in context.options.items() if k != "file_metadata"}  # per tile: its own tags

        def write_one(ds: xr.Dataset, path: str, *, overwrite: bool, progress: Progress,
                      file_metadata: Mapping[str, Mapping[str, Any]] | None) -> WriteResult:
            single = (ZarrOutput if self.plan.output.format == "zarr" else CogOutput)(self.plan, path)
            extra: dict[str, Any] = {} if self.plan.output.format == "zarr" else {"file_metadata": file_metadata}
            return single.write(ds, replace_options(context, {**options, **extra}), job_id=job_id,
                                replace=overwrite, redo_all=False, client=client, progress=progress)

        todo, kept = tiles_to_write(self.tiles, job_id, redo_all=redo_all)
        stac = StacContext(self.plan, context.description, self.tiles.output_path, context.encoding,
                           context.software, self.plan.output.catalog)
        return write_tiles(dataset, self.tiles, todo, kept, fingerprint=job_id, write_one=write_one, stac=stac,
                           progress=progress)

    def write_stac(self, result: WriteResult, context: WriteContext) -> WriteResult:
        from rasterflow.tiling import TilesResult, finish_tiles
        from rasterflow.write.stac import StacContext

        assert isinstance(result, TilesResult), "a tiled output's result is what its write gave (TilesResult)"

        # the tiles' Items were written with each tile; here the Collection and the VRTs
        vrts = finish_tiles(self.tiles, result, StacContext(self.plan, context.description, self.path,
                                                            context.encoding, context.software,
                                                            self.plan.output.catalog),
                            band_names=list(self.plan.program.output_names) if self.plan.program else [],
                            blocksize=self.plan.output.cog_blocksize)
        return replace(result, paths=result.paths + vrts)

    def what_is_left(self, job_id: str, counts: Sequence[int]) -> str:
        from rasterflow.tiling import what_is_left

        return what_is_left(self.tiles, job_id)


def replace_options(context: WriteContext, options: dict[str, Any]) -> WriteContext:
    """``context`` with other writer options."""
    return replace(context, options=options)


def series_units(plan: JobPlan) -> tuple[int, ...] | None:
    """The dates of each band task of a series: ``write_zarr``'s ``lead_groups`` (each band task with its dates'
    writes one task); None for any other job."""
    if plan.code_path != "series":
        return None
    from rasterflow.paths.common import time_chunks

    return time_chunks(plan)[1]


def output_for(plan: JobPlan, path: str) -> Output:
    """The output of ``plan`` at ``path`` (the rendered ``output.path``)."""
    if plan.output.tiling_size is not None:
        from rasterflow.tiling import plan_tiles

        tiles = plan_tiles(path, plan.output.format, plan.output.tiling_size, plan, leading_coords(plan))
        return TiledOutput(plan, path, tiles)
    if plan.output.format == "zarr":
        return ZarrOutput(plan, path)
    return CogOutput(plan, path)
