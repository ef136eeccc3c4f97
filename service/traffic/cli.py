"""``flexdsa traffic push|show|propose`` and ``flexdsa respecialise``: run-time traffic and bundle versions from
the command line (a client of ``/jobs/{id}/traffic`` and ``/jobs/{id}/respecialise``, like ``flexdsa submit``).

    flexdsa traffic push JOB traffic.json        # a flexdsa_runtime snapshot (Traffic.save) to the job
    flexdsa traffic show JOB                     # requests, padding waste, per bucket
    flexdsa traffic propose JOB --max-buckets 4  # buckets from the traffic, expected cost old vs new
    flexdsa respecialise JOB --wait -o out/      # compile the next version, fetch its bundle
    flexdsa traffic policy JOB --waste 0.2       # re-specialise by itself past 20% padding waste
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from service.client import Client, ClientError, fetch_artifacts, wait_for

traffic_app = typer.Typer(
    help="Run-time traffic of a job's deployed bundle (flexdsa_runtime).", no_args_is_help=True
)

Server = Annotated[str, typer.Option(envvar="FLEXDSA_SERVER", help="Server base URL (or FLEXDSA_SERVER).")]
ApiKey = Annotated[
    str | None,
    typer.Option(envvar="FLEXDSA_API_KEY", show_default=False, help="API key (or FLEXDSA_API_KEY)."),
]
DEFAULT_SERVER = "http://127.0.0.1:8000"


def _run(server: str, api_key: str | None, action) -> None:
    from rich.console import Console

    client = Client(server, api_key)
    try:
        action(client)
    except ClientError as err:
        Console(stderr=True).print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from None
    finally:
        client.close()


AllowNarrower = Annotated[
    bool,
    typer.Option(
        "--allow-narrower",
        help="Let the new version serve less than the current one (requests past its largest bucket are refused).",
    ),
]

@traffic_app.command("push")
def push(
    job_id: str,
    snapshot: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, help="Traffic.save() output (JSON).")
    ],
    server: Server = DEFAULT_SERVER,
    api_key: ApiKey = None,
) -> None:
    """Send a runtime's traffic snapshot to the job."""

    def action(client: Client) -> None:
        try:
            body = json.loads(snapshot.read_text())
        except (OSError, ValueError) as err:
            raise ClientError(f"Cannot read {snapshot}: {err}") from None
        stored = client.send_json("POST", f"/jobs/{job_id}/traffic", body)
        typer.echo(
            f"Stored {stored['stored_entries']} entries; the job has {stored['requests']} requests of traffic, "
            f"padding {stored['padding_waste']:.1%} (extra input elements per real one)."
        )
        if stored.get("auto_respecialised_job_id"):
            typer.echo(
                f"Past the waste threshold: version job {stored['auto_respecialised_job_id']} started."
            )

    _run(server, api_key, action)


@traffic_app.command("show")
def show(job_id: str, server: Server = DEFAULT_SERVER, api_key: ApiKey = None) -> None:
    """The traffic the job's bundle served."""

    def action(client: Client) -> None:
        found = client.get_json(f"/jobs/{job_id}/traffic")
        typer.echo(
            f"{found['requests']} requests in {found['pushes']} push(es): {found['served']} served, "
            f"{found['refused']} refused; padding {found['padding_waste']:.1%} (extra input elements per real one)"
        )
        for bucket in found["buckets"]:
            typer.echo(f"  {bucket['name']:<24} {bucket['requests']:>8} requests")

    _run(server, api_key, action)


@traffic_app.command("propose")
def propose(
    job_id: str,
    max_buckets: Annotated[int | None, typer.Option(min=1, max=16)] = None,
    allow_narrower: AllowNarrower = False,
    server: Server = DEFAULT_SERVER,
    api_key: ApiKey = None,
) -> None:
    """Buckets chosen from the traffic, and their expected cost per request against the current ones."""

    def action(client: Client) -> None:
        found = client.get_json(
            f"/jobs/{job_id}/respecialise", max_buckets=max_buckets, allow_narrower=allow_narrower or None
        )
        for label in ("current", "default", "proposed"):
            row = found[label]
            if row.get("buckets") is None:
                typer.echo(f"{label:<9} -")
                continue
            cost = row.get("expected_cost_text") or f"{row['expected_cost_s'] * 1e3:.3g} ms"
            typer.echo(
                f"{label:<9} {json.dumps(row['buckets']):<40} {cost + '/request':>16} (estimate), "
                f"padding waste {row['padding_waste']:.1%} (of the cost)"
            )
        gain = found.get("gain") or {}
        if gain.get("cost_vs_current") is not None:
            typer.echo(f"expected cost, proposed / current: {gain['cost_vs_current']:.2f}x")
        typer.echo(f"cost basis: {found['cost_basis']}")
        typer.echo(coverage_line(found["coverage"]))
        for note in found["notes"]:
            typer.echo(f"note: {note}")

    _run(server, api_key, action)


@traffic_app.command("policy")
def policy(
    job_id: str,
    waste: Annotated[
        float | None, typer.Option(help="Re-specialise past this padding waste (0.2 = 20%); omit: off.")
    ] = None,
    max_buckets: Annotated[int | None, typer.Option(min=1, max=16)] = None,
    server: Server = DEFAULT_SERVER,
    api_key: ApiKey = None,
) -> None:
    """Set (or clear) the padding waste past which a push starts the next version by itself."""

    def action(client: Client) -> None:
        body = {"auto_respecialise_waste": waste, "max_buckets": max_buckets}
        set_to = client.send_json("PUT", f"/jobs/{job_id}/traffic/policy", body)
        typer.echo(json.dumps(set_to))

    _run(server, api_key, action)


def respecialise(
    job_id: str,
    max_buckets: Annotated[int | None, typer.Option(min=1, max=16)] = None,
    allow_narrower: AllowNarrower = False,
    wait: Annotated[bool, typer.Option("--wait", help="Follow the new version's job until it ends.")] = False,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Download its bundle here (implies --wait).")
    ] = None,
    server: Server = DEFAULT_SERVER,
    api_key: ApiKey = None,
) -> None:
    """Compile the next version of the job's bundle for the buckets its traffic calls for."""

    def action(client: Client) -> None:
        body = {"max_buckets": max_buckets, "allow_narrower": allow_narrower}
        created = client.send_json("POST", f"/jobs/{job_id}/respecialise", body)["job"]
        typer.echo(created["id"])
        typer.echo(
            f"version {created['bundle_version']}: buckets {json.dumps(created['spec']['shape_buckets'])}",
            err=True,
        )
        if not (wait or out):
            return
        job = (
            created
            if created["status"] in ("succeeded", "failed", "cancelled")
            else wait_for(client, created["id"], False, None)
        )
        if job["status"] != "succeeded":
            raise ClientError(
                f"job {created['id']} {job['status']}: {(job.get('error') or {}).get('message')}"
            )
        if out is not None:
            fetch_artifacts(client, created["id"], out)

    _run(server, api_key, action)


def coverage_line(coverage: dict) -> str:
    """``coverage: seq up to 64 (kept)`` / ``seq up to 56, was 64: seq 57-64 refused (allow_narrower)``."""
    parts = []
    for dim, now in coverage["current"].items():
        new = coverage["proposed"].get(dim, now)
        if dim in coverage["narrower"]:
            parts.append(f"{dim} up to {new}, was {now}: {dim} {new + 1}-{now} would be refused")
        else:
            parts.append(f"{dim} up to {new}" + (" (kept)" if new == now else f" (was {now})"))
    return "coverage: " + ("; ".join(parts) or "every shape (no bucketed dims)")


def register(app: typer.Typer) -> None:
    app.add_typer(traffic_app, name="traffic")
    app.command("respecialise")(respecialise)
