"""The dimensions of a Dataset to write ((y, x) and the leading ones, e.g. period and quantile) and the file names of
a COG output: one file per entry of the leading dimensions, named after its coordinate labels.

Standard library at import time (numpy loads inside); the names are known before any graph exists.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast, overload

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr

__all__ = ["spatial_dims", "leading_dims", "cog_entries", "cog_output_paths"]


def spatial_dims(ds: xr.Dataset) -> tuple[Hashable, Hashable]:
    """The (y, x) dimension names: the last two dims of the data variables.

    Parameters
    ----------
    ds : xarray.Dataset

    Returns
    -------
    (hashable, hashable)
        The names as the dataset has them (rasterflow's are str).

    Raises
    ------
    ValueError
        No data variables, fewer than two dims, or data variables with different dims.
    """
    names = list(ds.data_vars)
    if not names:
        raise ValueError("the dataset to write has no data variables")
    dims = ds[names[0]].dims
    if len(dims) < 2:
        raise ValueError(f"data variable {names[0]!r} has dims {dims}; expected (..., y, x)")
    for name in names[1:]:
        if ds[name].dims != dims:
            raise ValueError(
                f"every data variable must have the same dims; {names[0]!r} has {dims}, {name!r} has {ds[name].dims}"
            )
    return dims[-2], dims[-1]


def leading_dims(ds: xr.Dataset) -> tuple[Hashable, ...]:
    """The dims before (y, x), e.g. ``("period", "quantile")``; empty for plain 2-D bands.

    Parameters
    ----------
    ds : xarray.Dataset

    Returns
    -------
    tuple of hashable

    Raises
    ------
    ValueError
        As :func:`spatial_dims`.
    """
    spatial_dims(ds)  # validates
    return tuple(ds[next(iter(ds.data_vars))].dims[:-2])


def _format_label(dim: Hashable, value: Any) -> str:
    import numpy as np

    if dim == "quantile":
        return f"q{float(value):g}"
    if isinstance(value, np.datetime64) or (hasattr(value, "dtype") and np.issubdtype(value.dtype, np.datetime64)):
        ts = np.datetime64(value, "s")
        day = np.datetime64(value, "D")
        if ts == day:
            return str(day)
        return str(ts).replace(":", "")
    if hasattr(value, "isoformat"):  # datetime / pandas.Timestamp
        text: str = value.isoformat()
        return text[:10] if text[10:].strip("T0:.") == "" else text.replace(":", "")
    if isinstance(value, (float, np.floating)):
        return f"{float(value):g}"
    if isinstance(value, bytes):
        value = value.decode()
    text = str(value.item() if hasattr(value, "item") else value)
    return text.replace("/", "-").replace(os.sep, "-").replace(" ", "_")


@overload
def cog_entries(path: str, ds_or_coords: xr.Dataset) -> list[tuple[dict[Hashable, int], dict[Hashable, Any], str]]:
    ...


@overload
def cog_entries(path: str, ds_or_coords: Mapping[str, Sequence[Any]]) -> list[tuple[dict[str, int], dict[str, Any], str]]:
    ...


def cog_entries(path: str, ds_or_coords: xr.Dataset | Mapping[str, Sequence[Any]]
                ) -> list[tuple[dict[Hashable, int], dict[Hashable, Any], str]] | list[tuple[dict[str, int], dict[str, Any], str]]:
    """One ``(positions, labels, file path)`` per entry of the leading dims, in row-major order.

    Parameters
    ----------
    path : str
        The output as the spec names it.
    ds_or_coords : xarray.Dataset or mapping
        The Dataset to write, or ``{leading dim: coordinate values}`` (see :func:`cog_output_paths`).

    Returns
    -------
    list of (dict, dict, str)
        ``positions`` maps each leading dim to the integer index of the entry, ``labels`` to its coordinate value.

    Raises
    ------
    ValueError
        Two entries would get the same file name.
    """
    import itertools

    coords: dict[Hashable, Sequence[Any]]
    if not hasattr(ds_or_coords, "data_vars") and isinstance(ds_or_coords, Mapping):  # a Dataset is a Mapping too
        coords = {k: list(v) for k, v in ds_or_coords.items()}
    else:
        ds = cast("xr.Dataset", ds_or_coords)  # it has data_vars
        coords = {}
        for dim in leading_dims(ds):
            if f"{dim}_label" in ds.coords:  # e.g. period: datetimes, named in files by their labels ("2024-06")
                coords[dim] = [str(v) for v in ds[f"{dim}_label"].values]
            elif dim in ds.coords:
                coords[dim] = list(ds[dim].values)
            else:  # a dimension without a coordinate: number the files
                coords[dim] = list(range(ds.sizes[dim]))
    path = str(path)
    directory, name = os.path.split(path)
    stem, suffix = os.path.splitext(name)
    out: list[tuple[dict[Hashable, int], dict[Hashable, Any], str]] = []
    if not coords:
        out.append(({}, {}, path))
        return out
    dims = list(coords)
    seen: dict[str, tuple[Any, ...]] = {}
    for combo in itertools.product(*(range(len(coords[d])) for d in dims)):
        labels = {d: coords[d][i] for d, i in zip(dims, combo)}
        parts = [_format_label(d, labels[d]) for d in dims]
        file_path = os.path.join(directory, f"{stem}_{'_'.join(parts)}{suffix}")
        if file_path in seen:
            raise ValueError(
                f"two entries of {dims} ({seen[file_path]} and {tuple(labels.values())}) would both be written to "
                f"{file_path}; their coordinate labels must be distinct"
            )
        seen[file_path] = tuple(labels.values())
        out.append((dict(zip(dims, combo)), labels, file_path))
    return out


def cog_output_paths(path: str, ds_or_coords: xr.Dataset | Mapping[str, Sequence[Any]]) -> list[str]:
    """The files a COG write of ``ds_or_coords`` to ``path`` produces.

    ``ds_or_coords`` is the Dataset to write, or a mapping ``{leading dim: coordinate values}`` (e.g.
    ``{"period": ["2024-06", "2024-07"], "quantile": [0.1, 0.9]}``), so callers can know the names before a graph
    exists. No leading dims → ``[path]``; ``period`` → ``<stem>_<period><suffix>``; ``quantile`` →
    ``<stem>_q<q><suffix>``; both → ``<stem>_<period>_q<q><suffix>``; ``time`` → ``<stem>_<YYYY-MM-DD><suffix>``.

    Parameters
    ----------
    path : str
        The output as the spec names it.
    ds_or_coords : xarray.Dataset or mapping

    Returns
    -------
    list of str
    """
    return [p for _pos, _labels, p in cog_entries(path, ds_or_coords)]
