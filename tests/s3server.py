"""A real S3-compatible server for the tests and benches: Ceph's RADOS Gateway (``radosgw``, Debian's
package) on a private one-node Ceph cluster, in a temporary folder on free loopback ports.

    with CephS3() as s3:              # a monitor, one OSD (BlueStore in a sparse file), the gateway
        s3.settings()                 # FLEXDSA_* settings for a store in a fresh bucket
        s3.stop_gateway(); s3.start_gateway()   # an outage of the store, and its end

It is the same gateway that serves S3 in production Ceph clusters, not an emulator: multipart uploads,
SigV4 and presigned URLs are its own. Authentication inside the cluster is off (one host, loopback only);
the S3 user's keys are random per cluster and reach boto3 through the environment (``env()``), as
production credentials do. The daemons die with the process that started them (PR_SET_PDEATHSIG).
Starting takes 10-30 s, most of it the gateway creating its pools.

Installed by ``scripts/install-s3-server.sh`` (``make`` runs it with the test dependencies). When the
binaries are missing or the cluster does not come up, ``CephS3()`` raises ``S3ServerError`` with the
reason and the daemon's log tail: tests that need the store fail, they are never skipped.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

BINARIES = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph", "monmaptool", "ceph-authtool")
START_TIMEOUT_S = 120


class S3ServerError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


CONF = """[global]
fsid = {fsid}
mon host = [v2:127.0.0.1:{mon_port}]
mon initial members = a
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = true
ms mon client mode = crc secure
ms client mode = crc secure
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd pool default pg num = 8
osd pool default pgp num = 8
mon max pg per osd = 1000
osd crush chooseleaf type = 0
mon osd full ratio = .99
mon osd backfillfull ratio = .98
mon osd nearfull ratio = .97
mon data avail crit = 1
mon data avail warn = 2
run dir = {dir}/run
admin socket = {dir}/run/$name.asok
log file = {dir}/log/$name.log
pid file = {dir}/run/$name.pid
mon data = {dir}/mon/$cluster-$id
osd data = {dir}/osd/$cluster-$id
keyring = {dir}/keyring
osd objectstore = bluestore
bluestore block path = {dir}/osd/$cluster-$id.block
bluestore block create = true
bluestore block size = {block_bytes}
bluestore block db create = false
bluestore block wal create = false
osd memory target = 939524096
bluestore cache autotune = false
bluestore cache size = 134217728
osd max object name len = 460
osd max object namespace len = 64
client mount timeout = 30
rados mon op timeout = 30
rados osd op timeout = 60

[client.rgw]
rgw frontends = beast endpoint=127.0.0.1:{rgw_port}
rgw thread pool size = 64
rgw enable usage log = false
"""


class CephS3:
    def __init__(self, *, block_gib: int = 24) -> None:
        missing = [name for name in BINARIES if shutil.which(name) is None]
        if missing:
            raise S3ServerError(
                f"the S3 test server needs Ceph's {', '.join(missing)}: run scripts/install-s3-server.sh "
                "(Debian packages radosgw, ceph-mon, ceph-osd; `make .venv/.installed-test` runs it)"
            )
        self.dir = Path(tempfile.mkdtemp(prefix="flexdsa-ceph-"))
        self.mon_port, self.rgw_port = free_port(), free_port()
        self.endpoint = f"http://127.0.0.1:{self.rgw_port}"
        self.access_key = "FDSA" + secrets.token_hex(8).upper()
        self.secret_key = secrets.token_urlsafe(30)
        self.conf = self.dir / "ceph.conf"
        self.processes: dict[str, subprocess.Popen] = {}
        for sub in ("run", "log", "mon/ceph-a", "osd/ceph-0"):
            (self.dir / sub).mkdir(parents=True)
        self.conf.write_text(
            CONF.format(
                fsid=uuid.uuid4(), mon_port=self.mon_port, rgw_port=self.rgw_port, dir=self.dir,
                block_bytes=block_gib << 30,
            )
        )  # fmt: skip
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    # -- the cluster ----------------------------------------------------------------------------------------

    def _run(self, *argv: str, timeout: float = 60) -> str:
        try:
            done = subprocess.run(
                [argv[0], "-c", str(self.conf), *argv[1:]], capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            raise S3ServerError(f"{' '.join(argv[:3])} did not finish in {timeout} s{self._logs()}") from None
        if done.returncode != 0:
            raise S3ServerError(f"{' '.join(argv[:3])} failed: {done.stderr.strip()[-2000:]}{self._logs()}")
        return done.stdout

    def _daemon(self, name: str, *argv: str) -> None:
        log = open(self.dir / "log" / f"{name}.out", "ab")
        self.processes[name] = subprocess.Popen(
            [argv[0], "-f", "-c", str(self.conf), *argv[1:]],
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
        )  # fmt: skip

    def _start(self) -> None:
        started = time.monotonic()
        fsid = self.conf.read_text().split("fsid = ", 1)[1].split("\n", 1)[0]
        subprocess.run(
            ["ceph-authtool", "--create-keyring", str(self.dir / "keyring"), "--gen-key", "-n", "mon.",
             "--cap", "mon", "allow *"], check=True, capture_output=True,
        )  # fmt: skip
        subprocess.run(
            ["monmaptool", "--create", "--addv", "a", f"[v2:127.0.0.1:{self.mon_port}]", "--fsid", fsid,
             str(self.dir / "monmap")], check=True, capture_output=True,
        )  # fmt: skip
        self._run("ceph-mon", "--mkfs", "-i", "a", "--monmap", str(self.dir / "monmap"))
        self._daemon("mon.a", "ceph-mon", "-i", "a")
        self._run("ceph", "--connect-timeout", "30", "status")
        osd_uuid = str(uuid.uuid4())
        osd_id = self._run("ceph", "osd", "new", osd_uuid).strip()
        self._run("ceph-osd", "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid, timeout=120)
        self._daemon("osd.0", "ceph-osd", "-i", osd_id)
        self._wait(lambda: json.loads(self._run("ceph", "osd", "dump", "-f", "json"))["osds"][0]["up"] == 1, "the OSD")
        self.start_gateway()
        self._run(
            "radosgw-admin", "user", "create", "--uid", "flexdsa", "--display-name", "Flex-DSA tests",
            "--access-key", self.access_key, "--secret", self.secret_key,
        )  # fmt: skip
        self.started_in_s = round(time.monotonic() - started, 1)

    def _wait(self, ready, what: str, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise S3ServerError(f"{name} exited ({process.returncode}) while waiting for {what}{self._logs()}")
            try:
                if ready():
                    return
            except (S3ServerError, OSError, ValueError, KeyError, IndexError):
                pass
            if time.monotonic() > deadline:
                raise S3ServerError(f"{what} did not come up in {timeout_s} s{self._logs()}")
            time.sleep(0.3)

    def _gateway_answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.rgw_port), timeout=2) as connection:
                connection.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                return connection.recv(64).startswith(b"HTTP/1.1 200")
        except OSError:
            return False

    def start_gateway(self) -> None:
        """Start radosgw and wait until it answers S3 requests."""
        self._daemon("client.rgw", "radosgw", "-n", "client.rgw")
        self._wait(self._gateway_answers, "the S3 gateway (radosgw)")

    def stop_gateway(self) -> None:
        """An outage: radosgw killed (SIGKILL); the cluster under it keeps every object."""
        process = self.processes.pop("client.rgw", None)
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(30)

    def _logs(self) -> str:
        tails = []
        for log in sorted((self.dir / "log").glob("*")):
            with contextlib.suppress(OSError):
                text = log.read_text(errors="replace").strip().splitlines()[-15:]
                if text:
                    tails.append(f"--- {log.name}:\n" + "\n".join(text))
        return ("\n" + "\n".join(tails)) if tails else ""

    def close(self) -> None:
        for name in ("client.rgw", "osd.0", "mon.a"):
            process = self.processes.pop(name, None)
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> CephS3:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- what clients need ------------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """Credentials the way production passes them: boto3's environment variables."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": "us-east-1"}

    def new_bucket(self) -> str:
        """A fresh bucket (tests each get their own, so they never see another's objects)."""
        name = f"flexdsa-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key, region_name="us-east-1",
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                          request_checksum_calculation="when_required",
                          response_checksum_validation="when_required"),
        )  # fmt: skip

    def settings(self, bucket: str | None = None, prefix: str = "flexdsa") -> dict[str, str]:
        """``FLEXDSA_*`` settings (lower-case names, as ``Settings(**...)`` takes them) for a store in
        ``bucket`` (a new one by default)."""
        bucket = bucket or self.new_bucket()
        return {"artifact_url": f"s3://{bucket}/{prefix}", "s3_endpoint_url": self.endpoint}


def export_env(s3: CephS3) -> None:
    """Put the cluster's credentials in this process's environment (for stores made in-process)."""
    os.environ.update(s3.env())
