"""``flexdsa submit``: send a model to a Flex-DSA server, follow the job, fetch its artifacts.

    flexdsa submit model.onnx --target cpu-ort --server http://host:8000 --wait -o out/
    flexdsa submit model.onnx --targets all --server http://host:8000        # which chip? compared

With ``--targets a,b,c`` (or ``all``) the server makes one job group, one job per target; submit then
follows the group (``GET /groups/{id}``) until every job has ended, prints the comparison table (each figure
with its source), and with ``-o`` downloads each target's artifacts into ``OUT/<target>/``.

Posts to ``/optimize`` (the model, ``--calibration`` samples, and a spec JSON built from ``--spec FILE`` and
the options: every key of the API's spec has its flag or goes in the file), then, with ``--wait`` or ``-o``,
polls ``GET /jobs/{id}`` under a progress bar until the job ends and downloads every artifact (just
``bundle.zip``, unpacked, when the server offers one) into OUT. The spec is read with the API's own reader
(``flexdsa_core.spec_check``) before anything is uploaded, so a typo is refused at once with the API's sentence.

Gates (``--require``, the spec's ``requirements``) are judged by the server when the job ends
(``flexdsa_core.requirements``); the job succeeds either way, and this command says which requirement was not
met, with its figure, and exits 3. Exit status (``EXIT``): 0 the job succeeded (or was queued, without
``--wait``) and met its requirements; 1 it failed or was cancelled (its error is printed); 2 the request was
refused or the server could not be reached; 3 it succeeded but missed a requirement.

Every error is one line with its fix, in this command's terms (``--api-key``, not the header). This is a client:
it talks HTTP only, and reads the key from ``--api-key`` or ``FLEXDSA_API_KEY``.
"""

from __future__ import annotations

import json
import time
import zipfile
from pathlib import Path, PurePosixPath
from typing import Annotated
from urllib.parse import quote

import typer

API_KEY_HEADER = "X-API-Key"
TERMINAL = {"succeeded", "failed", "cancelled"}
POLL_S = 0.5
BUNDLE = "bundle.zip"
EXIT = {"ok": 0, "job_failed": 1, "refused": 2, "requirement_not_met": 3}
# A job's report warnings printed per job; the rest are in its report.json.
WARNINGS_SHOWN = 5


class ClientError(Exception):
    """The server refused a request or could not be reached; the message says which and why."""


def _error_message(response) -> str:
    """The server's error as one line, in this command's terms: ``message (code, HTTP status)``, a refused
    spec's field errors folded in, and the flag that fixes it where the server names a header or a field."""
    from flexdsa_core.spec_check import one_line

    try:
        error = response.json()["error"]
        code, message, details = error["code"], error["message"], error.get("details")
    except Exception:
        return f"HTTP {response.status_code}: {' '.join(response.text[:300].split())}"
    if code == "missing_api_key":  # the API names its header; here the key is a flag
        message = (
            "This server requires an API key: pass --api-key KEY (or set FLEXDSA_API_KEY). Make one with "
            "`flexdsa keys create --tenant NAME` against the server's database."
        )
    text = one_line(message, details if isinstance(details, list) else None)
    hint = "(The key came from --api-key or FLEXDSA_API_KEY.)" if code == "invalid_api_key" else ""
    return f"{text} ({code}, HTTP {response.status_code})" + (f" {hint}" if hint else "")


class Client:
    """The few calls ``submit`` makes, over one httpx connection pool."""

    def __init__(self, server: str, api_key: str | None, timeout_s: float = 60.0) -> None:
        import httpx

        headers = {API_KEY_HEADER: api_key} if api_key else {}
        self.http = httpx.Client(base_url=server.rstrip("/"), headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, url: str, **kwargs):
        import httpx

        try:
            response = self.http.request(method, url, **kwargs)
        except httpx.HTTPError as err:
            raise ClientError(f"Cannot reach {self.http.base_url}: {err}") from None
        if response.status_code >= 400:
            raise ClientError(_error_message(response))
        return response

    def submit(
        self, model: Path, spec: dict, idempotency_key: str | None = None, calibration: Path | None = None
    ) -> dict:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        with model.open("rb") as handle, (calibration or model).open("rb") as samples:
            files = {"model": (model.name, handle, "application/octet-stream")}
            if calibration is not None:
                files["calibration"] = (calibration.name, samples, "application/octet-stream")
            return self._call(
                "POST", "/optimize", files=files, data={"spec": json.dumps(spec)}, headers=headers
            ).json()

    def get_json(self, path: str, **params) -> dict:
        return self._call("GET", path, params={k: v for k, v in params.items() if v is not None}).json()

    def send_json(self, method: str, path: str, body: dict) -> dict:
        return self._call(method, path, json=body).json()

    def job(self, job_id: str) -> dict:
        return self._call("GET", f"/jobs/{job_id}").json()

    def group(self, group_id: str) -> dict:
        return self._call("GET", f"/groups/{group_id}").json()

    def artifacts(self, job_id: str) -> list[dict]:
        return self._call("GET", f"/jobs/{job_id}/artifacts").json()["items"]

    def download(self, job_id: str, name: str, dest: Path) -> int:
        """Fetch one artifact into ``dest``. A 307 (the server's object store presigns downloads) is
        followed by hand, to the store, without the API key; the bytes are checked against the response's
        ``Repr-Digest`` (sha-256) when the server sends one, and a file in OUT is always complete."""
        import httpx

        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(dest.name + ".part")
        try:
            with self.http.stream("GET", f"/jobs/{job_id}/artifacts/{quote(name)}") as response:
                if response.status_code >= 400:
                    response.read()
                    raise ClientError(f"Downloading {name}: {_error_message(response)}")
                expected = _sha256_of_digest(response.headers.get("repr-digest"))
                if response.is_redirect:
                    location = str(response.url.join(response.headers["location"]))
                    with httpx.stream("GET", location, timeout=self.http.timeout) as stored:
                        if stored.status_code >= 400:
                            stored.read()
                            raise ClientError(f"Downloading {name} from the artifact store: HTTP {stored.status_code}")
                        actual = _save(stored, partial)
                else:
                    actual = _save(response, partial)
        except httpx.HTTPError as err:
            partial.unlink(missing_ok=True)
            raise ClientError(f"Downloading {name} failed: {err}") from None
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        if expected is not None and actual != expected:
            partial.unlink(missing_ok=True)
            raise ClientError(
                f"Downloading {name}: the bytes received do not match the server's sha256 ({actual[:12]}... "
                f"instead of {expected[:12]}...); nothing was written. Try again; if it persists, tell the operator."
            )
        partial.replace(dest)
        return dest.stat().st_size


def _save(response, path: Path) -> str:
    """Write a response's body to ``path``; its sha256."""
    import hashlib

    digest = hashlib.sha256()
    with path.open("wb") as out:
        for chunk in response.iter_bytes(1024 * 1024):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def _sha256_of_digest(header: str | None) -> str | None:
    """The hex sha-256 in an RFC 9530 ``Repr-Digest`` header (``sha-256=:<base64>:``), or None."""
    import base64
    import binascii

    for item in (header or "").split(","):
        algorithm, _, value = item.strip().partition("=")
        if algorithm.lower() == "sha-256" and value.startswith(":") and value.endswith(":"):
            try:
                return base64.b64decode(value[1:-1], validate=True).hex()
            except (binascii.Error, ValueError):
                return None
    return None


def build_spec(
    target: str | None,
    spec_file: Path | None,
    objective: str | None,
    disable: list[str],
    targets: str | None = None,
    **options,
) -> dict:
    """The request spec: the file's keys, then the command line's (``--target``/``--targets`` always win).
    ``options``: the other flags' keys of the spec (``precision``, ``shape_buckets``, ``model_name``,
    ``requirements``, ``allow_synthetic_calibration``), None or empty where not given."""
    spec: dict = {}
    if spec_file is not None:
        try:
            spec = json.loads(spec_file.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ClientError(f"Cannot read the spec file {spec_file}: {err}") from None
        if not isinstance(spec, dict):
            raise ClientError(f"{spec_file} must hold a JSON object (the request spec).")
    if target is not None and targets is not None:
        raise ClientError("Give --target (one) or --targets (several to compare), not both.")
    if target is None and targets is None and not ("target" in spec or "targets" in spec):
        raise ClientError("Name one target with --target, or several to compare with --targets a,b,c (or all).")
    if target is not None and target.strip().lower() == "all":
        raise ClientError("--target names one target: to compare every target, use --targets all.")
    if targets is not None:
        spec.pop("target", None)
        names = [name.strip() for name in targets.split(",") if name.strip()]
        spec["targets"] = "all" if names == ["all"] else names
    elif target is not None:
        spec.pop("targets", None)
        spec["target"] = target
    if objective:
        spec["objective"] = objective
    if disable:
        spec["disabled_rules"] = sorted({*spec.get("disabled_rules", []), *disable})
    requirements = options.pop("requirements", None)
    if requirements:
        spec["requirements"] = [*spec.get("requirements", []), *requirements]
    spec.update({key: value for key, value in options.items() if value not in (None, False, {}, [])})
    return spec


def check_spec(spec: dict, calibration: Path | None) -> None:
    """The refusals the API makes from the spec alone, made here before a byte is uploaded and in the API's
    words (``flexdsa_core.spec_check``): keys it does not take (with "did you mean"), values out of range,
    requirements it cannot read, calibration samples without a precision that uses them."""
    from flexdsa_core.errors import InvalidOptionsError
    from flexdsa_core.spec_check import check_calibration_use, parse_request

    single = {key: value for key, value in spec.items() if key != "targets"}
    if "targets" in spec or isinstance(single.get("target"), str):
        single["target"] = "cpu-ort"  # the names are the server's to check, against its own targets
    try:
        check_calibration_use(parse_request(single, "The spec"), calibration is not None)
    except InvalidOptionsError as err:
        raise ClientError(f"{err.message} ({err.code})") from None


def safe_destination(out: Path, name: str) -> Path:
    """Where artifact ``name`` goes under ``out``; a name that would leave ``out`` is refused."""
    parts = PurePosixPath(name).parts
    if not parts or PurePosixPath(name).is_absolute() or any(p in ("..", "") for p in parts) or "\\" in name:
        raise ClientError(f"Refusing artifact name {name!r}: it would be written outside {out}.")
    return out.joinpath(*parts)


def wait_for(client: Client, job_id: str, quiet: bool, timeout_s: float | None) -> dict:
    """Poll until the job ends, under a progress bar that shows the stage."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    deadline = time.monotonic() + timeout_s if timeout_s else None
    columns = (
        TextColumn("[bold]{task.fields[status]:<9}"), TextColumn("{task.fields[stage]:<9}"), BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
    )  # fmt: skip
    with Progress(*columns, console=Console(stderr=True), disable=quiet, transient=True) as bar:
        task = bar.add_task("", total=1.0, status="queued", stage="")
        while True:
            job = client.job(job_id)
            bar.update(task, completed=job["progress"], status=job["status"], stage=job["stage"] or "")
            if job["status"] in TERMINAL:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise ClientError(
                    f"Job {job_id} is still {job['status']} after {timeout_s:.0f} s; follow it with "
                    f"GET /jobs/{job_id}, or run submit again with a longer --timeout."
                )
            time.sleep(POLL_S)


def fetch_artifacts(client: Client, job_id: str, out: Path) -> list[Path]:
    """Every artifact into ``out``; when the server offers bundle.zip, that alone, unpacked."""
    items = client.artifacts(job_id)
    names = [item["name"] for item in items]
    out.mkdir(parents=True, exist_ok=True)
    if BUNDLE in names:
        bundle = safe_destination(out, BUNDLE)
        client.download(job_id, BUNDLE, bundle)
        with zipfile.ZipFile(bundle) as archive:
            members = [m for m in archive.namelist() if not m.endswith("/")]
            for member in members:
                safe_destination(out, member)  # check every name before writing any
            archive.extractall(out, members)
        return [bundle, *(out / m for m in members)]
    written = []
    for name in names:
        destination = safe_destination(out, name)
        client.download(job_id, name, destination)
        written.append(destination)
    return written


def submit(
    model: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="The ONNX model to send.")],
    target: Annotated[
        str | None, typer.Option("--target", "-t", help="Target name (GET /targets on the server).")
    ] = None,
    targets: Annotated[
        str | None,
        typer.Option(
            "--targets",
            help="Compare several targets: comma-separated names, or 'all'. Waits and prints the comparison.",
        ),
    ] = None,
    server: Annotated[
        str, typer.Option(envvar="FLEXDSA_SERVER", help="Server base URL (or FLEXDSA_SERVER).")
    ] = "http://127.0.0.1:8000",
    api_key: Annotated[
        str | None,
        typer.Option(envvar="FLEXDSA_API_KEY", show_default=False, help="API key (or FLEXDSA_API_KEY)."),
    ] = None,
    spec: Annotated[
        Path | None,
        typer.Option(
            exists=True, dir_okay=False, help="JSON file with more request options (any key of the API's spec)."
        ),
    ] = None,
    objective: Annotated[str | None, typer.Option(help="latency, energy or balanced.")] = None,
    precision: Annotated[
        str | None,
        typer.Option(help="fp32 (default); int8 or mixed (every target, each in its own format); fp16 (accelerators)."),
    ] = None,
    calibration: Annotated[
        Path | None,
        typer.Option(
            exists=True, dir_okay=False,
            help="Calibration samples sent with the model: an .npz with one array per model input, samples stacked "
            "on the first axis (with --precision int8, mixed or fp16). Without shape buckets, shapes they give "
            "become the buckets.",
        ),
    ] = None,
    allow_synthetic_calibration: Annotated[
        bool,
        typer.Option(
            "--allow-synthetic-calibration",
            help="An int8-only target (xilinx-kv260) without --calibration: quantise on seeded random inputs "
            "instead of being refused (numerics only, no accuracy claim; a warning says so).",
        ),
    ] = False,
    buckets: Annotated[
        list[str] | None,
        typer.Option("--buckets", help="shape_buckets: 'seq=32,64' (repeatable, one dim each) or a JSON object."),
    ] = None,
    model_name: Annotated[
        str | None,
        typer.Option(help="The model this job is a version of (default: MODEL's file name without .onnx); a job "
                     "is compared with the previous successful job of this model on the same target."),
    ] = None,
    require: Annotated[
        list[str] | None,
        typer.Option(
            "--require",
            help="A gate (repeatable; implies --wait): 'speedup>=1.2' (the headline speed-up over the fp32 "
            "original: measured on this CPU for cpu-ort, estimated elsewhere), 'accuracy>=0.99' (the worst "
            "accuracy figure the report states: vendor simulator, else held-out samples; an fp32 job checked "
            "numerically only has none), 'latency_ms<5', 'bundle_mb<=20', 'cpu_nodes==0', or 'no_regression' "
            "(no figure worse than this model's previous successful job on the target). Unmet: the job still "
            "succeeds, and this command prints one line per unmet requirement and exits 3.",
        ),
    ] = None,
    disable: Annotated[
        list[str] | None, typer.Option("--disable", help="Switch a fusion rule off by name (repeatable).")
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Follow the job until it ends.")] = False,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Download the artifacts here (implies --wait).")
    ] = None,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Retries with the same key return the same job.")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(help="Give up waiting after this many seconds (default: never).")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the job id and errors.")] = False,
    refresh: Annotated[
        bool, typer.Option("--refresh", help="Run again even if an identical earlier job could answer.")
    ] = False,
    cache: Annotated[
        str | None,
        typer.Option(help="use (default): an identical earlier job answers at once; refresh: same as --refresh."),
    ] = None,
) -> None:
    """Submit MODEL to a Flex-DSA server; with --wait/-o follow it and download its artifacts.

    Exit status: 0 succeeded (or queued, without --wait) and met every --require; 1 the job (or a target of
    --targets) failed or was cancelled; 2 the request was refused or the server could not be reached; 3 the
    job succeeded but missed a --require (one line each, with its figure)."""
    from rich.console import Console

    from flexdsa_core.spec_check import SpecError, parse_buckets

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    client = None
    try:
        try:
            shape_buckets = parse_buckets(buckets) if buckets else None
        except SpecError as err:
            raise ClientError(err.message) from None
        request = build_spec(
            target, spec, objective, disable or [], targets, precision=precision, shape_buckets=shape_buckets,
            model_name=model_name, requirements=require or [], allow_synthetic_calibration=allow_synthetic_calibration,
        )  # fmt: skip
        if refresh or cache:
            request["cache"] = "refresh" if refresh else cache
        check_spec(request, calibration)  # the API's refusals, before the upload
        client = Client(server, api_key)
        created = client.submit(model, request, idempotency_key, calibration)
        follow = bool(wait or out or request.get("requirements"))  # a gate needs the result
        if "group_id" in created:
            raise typer.Exit(_follow_group(client, console, created, server, out, quiet, timeout))
        _follow_job(client, console, created, server, out, quiet, timeout, follow)
    except ClientError as err:
        console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(EXIT["refused"]) from None
    finally:
        if client is not None:
            client.close()


def _follow_job(
    client: Client, console, created: dict, server: str, out: Path | None, quiet: bool, timeout: float | None,
    follow: bool,
) -> None:
    """``submit``'s one-target part once the server took the job: print its id and status URL; with ``follow``,
    wait for it to end, print the outcome and its figures, download the artifacts to ``out`` and exit with
    the status ``submit``'s docstring gives (an unmet requirement: 3)."""
    job_id = created["job_id"]
    typer.echo(job_id)
    if not quiet:
        cached = " (answered from an identical earlier job)" if created.get("cached") else ""
        console.print(
            f"Job {job_id}: {created['status']}{cached}. Status: {server.rstrip('/')}{created['status_url']}"
        )
    if not follow:
        return
    if created["status"] in TERMINAL:  # a cached answer: already done
        job = client.job(job_id)
    else:
        job = wait_for(client, job_id, quiet, timeout)
    if job["status"] != "succeeded":
        error = job.get("error") or {}
        console.print(
            f"[red]Job {job_id} {job['status']}[/red]"
            + (f" ({error.get('code')}): {error.get('message')}" if error else "")
        )
        raise typer.Exit(EXIT["job_failed"])
    if not quiet:
        summary = job.get("report_summary") or {}
        if summary.get("nodes_before") is not None:
            console.print(
                f"Succeeded: nodes {summary['nodes_before']} -> {summary['nodes_after']}{_speed_text(summary)}."
            )
        for line in figure_lines(summary):
            console.print(line, markup=False)
        _print_job_notes(console, job)
    if out is not None:
        written = fetch_artifacts(client, job_id, out)
        if not quiet:
            console.print(f"Wrote {len(written)} files to {out}/: {', '.join(p.name for p in written)}")
    if _print_unmet(console, job):
        raise typer.Exit(EXIT["requirement_not_met"])


def _print_job_notes(console, job: dict, prefix: str = "") -> None:
    """The job's report warnings (the first few), its comparison with the previous job of its model, and its
    requirements that were met."""
    warnings = (job.get("report_summary") or {}).get("warnings") or []
    for warning in warnings[:WARNINGS_SHOWN]:
        console.print(f"{prefix}[yellow]warning:[/yellow] {' '.join(str(warning).split())}")
    if len(warnings) > WARNINGS_SHOWN:
        console.print(f"{prefix}... and {len(warnings) - WARNINGS_SHOWN} more warnings in report.json")
    previous = job.get("previous")
    if previous:
        console.print(f"{prefix}{previous_line(previous, job.get('model_name'))}")
    for verdict in job.get("requirements") or []:
        if verdict["met"]:
            console.print(f"{prefix}requirement met: {verdict['expr']} ({verdict['detail']})")


def previous_line(previous: dict, model_name: str | None) -> str:
    """``vs job 1a2b3c4d (model bert): latency_ms 0.52 -> 0.5 (-3.8%), ...``: each figure, previous -> this."""
    parts = []
    for row in previous["rows"]:
        if row["current"] is None and row["previous"] is None:
            continue
        change = ""
        if row["change"] is not None:
            change = f" ({row['change']:+.1%})" if row["figure"] in ("latency_ms", "bundle_mb") else f" ({row['change']:+g})"
        mark = " REGRESSED" if row["regressed"] else ""
        parts.append(f"{row['figure']} {_figure(row['previous'])} -> {_figure(row['current'])}{change}{mark}")
    return f"vs job {previous['job_id'][:8]} (previous of model {model_name!r}): " + ", ".join(parts)


def _figure(value) -> str:
    return "-" if value is None else f"{value:.4g}"


def _print_unmet(console, job: dict, prefix: str = "") -> bool:
    """One line per unmet requirement; True when there was one."""
    from flexdsa_core.requirements import unmet_line

    unmet = [verdict for verdict in job.get("requirements") or [] if not verdict["met"]]
    for verdict in unmet:
        console.print(f"{prefix}[red]{unmet_line(verdict)}[/red]")
    return bool(unmet)


def figure_lines(summary: dict) -> list[str]:
    """The job's figures as its report gives them (``report_summary["figures"]``): per bucket its latency and
    energy, then the accuracy of the model that ships and what the validation compared."""
    figures = summary.get("figures")
    if not isinstance(figures, dict) or "per_bucket" not in figures:  # a job from before figures were kept
        return []
    lines = []
    for bucket, found in (figures.get("per_bucket") or {}).items():
        lines.append(f"latency [{bucket}]: {found['latency']['label']}")
        lines.append(f"energy [{bucket}]: {found['energy']['label']}")
    lines.append(f"accuracy: {figures['accuracy']['label']}")
    if figures.get("validation"):
        lines.append(f"validation: {figures['validation']['text']}")
    return lines


def _speed_text(summary: dict) -> str:
    """The job's speed figure with its source: the report's headline; for a job recorded before headlines,
    the vendor's own measure beside the vendor alone for an accelerator, ONNX Runtime on the compiling
    machine only where that machine is the target (cpu-ort)."""
    top = summary.get("headline")
    if top:  # the job's one speed-up, as the report, the API and the dashboard give it
        return f"; speed-up: {top['text']}"
    vendor = summary.get("vendor") or {}
    parts = [
        f"[{bucket}] {row['ratio']:.3f}x the vendor alone ({row['ours']:,.0f} vs {row['vendor_alone']:,.0f} cycles)"
        for bucket, row in (vendor.get("buckets") or {}).items()
        if row.get("ratio") is not None
    ]
    if parts:
        return f", {vendor.get('tool')} estimate: " + "; ".join(parts)
    if summary.get("target") == "cpu-ort" and summary.get("speedup"):
        return f", {summary['speedup']:.2f}x the original in ONNX Runtime on the compiling machine"
    return ""


def wait_for_group(client: Client, group_id: str, quiet: bool, timeout_s: float | None) -> dict:
    """Poll the group until every job has ended, under a bar counting the ended jobs."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    deadline = time.monotonic() + timeout_s if timeout_s else None
    columns = (TextColumn("[bold]{task.fields[status]:<9}"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f} targets"),
               TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=Console(stderr=True), disable=quiet, transient=True) as bar:
        task = bar.add_task("", total=1, status="queued")
        while True:
            group = client.group(group_id)
            ended = sum(job["status"] in TERMINAL for job in group["jobs"])
            bar.update(task, total=len(group["jobs"]), completed=ended, status=group["status"])
            if group["status"] not in ("queued", "running"):
                return group
            if deadline is not None and time.monotonic() > deadline:
                raise ClientError(
                    f"Group {group_id} is still {group['status']} after {timeout_s:.0f} s; follow it with "
                    f"GET /groups/{group_id}, or run submit again with a longer --timeout."
                )
            time.sleep(POLL_S)


def _follow_group(client: Client, console, created: dict, server: str, out: Path | None, quiet: bool,
                  timeout: float | None) -> int:  # fmt: skip
    """The --targets path: print the group id, wait for every job, print the comparison, fetch bundles;
    each target's warnings and requirements. Returns the exit status."""
    from flexdsa_core.compare import render_comparison

    group_id = created["group_id"]
    typer.echo(group_id)
    if not quiet:
        console.print(
            f"Comparing {len(created['jobs'])} targets: group {group_id}. Status: {server.rstrip('/')}{created['status_url']}"
        )
    group = wait_for_group(client, group_id, quiet, timeout)
    typer.echo(render_comparison(group["comparison"]))
    unmet = False
    for member in group["jobs"]:
        if member["status"] != "succeeded":
            continue
        job = client.job(member["job_id"])
        if not quiet:
            _print_job_notes(console, job, prefix=f"{member['target']}: ")
        unmet = _print_unmet(console, job, prefix=f"{member['target']}: ") or unmet
        if out is not None:
            written = fetch_artifacts(client, member["job_id"], safe_destination(out, member["target"]))
            if not quiet:
                console.print(f"Wrote {len(written)} files to {out}/{member['target']}/")
    failed = [job for job in group["jobs"] if job["status"] != "succeeded"]
    if failed:
        console.print(f"[red]{len(failed)} of {len(group['jobs'])} targets did not succeed:[/red] "
                      + ", ".join(f"{job['target']} ({job['status']})" for job in failed))  # fmt: skip
        return EXIT["job_failed"]
    return EXIT["requirement_not_met"] if unmet else EXIT["ok"]


def register(app: typer.Typer) -> None:
    app.command("submit")(submit)
