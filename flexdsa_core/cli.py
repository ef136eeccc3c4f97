"""``flexdsa``: the command line. ``flexdsa optimize MODEL --target T -o OUT/`` runs the pipeline locally.

Commands from outside the core (``serve``, ``worker``, ``db``, ``keys``, ``submit``) register through the
``flexdsa.cli`` entry-point group, so this module never imports the service.
"""

from __future__ import annotations

import json
from importlib.metadata import entry_points
from pathlib import Path

import typer

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "flexdsa" / "kernels"

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Flex-DSA: verified ONNX optimisation for edge accelerators.",
)


@app.command()
def optimize(
    model: Path = typer.Argument(..., exists=True, dir_okay=False, help="The ONNX model to optimise."),
    target: str = typer.Option("cpu-ort", "--target", "-t", help="Target name (see `flexdsa targets`)."),
    out: Path = typer.Option(Path("out"), "--out", "-o", help="Folder for the package (created if missing)."),
    objective: str = typer.Option("latency", help="latency, energy or balanced."),
    disable: list[str] = typer.Option(
        [], "--disable", help="Switch a pass or fusion rule off by name (repeatable)."
    ),
    spec: Path | None = typer.Option(
        None, help="A JSON file with more options (same keys as the API's spec)."
    ),
    no_validate: bool = typer.Option(
        False, "--no-validate", help="Skip numerical validation (not recommended)."
    ),
    no_measure: bool = typer.Option(False, "--no-measure", help="Skip the ONNX Runtime latency measurement."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only errors."),
    cache_dir: Path = typer.Option(
        DEFAULT_CACHE_DIR,
        help="Kernel cache folder: measurements made on this machine are reused by later runs.",
    ),
    no_cache: bool = typer.Option(False, "--no-cache", help="Measure everything afresh (no kernel cache)."),
) -> None:
    """Optimise MODEL for TARGET; writes the package (models, manifest, report.json, fusion_plan.json) to OUT."""
    from pydantic import ValidationError
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from flexdsa_core.cache import DiskCache
    from flexdsa_core.errors import FlexDSAError
    from flexdsa_core.optimizer import FlexDSAOptimizer
    from flexdsa_core.options import RequestSpec

    console = Console(stderr=True)
    try:
        extra = json.loads(spec.read_text()) if spec else {}
        request = RequestSpec.model_validate(
            {
                **extra,
                "target": target,
                "objective": objective,
                "disabled_rules": [*extra.get("disabled_rules", []), *disable],
                **({"validate_outputs": False} if no_validate else {}),
                **({"measure_latency": False} if no_measure else {}),
            }
        )
        optimizer = FlexDSAOptimizer(request.target_spec())
        with Progress(
            TextColumn("[bold]{task.fields[stage]:<9}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
            TextColumn("{task.description}"), TimeElapsedColumn(), console=console, disable=quiet, transient=True,
        ) as bar:  # fmt: skip
            task = bar.add_task("", total=1.0, stage="start")

            def progress(stage: str, fraction: float, message: str) -> None:
                bar.update(task, completed=fraction, stage=stage, description=message)

            cache = None if no_cache else DiskCache(cache_dir)
            result = optimizer.optimize(model, request.options(), cache=cache, progress=progress)
        written = result.write(out)
    except ValidationError as err:
        console.print(f"[red]error:[/red] invalid options: {err}")
        raise typer.Exit(2) from None
    except json.JSONDecodeError as err:
        console.print(f"[red]error:[/red] {spec} is not valid JSON: {err}")
        raise typer.Exit(2) from None
    except FlexDSAError as err:
        console.print(f"[red]error ({err.code}):[/red] {err.message}")
        raise typer.Exit(1) from None
    if not quiet:
        Console().print(result.summary(), markup=False, highlight=False)
        Console().print(f"Wrote {len(written)} files to {out}/: {', '.join(p.name for p in written)}")


@app.command()
def targets() -> None:
    """List the built-in targets."""
    from flexdsa_core.targets import list_targets

    for spec in list_targets():
        typer.echo(f"{spec.name:<20} {spec.vendor:<10} {spec.description}")


def _register_plugins() -> None:
    for entry in entry_points(group="flexdsa.cli"):
        try:
            register = entry.load()
        except ImportError:  # a part not installed (or not yet written) simply adds no commands
            continue
        register(app)


def main() -> None:
    _register_plugins()
    app()


if __name__ == "__main__":
    main()
