"""``flexdsa``: the command line. ``flexdsa optimize MODEL --target T -o OUT/`` runs the pipeline locally.

Commands from outside the core (``serve``, ``worker``, ``db``, ``keys``, ``submit``) register through the
``flexdsa.cli`` entry-point group, so this module never imports the service.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import entry_points
from pathlib import Path

import typer

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "flexdsa" / "kernels"
DEFAULT_TOOLCHAINS_DIR = Path.home() / ".cache" / "flexdsa" / "toolchains"

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Flex-DSA: verified ONNX optimisation for edge accelerators.",
)


@app.command()
def optimize(
    model: Path = typer.Argument(..., exists=True, dir_okay=False, help="The ONNX model to optimise."),
    target: str | None = typer.Option(
        None, "--target", "-t", help="Target name (see `flexdsa targets`); default: the --spec file's, else cpu-ort."
    ),
    out: Path = typer.Option(Path("out"), "--out", "-o", help="Folder for the package (created if missing)."),
    objective: str = typer.Option("latency", help="latency, energy or balanced."),
    disable: list[str] = typer.Option(
        [], "--disable", help="Switch a pass or fusion rule off by name (repeatable)."
    ),
    spec: Path | None = typer.Option(
        None, help="A JSON file with more options (same keys as the API's spec)."
    ),
    precision: str | None = typer.Option(
        None, "--precision", help="fp32 (default); int8 or mixed (every target, each in its own format); fp16 (accelerators with "
        "float16).",
    ),
    calibration: Path | None = typer.Option(
        None,
        "--calibration",
        exists=True,
        dir_okay=False,
        help="Calibration samples for --precision: an .npz with one array per model input, samples stacked on the "
        "first axis. Without it, numerics are checked on synthetic inputs (with a warning) and no accuracy is "
        "claimed; an int8-only target (xilinx-kv260) refuses to run without it.",
    ),
    allow_synthetic_calibration: bool = typer.Option(
        False,
        "--allow-synthetic-calibration",
        help="On an int8-only target without --calibration, quantise on seeded random inputs instead of refusing "
        "(numerics only, no accuracy claim; a warning says so).",
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
    toolchains_dir: Path = typer.Option(
        DEFAULT_TOOLCHAINS_DIR, help="Vendor toolchains (`flexdsa toolchains install`); those ready here are run."
    ),
    memory_limit_mb: int | None = typer.Option(
        None,
        "--memory-limit-mb",
        help="Address-space limit of this run in MiB, as the service applies per job (default: 3/4 of this "
        "machine's memory, at most 16384; 0: none). Past it the run ends with a clear message.",
    ),
    buckets: list[str] = typer.Option(
        [], "--buckets", help="shape_buckets: 'seq=32,64' (repeatable, one dim each) or a JSON object."
    ),
    require: list[str] = typer.Option(
        [], "--require",
        help="A gate, as `flexdsa submit --require` takes it: 'speedup>=1.2', 'accuracy>=0.99', 'latency_ms<5', "
        "'bundle_mb<=20', 'cpu_nodes==0' (figures from this run's report; no_regression needs the service's "
        "previous jobs: met here, with nothing to compare). Unmet: exit 3, one line each.",
    ),
    verbose: bool = typer.Option(
        False, "--verbose", "-v",
        help="Show other libraries' warnings (ONNX Runtime, its quantiser) here; by default they go to "
        "~/.cache/flexdsa/logs/optimize.log.",
    ),
) -> None:
    """Optimise MODEL for TARGET; writes the package (models, manifest, report.json, fusion_plan.json) to OUT.

    Exit status: 0 done; 1 the run failed (its reason in one line); 2 the spec was refused before any work (a
    key or value it does not take, calibration samples without a precision that uses them); 3 the package was
    written but missed a --require (one line each)."""
    from flexdsa_core import heap

    heap.tune()  # before the imports: freed memory goes back to the system, not kept as free heap (heap.py)
    from rich.console import Console

    from flexdsa_core.cache import DiskCache
    from flexdsa_core.cli_output import library_output
    from flexdsa_core.optimizer import FlexDSAOptimizer, preload
    from flexdsa_core.spec_check import check_calibration_use

    preload()  # what the job would import on its way
    heap.freeze_imports()  # the libraries are in: the collector's full passes walk the run's objects only
    console = Console(stderr=True)
    memory = _MemoryLimit(memory_limit_mb)
    try:
        request = _request(
            spec, target=target, objective=objective, disable=disable, precision=precision, no_validate=no_validate,
            no_measure=no_measure, allow_synthetic_calibration=allow_synthetic_calibration, buckets=buckets,
            require=require,
        )  # fmt: skip
        check_calibration_use(request, calibration is not None)  # refused, as the API refuses it, not ignored
        optimizer = FlexDSAOptimizer(request.target_spec(), toolchain_root=toolchains_dir)
        with _progress_bar(console, quiet) as progress:
            cache = None if no_cache else DiskCache(cache_dir)
            # From here on, the model's work counts against the limit; other libraries' warnings go to the log
            # (-v: here), and this command prints what the user must know.
            with memory, library_output(cache_dir.parent / "logs" / "optimize.log", verbose=verbose) as library_log:
                result = optimizer.optimize(
                    model, request.options(), cache=cache, progress=progress, calibration=calibration
                )
        written = result.write(out)
    except Exception as err:
        raise typer.Exit(_failed(console, err, spec, cache_dir, memory.limit_mb)) from None
    if not quiet:
        _print_written(console, result, written, out, library_log)
    if request.requirements and _unmet(console, request.requirements, result, written, quiet):
        raise typer.Exit(3)


def _request(spec: Path | None, *, target: str | None, objective: str, disable: list[str], precision: str | None,
             no_validate: bool, no_measure: bool, allow_synthetic_calibration: bool, buckets: list[str],
             require: list[str]):  # fmt: skip
    """The request the options make: the --spec file's keys, the command-line options over them, checked as
    the API checks a request's spec."""
    from flexdsa_core.spec_check import SpecError, parse_buckets, parse_request

    extra = json.loads(spec.read_text()) if spec else {}
    if not isinstance(extra, dict):
        raise SpecError(f"{spec} must hold a JSON object (the request spec), e.g. {{\"precision\": \"int8\"}}.")
    return parse_request(
        {
            **extra,
            "target": target or extra.get("target") or "cpu-ort",
            "objective": objective,
            "disabled_rules": [*extra.get("disabled_rules", []), *disable],
            **({"precision": precision} if precision else {}),
            **({"validate_outputs": False} if no_validate else {}),
            **({"measure_latency": False} if no_measure else {}),
            **({"allow_synthetic_calibration": True} if allow_synthetic_calibration else {}),
            **({"shape_buckets": parse_buckets(buckets)} if buckets else {}),
            **({"requirements": [*extra.get("requirements", []), *require]} if require else {}),
        },
        f"The options (--spec {spec})" if spec else "The options",
    )


@contextmanager
def _progress_bar(console, quiet: bool) -> Iterator[Callable[[str, float, str], None]]:
    """A progress bar on stderr (none when quiet) for the duration; yields the pipeline's progress callback."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]{task.fields[stage]:<9}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
        TextColumn("{task.description}"), TimeElapsedColumn(), console=console, disable=quiet, transient=True,
    ) as bar:  # fmt: skip
        task = bar.add_task("", total=1.0, stage="start")

        def progress(stage: str, fraction: float, message: str) -> None:
            bar.update(task, completed=fraction, stage=stage, description=message)

        yield progress


def _failed(console, error: Exception, spec: Path | None, cache_dir: Path, limit_mb: int | None) -> int:
    """Say in one line why the run failed; the exit status: 2 the spec was refused before any work, 1 the run
    failed (an unexpected failure recorded as an incident under the cache folder)."""
    from pydantic import ValidationError

    from flexdsa_core.errors import FlexDSAError
    from flexdsa_core.spec_check import CalibrationUseError, SpecError

    if isinstance(error, (SpecError, CalibrationUseError)):
        console.print(f"[red]error ({error.code}):[/red] {error.message}", highlight=False, soft_wrap=True)
        return 2
    if isinstance(error, ValidationError):  # a custom target spec in --spec
        from flexdsa_core.spec_check import describe, field_errors

        console.print(f"[red]error (invalid_target):[/red] {describe(field_errors(error))}", highlight=False, soft_wrap=True)
        return 2
    if isinstance(error, json.JSONDecodeError):
        console.print(f"[red]error:[/red] {spec} is not valid JSON: {error}", highlight=False, soft_wrap=True)
        return 2
    if isinstance(error, FlexDSAError):
        console.print(f"[red]error ({error.code}):[/red] {error.message}", soft_wrap=True)
        return 1
    if not _out_of_memory(error):
        incident, path = _record_incident(cache_dir.parent / "incidents")
        console.print(
            f"[red]error (internal_error):[/red] the optimizer failed unexpectedly ({type(error).__name__}); "
            f"incident {incident}, details in {path} (quote it when you report this)",
            highlight=False, soft_wrap=True,
        )  # fmt: skip
        return 1
    console.print(
        f"[red]error (memory_limit_exceeded):[/red] the run needed more memory than --memory-limit-mb "
        f"{limit_mb} allows; give smaller shape_buckets or input_shapes, or raise the limit",
        highlight=False, soft_wrap=True,
    )  # fmt: skip
    return 1


def _print_written(console, result, written: list[Path], out: Path, library_log) -> None:
    """The run's summary and the files written on stdout; on stderr, where the library warnings went."""
    from rich.console import Console

    Console().print(result.summary(), markup=False, highlight=False)
    Console().print(f"Wrote {len(written)} files to {out}/: {', '.join(p.name for p in written)}")
    noise = library_log.lines()
    if noise:
        console.print(f"({noise} lines of library warnings in {library_log.path}; -v shows them here)",
                      style="dim", highlight=False, soft_wrap=True)  # fmt: skip


def _unmet(console, requirements: list[str], result, written: list[Path], quiet: bool) -> bool:
    """Judge the run's requirements as the service judges a job's (``flexdsa_core.requirements``): met ones
    said unless quiet, one line per unmet one; True when one is unmet."""
    from flexdsa_core.compare import comparison_row
    from flexdsa_core.requirements import evaluate, figures, unmet_line

    summary = {**result.report_summary(), "comparison": comparison_row(result.report)}
    bundle = sum(path.stat().st_size for path in written if path.is_file())
    verdicts = evaluate(requirements, figures(summary, bundle), None)
    for verdict in verdicts:
        if not verdict["met"]:
            console.print(f"[red]{unmet_line(verdict)}[/red]", highlight=False, soft_wrap=True)
        elif not quiet:
            console.print(f"requirement met: {verdict['expr']} ({verdict['detail']})", highlight=False, soft_wrap=True)
    return any(not verdict["met"] for verdict in verdicts)


def _limit_memory(limit_mb: int | None) -> tuple[int | None, tuple[int, int] | None]:
    """Cap this process's address space like the service caps a job (soft limit: a vendor toolchain it
    starts may raise it again). None: 3/4 of the machine's memory, at most 16 GiB; 0: no limit. Returns the
    limit in MiB and the limits to restore afterwards (None: nothing was changed)."""
    import os
    import sys

    if limit_mb == 0 or not sys.platform.startswith("linux"):
        return None, None
    if limit_mb is None:
        try:
            physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20
        except (ValueError, OSError):
            return None, None
        limit_mb = min(16384, physical * 3 // 4)
    import resource

    previous = resource.getrlimit(resource.RLIMIT_AS)
    soft, hard = previous
    limit = limit_mb << 20
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if soft != resource.RLIM_INFINITY and soft < limit:  # already tighter (ulimit -v): keep it
        return soft >> 20, None
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return limit_mb, previous


def _restore_memory_limit(previous: tuple[int, int] | None) -> None:
    if previous is not None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, previous)


class _MemoryLimit:
    """``_limit_memory`` for the duration of a with-block, the process's own limits given back after (a caller
    running the CLI in its own process, a test, keeps its address space); ``limit_mb``: the cap in force."""

    def __init__(self, requested_mb: int | None) -> None:
        self.requested_mb = requested_mb
        self.limit_mb: int | None = None
        self._previous: tuple[int, int] | None = None

    def __enter__(self) -> _MemoryLimit:
        self.limit_mb, self._previous = _limit_memory(self.requested_mb)
        return self

    def __exit__(self, *exc_info) -> None:
        _restore_memory_limit(self._previous)


def _out_of_memory(error: BaseException) -> bool:
    """Python's MemoryError, or ONNX Runtime failing an allocation (it raises its own error types)."""
    text = str(error)
    return isinstance(error, MemoryError) or "bad_alloc" in text or "Failed to allocate memory" in text


def _record_incident(folder: Path) -> tuple[str, Path]:
    """A short id and the file holding the current traceback (the service keeps these as incidents)."""
    import traceback
    import uuid

    incident = uuid.uuid4().hex[:12]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{incident}.txt"
    path.write_text(traceback.format_exc())
    return incident, path


@app.command("verify-bundle")
def verify_bundle(
    bundle: Path = typer.Argument(..., help="The bundle: the folder `flexdsa optimize -o` wrote, or a bundle.zip."),
    original: Path | None = typer.Option(
        None, "--original", help="The original ONNX model: every artifact is then held against its outputs."
    ),
    samples: int = typer.Option(8, "--samples", min=1, help="At most this many shipped samples per artifact."),
    as_json: bool = typer.Option(False, "--json", help="Print the checks as JSON."),
) -> None:
    """Check a bundle: run each artifact through its runtime where that runtime is here (ONNX Runtime; the
    rockchip/qualcomm toolchains' simulators), on the bundle's own samples, and hold its outputs against what
    report.json claims. Prints per artifact PASS, FAIL, RAN (nothing comparable to hold it against) or SKIP, with
    the backend, the measured cosine / max diff and the claimed figure.

    Exit status: 0 every checked artifact holds its claim; 1 one falls below it (or failed to run); 2 the bundle is
    missing or unusable; 3 nothing could be checked. The same check runs where the bundle is deployed, without the
    compiler: `python -m flexdsa_runtime verify BUNDLE` (this command runs that, in a process of its own: the
    compiler never imports the runtime)."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "flexdsa_runtime", "verify", str(bundle), "--samples", str(samples)]
    if original is not None:
        command += ["--original", str(original)]
    if as_json:
        command.append("--json")
    raise typer.Exit(subprocess.call(command))


@app.command()
def targets(
    toolchains_dir: Path = typer.Option(DEFAULT_TOOLCHAINS_DIR, help="Where vendor toolchains are installed."),
) -> None:
    """List the built-in targets, how each bundle is checked, and whether its vendor toolchain is ready."""
    from flexdsa_core.targets import describe_checks, list_targets
    from flexdsa_core.toolchains import get_toolchain

    for spec in list_targets():
        typer.echo(f"{spec.name:<20} {spec.vendor:<10} {spec.description}")
        typer.echo(f"{'':<20} checks: {describe_checks(spec, toolchains_dir)}")
        if spec.toolchain:
            typer.echo(f"{'':<20} toolchain: {spec.toolchain}: {_toolchain_state(get_toolchain(spec.toolchain), toolchains_dir)}")
        else:
            typer.echo(f"{'':<20} toolchain: none installable (generated scripts and sourced op tables)")


def _toolchain_state(toolchain, root: Path) -> str:
    """``ready (rknn-toolkit2 2.3.2)`` or why not (``not installed: run `flexdsa toolchains install ...```)."""
    status = toolchain.status(root)
    versions = ", ".join(f"{k} {v}" for k, v in status.versions.items())
    return f"ready ({versions})" if status.ready else status.detail


toolchains_app = typer.Typer(
    help="Vendor compilers, each in a virtual environment of its own.", invoke_without_command=True
)
app.add_typer(toolchains_app, name="toolchains")


@toolchains_app.callback()
def toolchains_status(
    ctx: typer.Context,
    root: Path = typer.Option(DEFAULT_TOOLCHAINS_DIR, "--root", help="Where the environments live."),
) -> None:
    """Show which vendor toolchains are ready (with no sub-command)."""
    if ctx.invoked_subcommand is not None:
        return
    _print_toolchains(root)


@toolchains_app.command("status")
def toolchains_status_command(
    root: Path = typer.Option(DEFAULT_TOOLCHAINS_DIR, "--root", help="Where the environments live."),
) -> None:
    """Each vendor toolchain, its targets, and its state: ready with its versions, or what to run."""
    _print_toolchains(root)


def _print_toolchains(root: Path) -> None:
    from flexdsa_core.toolchains import discover_toolchains

    for toolchain in discover_toolchains().values():
        typer.echo(f"{toolchain.name:<10} {', '.join(toolchain.targets):<36} {_toolchain_state(toolchain, root)}")


@toolchains_app.command("install")
def toolchains_install(
    names: list[str] = typer.Argument(..., help="Toolchains to install (see `flexdsa toolchains`), or 'all'."),
    root: Path = typer.Option(DEFAULT_TOOLCHAINS_DIR, "--root", help="Where the environments live."),
    force: bool = typer.Option(False, "--force", help="Reinstall even when the toolchain is ready."),
) -> None:
    """Create each toolchain's environment and install its pinned vendor packages (minutes each)."""
    from flexdsa_core.toolchains import ToolchainError, discover_toolchains, get_toolchain

    chosen = list(discover_toolchains()) if names == ["all"] else names
    try:
        for name in chosen:
            toolchain = get_toolchain(name)
            if toolchain.is_ready(root) and not force:
                typer.echo(f"{name}: ready (use --force to reinstall)")
                continue
            status = toolchain.install(root, log=typer.echo)
            typer.echo(f"{name}: {'ready' if status.ready else status.detail}")
    except ToolchainError as err:
        typer.echo(f"error: {err.message}", err=True)
        raise typer.Exit(1) from None


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
