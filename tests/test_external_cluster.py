"""One spec on a cluster started outside rasterflow: `dask scheduler` + `dask worker` processes, as a user's would be.

The workers are plain `dask worker` processes under their nannies (no rasterflow preload, no GDAL_CACHEMAX in their
environment): what a run needs on them must arrive through worker plugins, on the workers present when the run
starts and on a worker that joins later (here: the one its nanny restarts after a SIGKILL).

Functions sent to workers are closures, so cloudpickle ships them by value.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from conftest import spec_text
from procs import finish
from reference import assert_same, load_items, masked_ndvi, reduce_reference

pytestmark = pytest.mark.slow

DASK = str(Path(sys.executable).with_name("dask"))
WORKER_LIMIT = 1_500_000_000
GDAL_CACHE = 96_000_000  # the spec's gdal_cachemax: not GDAL's default (5% of RAM), so a missed setting shows
CHUNKS = "{time: -1, y: 32, x: 32}"  # 64 blocks: enough that a worker dies with work left


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


def _worker_env() -> dict[str, str]:
    # A user's worker environment: none of what a LocalCluster started by rasterflow would put there.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GDAL_", "CPL_", "DASK_", "RASTERFLOW_"))}
    return env


@pytest.fixture(scope="module")
def external(tmp_path_factory):
    """A scheduler and two nanny-managed workers (1 thread, 1.5 GB each) as subprocesses; yields the address."""
    tmp = tmp_path_factory.mktemp("external-cluster")
    scheduler_file = tmp / "scheduler.json"
    log = open(tmp / "cluster.log", "w")
    env = _worker_env()
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen(
            [DASK, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
             "--scheduler-file", str(scheduler_file)],
            cwd=tmp, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        ))
        _wait_for(lambda: scheduler_file.exists() and scheduler_file.stat().st_size > 0, 30, "the scheduler file")
        address = json.loads(scheduler_file.read_text())["address"]
        for i in range(2):
            procs.append(subprocess.Popen(
                [DASK, "worker", "--scheduler-file", str(scheduler_file), "--memory-limit", "1.5GB",
                 "--nthreads", "1", "--no-dashboard", "--local-directory", str(tmp / f"worker-{i}"),
                 "--name", f"w{i}"],
                cwd=tmp, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            ))
        from distributed import Client

        with Client(address, timeout=10) as client:
            client.wait_for_workers(2, timeout=60)
        yield address
    finally:
        for proc in reversed(procs):  # workers (and their nannies) first, then the scheduler
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


def _workers(client) -> dict[str, int]:
    """Worker address -> pid of the worker process (not its nanny)."""
    return client.run(os.getpid)


def _kill_one_and_wait_for_its_successor(client, victim: str, pid: int, timeout: float = 60) -> str:
    """SIGKILL the worker process at ``victim``; its nanny starts a new one: return the new worker's address."""
    before = set(client.scheduler_info(n_workers=-1)["workers"])
    os.kill(pid, signal.SIGKILL)

    def successor():
        now = set(client.scheduler_info(n_workers=-1)["workers"])
        new = now - before
        return next(iter(new)) if victim not in now and new else None

    return _wait_for(successor, timeout, "the nanny to restart the killed worker")


def _settings_probe():
    """What a worker holds of a run's settings (runs in the worker)."""

    def probe():
        import rasterio.env

        from rasterflow.read.policy import current_policy

        return {
            "gdal_cachemax": int(rasterio.env.get_gdal_config("GDAL_CACHEMAX")),
            "curl_cache": os.environ.get("CPL_VSIL_CURL_CACHE_SIZE"),
            "run_id": current_policy().run_id,
        }

    return probe


# ---------------------------------------------------------------------------------------------------------------
# What a run needs reaches existing workers and a worker that joins later
# ---------------------------------------------------------------------------------------------------------------


def test_run_settings_reach_the_workers_and_a_restarted_one(external, sample):
    from rasterflow.cluster import ClusterSettings, open_cluster, remote_layout
    from rasterflow.gdalenv import CURL_CACHE_SIZE
    from rasterflow.read.policy import ReadPolicy, read_monitor

    settings = ClusterSettings(address=external, n_workers="auto", threads_per_worker=1, memory_limit="auto",
                               gdal_cachemax=GDAL_CACHE)
    probe = _settings_probe()
    policy = ReadPolicy(run_id="external-cluster-test")
    from distributed import Client

    with Client(external, timeout=10) as plain:  # what the user's workers hold before rasterflow connects
        untouched = plain.run(probe)
    assert len(untouched) == 2
    assert {v["gdal_cachemax"] for v in untouched.values()} != {GDAL_CACHE}
    assert {v["run_id"] for v in untouched.values()} == {"local"}
    # the read policy is not put on the workers (it travels inside each task: two runs on one cluster each read
    # under their own); the process-wide GDAL settings are
    expected = {"gdal_cachemax": GDAL_CACHE, "curl_cache": str(CURL_CACHE_SIZE), "run_id": "local"}
    with open_cluster(settings, remote_layout(external)) as handle:
        client = handle.client
        with read_monitor(client, policy, []):
            seen = client.run(probe)
            assert set(seen) == set(untouched)
            for worker, values in seen.items():
                assert values == expected, worker
            victim, pid = sorted(_workers(client).items())[0]
            new = _kill_one_and_wait_for_its_successor(client, victim, pid)
            after = client.run(probe)
            assert new in after and victim not in after
            assert after[new] == expected  # a fresh process: it got everything from the plugins at registration
        assert {v["run_id"] for v in client.run(probe).values()} == {"local"}
    # and GDAL's cache size is the workers' own again
    with Client(external, timeout=10) as plain:
        restored = plain.run(probe)
    default = next(iter(untouched.values()))["gdal_cachemax"]
    assert {v["gdal_cachemax"] for v in restored.values()} == {default}


# ---------------------------------------------------------------------------------------------------------------
# `rasterflow run` on the external cluster, a worker SIGKILLed mid-run
# ---------------------------------------------------------------------------------------------------------------


def _spec(sample, tmp_path: Path, name: str, cluster: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(spec_text(sample, reduce="{method: median}", output=f"out/{name}.zarr", chunks=CHUNKS,
                              cluster=cluster))
    return path


def _cli(spec: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rasterflow", "run", str(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    text, _ = finish(proc, timeout)  # a stalled run fails with its stacks and what it printed
    assert proc.returncode == 0, text
    return text


def _values(out: Path) -> np.ndarray:
    with xr.open_zarr(out) as ds:
        return ds["ndvi"].values


def _report(out: Path) -> dict:
    return json.loads(Path(str(out) + ".report.json").read_text())


@pytest.fixture(scope="module")
def local_result(sample, tmp_path_factory):
    """The same job on a LocalCluster started by rasterflow (2 workers x 1 thread), and its NumPy reference."""
    tmp = tmp_path_factory.mktemp("local-run")
    spec = _spec(sample, tmp, "local", "{n_workers: 2, threads_per_worker: 1, memory_limit: 1.5GB, "
                                       f"gdal_cachemax: {GDAL_CACHE}}}")
    _finish(_cli(spec))
    values = _values(tmp / "out" / "local.zarr")
    ids = _report(tmp / "out" / "local.zarr")["item_ids"]
    expected = reduce_reference(masked_ndvi(load_items(sample, ids)), "median")
    assert_same(values, expected)
    return values, ids, expected


def test_a_worker_killed_mid_run_changes_nothing(external, sample, tmp_path, local_result):
    from distributed import Client

    local_values, local_ids, expected = local_result
    spec = _spec(sample, tmp_path, "remote", f"{{address: '{external}', gdal_cachemax: {GDAL_CACHE}}}")
    out = tmp_path / "out" / "remote.zarr"
    done_dir = Path(str(out) + ".partial") / ".rasterflow" / "done"
    with Client(external, timeout=10) as client:
        pids = _workers(client)
        assert len(pids) == 2
        victim, pid = sorted(pids.items())[0]
        proc = _cli(spec, env=_worker_env())  # no DASK_SCHEDULER_ADDRESS: the spec names the scheduler

        def some_blocks_done():
            assert proc.poll() is None, proc.stdout.read().decode()  # the run must still be going
            return done_dir.exists() and sum(1 for p in done_dir.rglob("*") if p.is_file()) >= 4

        _wait_for(some_blocks_done, 90, "the first blocks of the remote run")
        done_at_kill = sum(1 for p in done_dir.rglob("*") if p.is_file())
        successor = _kill_one_and_wait_for_its_successor(client, victim, pid)
        output = _finish(proc)
    assert done_at_kill < 64, "the worker was killed after the job had finished: not mid-run"
    report = _report(out)
    assert report["status"] == "ok", output
    assert report["cluster"]["is_local"] is False and report["cluster"]["address"] == external
    assert report["item_ids"] == local_ids
    values = _values(out)
    np.testing.assert_array_equal(values, local_values)  # bit for bit, NaNs in the same places
    np.testing.assert_array_equal(values, expected)
    # per-worker memory, measured in the remote workers themselves (the killed one until it died)
    peaks = report["measured_peak_per_worker"]
    survivor = next(w for w in pids if w != victim)
    assert {victim, survivor} <= set(peaks) <= {victim, survivor, successor}
    for worker, peak in peaks.items():
        # a real process's RSS with NumPy and rasterflow's reader loaded (no GDAL: the sample's local tiled COGs are
        # decoded by rasterflow; a CI run measured 74 MB), under its limit
        assert 50_000_000 < peak < WORKER_LIMIT, (worker, peak)
    sampled = {s["worker"] for s in report["memory_samples"]}
    assert {victim, survivor} <= sampled


def test_the_scheduler_address_from_the_environment(external, sample, tmp_path, local_result):
    # What a managed cluster's notebook or job script exports (dask-gateway, Coiled, dask-jobqueue set-ups):
    # the spec stays the local one, the environment points it at the cluster.
    local_values, local_ids, _ = local_result
    spec = _spec(sample, tmp_path, "env", f"{{threads_per_worker: 1, gdal_cachemax: {GDAL_CACHE}}}")
    _finish(_cli(spec, env={**_worker_env(), "DASK_SCHEDULER_ADDRESS": external}))
    out = tmp_path / "out" / "env.zarr"
    report = _report(out)
    assert report["cluster"]["is_local"] is False and report["cluster"]["address"] == external
    assert report["memory_limit"] == WORKER_LIMIT  # the budget was checked against the remote workers' limit
    assert report["item_ids"] == local_ids
    np.testing.assert_array_equal(_values(out), local_values)
    # the run removed its plugins: nothing of it stays registered on the user's scheduler
    from distributed import Client

    with Client(external, timeout=10) as client:
        def plugin_names(dask_worker):
            return sorted(name for name in dask_worker.plugins if name.startswith("rasterflow"))

        assert set(map(tuple, client.run(plugin_names).values())) == {()}


def test_a_worker_without_rasterflow_is_refused_before_any_task(external, sample, tmp_path):
    # A real `dask worker` process whose Python cannot import rasterflow (the import is blocked in the process, the
    # one fault injected: a second environment without rasterflow would need its own install of everything else).
    from distributed import Client

    blocked = ("import sys; sys.modules['rasterflow'] = None; "
               "from distributed.cli.dask_worker import main; sys.exit(main())")
    worker = subprocess.Popen(
        [sys.executable, "-c", blocked, external, "--no-nanny", "--nthreads", "1", "--memory-limit", "1.5GB",
         "--no-dashboard", "--name", "without-rasterflow", "--local-directory", str(tmp_path / "w")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_worker_env(), start_new_session=True)
    try:
        with Client(external, timeout=10) as client:
            client.wait_for_workers(3, timeout=60)
            spec = _spec(sample, tmp_path, "refused", f"{{address: '{external}'}}")
            proc = _cli(spec, env=_worker_env())
            text, _ = finish(proc, 120)
            assert proc.returncode == 1, text
            assert "rasterflow 0.1.0" in text and "not importable" in text and "Traceback" not in text, text
            assert not (tmp_path / "out" / "refused.zarr").exists()
            assert not (tmp_path / "out" / "refused.zarr.partial").exists()
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        with Client(external, timeout=10) as client:
            _wait_for(lambda: len(client.scheduler_info(n_workers=-1)["workers"]) == 2, 30, "the extra worker to go")


# ---------------------------------------------------------------------------------------------------------------
# The user's own worker preloads survive on a LocalCluster rasterflow starts (it adds rasterflow.workerinit)
# ---------------------------------------------------------------------------------------------------------------


def test_local_cluster_keeps_the_users_configured_preloads(tmp_path):
    import dask

    from rasterflow.cluster import ClusterSettings, open_cluster
    from rasterflow.sizing import WorkerLayout

    preload = tmp_path / "user_preload.py"
    preload.write_text("def dask_setup(worker):\n    worker.user_preload_ran = True\n")
    settings = ClusterSettings(address=None, n_workers=1, threads_per_worker=1, memory_limit="1GB",
                               gdal_cachemax=GDAL_CACHE)
    layout = WorkerLayout(n_workers=1, threads_per_worker=1, memory_limit=1_000_000_000, source="local")
    with dask.config.set({"distributed.worker.preload": [str(preload)]}):
        with open_cluster(settings, layout) as handle:
            def preloads(dask_worker):
                import signal

                return (getattr(dask_worker, "user_preload_ran", False),
                        signal.getsignal(signal.SIGTERM) == signal.SIG_IGN)  # rasterflow.workerinit ran too

            assert list(handle.client.run(preloads).values()) == [(True, True)]
