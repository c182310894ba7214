"""The command line: ``rasterflow validate | plan | run | schema | demo``.

This is the only module that turns errors into exit codes. User mistakes print a message and no traceback
(``--debug`` shows it); anything unexpected is a failed run (exit 1) with a pointer to ``--debug``.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Callable

import click

from rasterflow import __version__
from rasterflow.errors import ExitCode, RasterflowError

__all__ = ["main", "cli"]


class _State:
    debug = False


def _fail(message: str) -> None:
    click.secho(message, fg="red", err=True)


def _guarded(func: Callable[..., int]) -> Callable[..., None]:
    """Run a command body; map its return value and errors to the process exit code."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            code = func(*args, **kwargs)
        except RasterflowError as err:
            if _State.debug:
                raise
            _fail(str(err))
            code = err.exit_code
        except KeyboardInterrupt:
            _fail("interrupted")
            code = 130
        except Exception as err:  # an internal error, not the user's: say so and keep the message
            if _State.debug:
                raise
            _fail(f"internal error: {type(err).__name__}: {err}\n(rerun with --debug for the traceback)")
            code = ExitCode.RUN_FAILED
        sys.exit(int(code or 0))

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rasterflow")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
def cli(debug: bool) -> None:
    """rasterflow: declarative raster pipelines on Dask, checked against memory before a pixel is read."""
    _State.debug = debug


@cli.command()
@click.argument("specs", nargs=-1, required=True, type=click.Path(path_type=Path))
@_guarded
def validate(specs: tuple[Path, ...]) -> int:
    """Parse and validate SPEC files and run the static budget check (no network).

    Exit code: 0 all valid, 2 some invalid, 3 some over budget (the highest code of all files).
    """
    from rasterflow.spec import load_spec

    worst = ExitCode.OK
    for path in specs:
        try:
            loaded = load_spec(path)
            verdict = _static_budget_line(loaded)
        except RasterflowError as err:
            _fail(str(err))
            worst = max(worst, err.exit_code)
            continue
        click.echo(f"ok   {path}{verdict}")
    return worst


def _static_budget_line(loaded) -> str:
    """Run the static budget check; raises BudgetExceededError when over budget."""
    from rasterflow.plan import static_check

    report = static_check(loaded)
    for warning in report.warnings:
        click.secho(f"warn {loaded.path}: {warning}", fg="yellow", err=True)
    if loaded.spec.cluster.address:
        # validate never touches the network: the real workers' limits are checked by plan and run
        return f"  (peak per worker {report.summary}; limit sized for this machine, plan checks the cluster's)"
    return f"  (peak per worker {report.summary})"


@cli.command()
@click.argument("spec", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON for scripts.")
@click.option("--fix", is_flag=True, help="Print a corrected chunks/cluster block ready to paste.")
@_guarded
def plan(spec: Path, as_json: bool, fix: bool) -> int:
    """Search the catalog (metadata only), resolve the grid and print the plan and memory budget."""
    from rasterflow.spec import load_spec

    loaded = load_spec(spec)
    try:
        from rasterflow.run import plan_command
    except ImportError:
        _fail("plan is not available in this build yet")
        return ExitCode.RUN_FAILED
    return plan_command(loaded, as_json=as_json, fix=fix)


@cli.command()
@click.argument("specs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--report", "report_path", type=click.Path(path_type=Path), help="Where to write the run report JSON.")
@click.option("--plot", is_flag=True, help="Save a PNG of worker memory over time next to the report.")
@_guarded
def run(specs: tuple[Path, ...], report_path: Path | None, plot: bool) -> int:
    """Plan, check, compute and write each SPEC; write a run report for each."""
    from rasterflow.spec import load_spec

    try:
        from rasterflow.run import run_command
    except ImportError:
        _fail("run is not available in this build yet")
        return ExitCode.RUN_FAILED
    worst = ExitCode.OK
    for path in specs:
        try:
            loaded = load_spec(path)
            code = run_command(loaded, report_path=report_path if len(specs) == 1 else None, plot=plot)
        except RasterflowError as err:
            if _State.debug:
                raise
            _fail(str(err))
            code = err.exit_code
        worst = max(worst, code)
    return worst


@cli.command()
@click.argument("spec", type=click.Path(path_type=Path))
@click.option("--flamegraph", type=click.Path(path_type=Path), default=None,
              help="Write memray's HTML flame graph of the task to this path.")
@click.option("--no-memray", is_flag=True, help="Measure with tracemalloc only.")
@_guarded
def profile(spec: Path, flamegraph: Path | None, no_memray: bool) -> int:
    """Run one representative task in-process and print measured vs predicted memory."""
    from rasterflow.run import profile_command
    from rasterflow.spec import load_spec

    return profile_command(load_spec(spec), flamegraph=str(flamegraph) if flamegraph else None,
                           use_memray=not no_memray)


@cli.command()
@click.option("--write", "write_path", is_flag=False, flag_value="schemas/rasterflow.schema.json", default=None,
              help="Write the schema to PATH (default schemas/rasterflow.schema.json) instead of printing it.")
@click.option("--check", "check_path", is_flag=False, flag_value="schemas/rasterflow.schema.json", default=None,
              help="Exit 1 when the schema file at PATH is stale.")
@_guarded
def schema(write_path: str | None, check_path: str | None) -> int:
    """Print or write the JSON Schema of the spec."""
    from rasterflow.spec.schema import schema_text

    text = schema_text()
    if check_path:
        current = Path(check_path).read_text() if Path(check_path).exists() else ""
        if current != text:
            _fail(f"{check_path} is stale; regenerate it with: rasterflow schema --write")
            return ExitCode.RUN_FAILED
        click.echo(f"{check_path} is up to date")
        return ExitCode.OK
    if write_path:
        Path(write_path).parent.mkdir(parents=True, exist_ok=True)
        Path(write_path).write_text(text)
        click.echo(f"wrote {write_path}")
        return ExitCode.OK
    click.echo(text, nl=False)
    return ExitCode.OK


@cli.command()
@click.option("--spec", "spec_path", type=click.Path(path_type=Path), default=None,
              help="The demo spec (default: pipelines/demo.yaml next to the package, or the bundled copy).")
@click.option("--data", "data_dir", type=click.Path(path_type=Path), default=None,
              help="Where the sample scenes are generated (default: what the demo spec's catalog points at).")
@_guarded
def demo(spec_path: Path | None, data_dir: Path | None) -> int:
    """Generate the synthetic sample scenes if missing and run the demo pipeline end to end."""
    try:
        from rasterflow.run import demo_command
    except ImportError:
        _fail("demo is not available in this build yet")
        return ExitCode.RUN_FAILED
    return demo_command(spec_path=spec_path, data_dir=data_dir)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="rasterflow")
