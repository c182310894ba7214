"""The thin orchestrator: spec -> search -> plan -> budget -> cluster -> graph -> writer -> report.

Every step is a function of its own module; this one wires them, times them and keeps the run report honest: a
report is written after every run that got as far as knowing its output, successful or not.

Nothing here prints. :func:`run_command` returns a :class:`RunResult` and tells the caller what happens through
``emit(kind, fields)`` events (warnings, the dashboard link, progress, resumed blocks); the CLI renders them, the
Python API (:mod:`rasterflow.api`) hands them to a callback. Errors of the run are recorded in the result (the CLI
maps them to exit codes, the API raises them).

The package is split by job: :mod:`~rasterflow.commands.results` (what the commands return and emit),
:mod:`~rasterflow.commands.planjob` (search and plan), :mod:`~rasterflow.commands.runjob` (the run),
:mod:`~rasterflow.commands.runfiles` (the run's report and traces) and :mod:`~rasterflow.commands.update`
(``if_exists: update``); every public name is re-exported here.
"""

from __future__ import annotations

from rasterflow.commands.results import (
    DEFAULT_STATE_DIR as DEFAULT_STATE_DIR,
    Emit as Emit,
    PlanResult as PlanResult,
    REPO_ROOT as REPO_ROOT,
    RunResult as RunResult,
    TextSink as TextSink,
)
from rasterflow.commands.planjob import (
    ADVICE_TIMEOUT as ADVICE_TIMEOUT,
    assets_applied as assets_applied,
    fingerprint as fingerprint,
    long_for_one_process as long_for_one_process,
    plan_command as plan_command,
    plan_payload as plan_payload,
    plan_with_items as plan_with_items,
    profile_command as profile_command,
    remote_probe as remote_probe,
    resolve_layout as resolve_layout,
    search as search,
)
from rasterflow.commands.runfiles import (
    report_fingerprint as report_fingerprint,
    timer_for as timer_for,
)
from rasterflow.commands.runjob import (
    demo_command as demo_command,
    output_options as output_options,
    run_command as run_command,
)

__all__ = [
    "search", "resolve_layout", "plan_with_items", "plan_command", "plan_payload", "run_command", "profile_command",
    "demo_command", "fingerprint", "RunResult", "PlanResult", "Emit", "TextSink", "DEFAULT_STATE_DIR",
]
