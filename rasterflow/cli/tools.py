"""The other verbs: ``profile``, ``schema`` and ``demo``."""

from __future__ import annotations

from pathlib import Path

import click

from rasterflow.cli.console import fail, guarded
from rasterflow.cli.group import global_options, parse_vars, var_option, cli
from rasterflow.cli.running import progress_sink, RunView
from rasterflow.errors import ExitCode


# --------------------------------------------------------------------------------------------------------------------
# profile, schema, demo


@cli.command()
@click.argument("spec", type=click.Path(path_type=Path))
@click.option("--flamegraph", type=click.Path(path_type=Path), default=None,
              help="Write memray's HTML flame graph of the task to this path.")
@click.option("--no-memray", is_flag=True, help="Measure with tracemalloc only.")
@var_option
@global_options
@guarded
def profile(spec: Path, flamegraph: Path | None, no_memray: bool, variables: tuple[str, ...]) -> int:
    """Run one representative task in-process and print measured vs predicted memory."""
    from rasterflow.commands import profile_command
    from rasterflow.spec import load_spec

    loaded = load_spec(spec, variables=parse_vars(variables))
    lines = profile_command(loaded, flamegraph=str(flamegraph) if flamegraph else None, use_memray=not no_memray,
                            emit=RunView(loaded.spec.name).emit)
    for line in lines:
        click.echo(line)
    return ExitCode.OK


@cli.command()
@click.option("--write", "write_path", is_flag=False, flag_value="schemas/rasterflow.schema.json", default=None,
              help="Write the schema to PATH (default schemas/rasterflow.schema.json) instead of printing it.")
@click.option("--check", "check_path", is_flag=False, flag_value="schemas/rasterflow.schema.json", default=None,
              help="Exit 1 when the schema file at PATH is stale.")
@global_options
@guarded
def schema(write_path: str | None, check_path: str | None) -> int:
    """Print or write the JSON Schema of the spec."""
    from rasterflow.spec.schema import schema_text

    text = schema_text()
    if check_path:
        current = Path(check_path).read_text() if Path(check_path).exists() else ""
        if current != text:
            fail(f"{check_path} is stale; regenerate it with: rasterflow schema --write")
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
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="The demo folder: the spec, the sample scenes and the results go there "
              "(default: ./rasterflow-demo).")
@click.option("--spec", "spec_path", type=click.Path(path_type=Path), default=None,
              help="Run this spec instead of the one bundled with rasterflow (its paths are relative to it).")
@click.option("--data", "data_dir", type=click.Path(path_type=Path), default=None,
              help="Where the sample scenes are generated (default: what the demo spec's catalog points at).")
@global_options
@guarded
def demo(out_dir: Path | None, spec_path: Path | None, data_dir: Path | None) -> int:
    """Copy the bundled demo spec into a folder of the current directory (or --out), generate the synthetic sample
    scenes there if missing and run the demo pipeline end to end."""
    from rasterflow.commands import demo_command
    from rasterflow.signals import Interrupts

    view = RunView("demo")
    with Interrupts() as interrupts:
        result = demo_command(spec_path=spec_path, data_dir=data_dir, out_dir=out_dir, emit=view.emit,
                              progress_stream=progress_sink("demo"), interrupts=interrupts)
    return result.exit_code
