"""The read plan's light parts, below both planning and the reader (ARCHITECTURE.md's layering: planning decides,
``read/`` executes, and a layer imports only from the layers below it).

* the run's read policy: :class:`ReadPolicy`, :func:`policy_from_spec`, :func:`io_concurrency` (it travels inside
  every task; :mod:`rasterflow.read.policy` keeps the per-process state and the statistics);
* where an href lives: :func:`vsi_path`, :func:`is_remote`;
* which files rasterflow decodes itself: :func:`decodes`, :func:`decoder_available` (the tile decoder,
  :mod:`rasterflow.read.tiles`) and :func:`supported`, :func:`gcs_config` (the concurrent reader,
  :mod:`rasterflow.read.fetch`).

Standard library only, so ``validate`` and ``plan`` stay fast and worker processes import nothing more for it. The
reader's modules re-export these names where they were defined before.
"""

from __future__ import annotations

import importlib.util
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rasterflow.gdalenv import allowed_extensions, remote_read_options
from rasterflow.retry import RetryPolicy

if TYPE_CHECKING:  # pragma: no cover
    from obstore.store import GCSConfig

    from rasterflow.spec.models import Source

__all__ = ["ReadPolicy", "policy_from_spec", "io_concurrency", "vsi_path", "is_remote", "LOSSLESS_CODECS",
           "ENV_SWITCH", "decodes", "decoder_available", "supported", "gcs_config"]


@dataclass(frozen=True)
class ReadPolicy:
    """How the reads of one run behave."""

    retry: RetryPolicy = field(default_factory=RetryPolicy)
    on_read_error: str = "fail"
    """``fail``: the first file that cannot be read stops the run; ``nodata``: it is treated as missing."""
    max_failed_fraction: float = 0.0
    """With ``nodata``: the run fails when more than this share of its files could not be read."""
    sign: str | None = None
    """The name of a signer (:mod:`rasterflow.read.signing`), None = hrefs are opened as they are."""
    extensions: str | None = None
    """``CPL_VSIL_CURL_ALLOWED_EXTENSIONS`` (from the job's hrefs)."""
    run_id: str = "local"
    """Keys this run's statistics on the workers."""
    io_concurrency: int = 64
    """Range requests in flight per process on the concurrent remote path (``source.io.concurrency``)."""
    io_buffer: int = 32 * 1024 * 1024
    """Bytes of compressed tiles a task fetches ahead of its decoder (``source.io.buffer``)."""
    io_reader: str = "auto"
    """``auto``: remote COGs that can be decoded here are fetched concurrently (:mod:`rasterflow.read.prefetch`);
    ``gdal``: every remote read through GDAL (``source.io.reader``)."""

    def gdal_options(self) -> dict[str, str]:
        """The GDAL config options of every open and read (what the environment does not set itself)."""
        return remote_read_options(timeout=self.retry.timeout, extensions=self.extensions)

    def as_dict(self) -> dict[str, Any]:
        return {"retry": self.retry.as_dict(), "on_read_error": self.on_read_error,
                "max_failed_fraction": self.max_failed_fraction, "sign": self.sign,
                "io": {"concurrency": self.io_concurrency, "buffer": self.io_buffer, "reader": self.io_reader}}


def policy_from_spec(source: Source | None, hrefs: Iterable[str] = (), round_trip: float | None = None) -> ReadPolicy:
    """The policy of a run from the spec's ``source`` section and the job's hrefs; a fresh ``run_id``.
    ``round_trip``: seconds of a request measured in planning (``source.io.concurrency`` and ``buffer: auto``
    follow it)."""
    io = getattr(source, "io", None)
    return ReadPolicy(
        io_concurrency=io_concurrency(getattr(io, "concurrency", "auto"), round_trip),
        io_buffer=io_buffer(None if io is None or io.buffer == "auto" else int(io.buffer_bytes), round_trip),
        io_reader=str(getattr(io, "reader", "auto")),
        retry=RetryPolicy.from_spec(getattr(source, "retry", None)),
        on_read_error=str(getattr(source, "on_read_error", "fail")),
        max_failed_fraction=float(getattr(source, "max_failed_fraction", 0.0)),
        sign=getattr(source, "sign", None),
        extensions=allowed_extensions(hrefs),
        run_id=uuid.uuid4().hex,
    )


MIB = 1024 * 1024


def io_buffer(setting: int | None, round_trip: float | None = None) -> int:
    """Compressed bytes a task fetches ahead of its decoder: the spec's ``source.io.buffer`` in bytes, or for
    ``auto`` (None) what the measured round trip asks for: 32 MiB per 100 ms, at least 16 and at most 64 MiB
    (16 MiB at 40 ms, 32 MiB at 100 ms), else 32 MiB.

    Why it follows the latency: on a 5490² x 36 season in one process (benchmarks/remote_read.py, 3 alternated
    rounds), 16 MiB against 32 MiB held the peak at 500-502 MB against 550-564 MB at 40 ms for the same wall
    (16.4-17.8 s against 15.8-21.3 s), while at 100 ms the threads waited 4.2-5.1 s against 1.3-1.9 s (wall
    17.1-19.2 s against 18.4-19.5 s)."""
    if setting is not None:
        return max(1, int(setting))
    if round_trip is None or round_trip <= 0:
        return 32 * MIB
    return int(min(64 * MIB, max(16 * MIB, round(round_trip / 0.1 * 32 * MIB))))


def io_concurrency(setting: int | str, round_trip: float | None = None) -> int:
    """Requests in flight per process: the spec's number, or for ``auto`` enough to keep the pipe full at the
    measured round trip (one request per 0.625 ms of latency, 64..256: 64 at 40 ms, 160 at 100 ms), else 64.

    Why so many: a process receives ~100-200 MB/s of tiles through the reader; at ~200 kB a request and 40 ms a
    round trip that takes ~40 requests in flight, and each wait for the first byte of a new window adds to the
    wall (benchmarks/remote_read.py: a 5490² x 36 season at 40 ms, 32 -> 64 in flight)."""
    if isinstance(setting, int) and not isinstance(setting, bool):
        return max(1, setting)
    if round_trip is None or round_trip <= 0:
        return 64
    return int(min(256, max(64, round(round_trip / 0.000625))))


# ---- where an href lives -----------------------------------------------------------------------------------

_SCHEMES = {"http": "/vsicurl/", "https": "/vsicurl/", "s3": "/vsis3/", "gs": "/vsigs/", "az": "/vsiaz/",
            "abfs": "/vsiaz/"}
_NETWORK_VSI = ("/vsicurl", "/vsis3", "/vsigs", "/vsiaz", "/vsiadls", "/vsioss", "/vsiswift", "/vsiwebhdfs")


def vsi_path(href: str) -> str:
    """The path GDAL opens for ``href`` (see the module docstring)."""
    scheme, sep, rest = href.partition("://")
    if sep and scheme.lower() in _SCHEMES:
        prefix = _SCHEMES[scheme.lower()]
        return prefix + (href if prefix == "/vsicurl/" else rest)
    return href


def is_remote(href: str) -> bool:
    """Whether ``href`` is read over the network (http(s), object stores, their /vsi paths)."""
    return vsi_path(href).startswith(_NETWORK_VSI)


# ---- what rasterflow decodes itself -------------------------------------------------------------------------

LOSSLESS_CODECS = {1: "NONE", 5: "LZW", 8: "DEFLATE", 32946: "DEFLATE", 50000: "ZSTD"}
"""TIFF compression tags this path decodes (their GDAL names, as :func:`rasterflow.sources.compression_name`
gives them)."""

ENV_SWITCH = "RASTERFLOW_TILE_DECODER"
"""``gdal``: every read through GDAL; anything else (or unset): local tiled files through this module."""


def decodes(codec: str | None, tile_shape: tuple[int, int] | None) -> bool:
    """Whether local files of this codec (GDAL's name) and tile shape (None: not tiled) are decoded here, as far as
    a file's header tells at plan time (the reader checks each file again)."""
    return (tile_shape is not None and (codec or "").upper() in set(LOSSLESS_CODECS.values())
            and decoder_available())


def decoder_available() -> bool:
    """Whether this process decodes local tiles itself: tifffile and imagecodecs installed, not switched off by
    :data:`ENV_SWITCH`. Importless, so the planner can ask."""
    if os.environ.get(ENV_SWITCH, "").strip().lower() == "gdal":
        return False
    return all(importlib.util.find_spec(name) is not None for name in ("tifffile", "imagecodecs"))


def supported(href: str) -> bool:
    """Whether :class:`RangeClient` reads ``href``; other schemes stay with GDAL.

    Parameters
    ----------
    href : str
        An asset's href.

    Returns
    -------
    bool
        True for ``http``, ``https``, ``s3``, ``az`` and ``abfs``; for ``gs`` when :func:`gcs_config` can configure
        the store from the environment (else GDAL reads it, as it knows more ways to authenticate).
    """
    scheme = href.partition("://")[0].lower() if "://" in href else ""
    if scheme == "gs":
        return gcs_config() is not None
    return scheme in ("http", "https", "s3", "az", "abfs")


TRUE_VALUES = ("YES", "TRUE", "1", "ON")
"""How GDAL's boolean variables say yes (``GS_NO_SIGN_REQUEST``, ``AZURE_NO_SIGN_REQUEST``)."""

_GCS_ONLY_GDAL = ("GS_SECRET_ACCESS_KEY", "GS_ACCESS_KEY_ID", "GS_OAUTH2_REFRESH_TOKEN", "GS_USER_PROJECT")
_GCS_KEY_ONLY_GDAL = ("GS_OAUTH2_PRIVATE_KEY", "GS_OAUTH2_PRIVATE_KEY_FILE", "CPL_GS_CREDENTIALS_FILE")


def gcs_config(environ: Mapping[str, str] | None = None) -> GCSConfig | None:
    """obstore's ``GCSStore`` settings from the variables GDAL's ``/vsigs/`` reads, in GDAL's order.

    Parameters
    ----------
    environ : Mapping[str, str], optional
        The environment; ``os.environ`` when None.

    Returns
    -------
    GCSConfig or None
        ``base_url`` from ``CPL_GS_ENDPOINT`` (an emulator or a private endpoint; without it obstore's default,
        GDAL's too, ``https://storage.googleapis.com``), and:

        * ``GS_NO_SIGN_REQUEST=YES``: ``skip_signature`` (public buckets; no credentials are looked for);
        * else ``GOOGLE_APPLICATION_CREDENTIALS``: ``application_credentials``, that JSON file (a service account's
          key or gcloud's authorized-user credentials);
        * else nothing more: obstore then looks, as Google's libraries do, for gcloud's application-default
          credentials file and the metadata server of a Compute Engine machine (GDAL: the metadata server).

        None when the environment authenticates in a way only GDAL follows: HMAC keys (``GS_SECRET_ACCESS_KEY``,
        ``GS_ACCESS_KEY_ID``), an OAuth2 refresh token (``GS_OAUTH2_REFRESH_TOKEN``), requester pays
        (``GS_USER_PROJECT``), or, without ``GOOGLE_APPLICATION_CREDENTIALS``, a private key and e-mail
        (``GS_OAUTH2_PRIVATE_KEY[_FILE]``, ``GS_OAUTH2_CLIENT_EMAIL``) or a boto credentials file
        (``CPL_GS_CREDENTIALS_FILE``, by default ``~/.boto`` when it exists): such hrefs stay with GDAL.

    Examples
    --------
    >>> gcs_config({"GS_NO_SIGN_REQUEST": "YES", "CPL_GS_ENDPOINT": "http://127.0.0.1:9023/"})
    {'base_url': 'http://127.0.0.1:9023', 'skip_signature': True}
    >>> gcs_config({"GS_SECRET_ACCESS_KEY": "secret", "GS_ACCESS_KEY_ID": "id"}) is None
    True
    """
    env = os.environ if environ is None else environ
    config: GCSConfig = {}
    endpoint = env.get("CPL_GS_ENDPOINT", "").rstrip("/")
    if endpoint:
        config["base_url"] = endpoint
    if env.get("GS_NO_SIGN_REQUEST", "").upper() in TRUE_VALUES:
        config["skip_signature"] = True
        return config
    if any(env.get(name) for name in _GCS_ONLY_GDAL):
        return None
    if env.get("GOOGLE_APPLICATION_CREDENTIALS"):
        config["application_credentials"] = env["GOOGLE_APPLICATION_CREDENTIALS"]
        return config
    if any(env.get(name) for name in _GCS_KEY_ONLY_GDAL):
        return None
    home = env.get("HOME") or env.get("USERPROFILE")
    if home and os.path.exists(os.path.join(home, ".boto")):
        return None
    return config
