"""The pipeline process as the worker sees it: ``PipelineProcess`` starts ``python -m workers.child`` for
one job, hands it the request on stdin, reads its JSON lines, and stops or kills it; ``_Spare`` keeps one
such process pre-started per worker thread, so a job does not wait for the compiler's imports
(``Settings.warm_pipeline``). The protocol is in ``workers/child.py``'s docstring.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

KILL_GRACE_S = 5.0
STDERR_TAIL_BYTES = 4000
# Where this package lives on disk, so the child can import it whatever the current directory is.
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)

# One pre-started pipeline process per thread (the thread matters: the child's PR_SET_PDEATHSIG follows
# the thread that started it). Off with FLEXDSA_WARM_PIPELINE=false (Settings.warm_pipeline).
_spares = threading.local()


# What the pipeline process keeps of the worker's environment: what Python, the numeric libraries, TLS and the
# object store's credential chain (boto3 reads AWS_*: the job fetches its model and stores its artifacts) read.
# Never the service's own FLEXDSA_* variables (the operator token, the database URL with its password): the
# job's settings come with its request, less the operator token, so a model that makes ONNX Runtime or a
# vendor compiler misbehave finds no more secrets in this process's environment than the job needs.
CHILD_ENV_NAMES = frozenset({
    "PATH", "HOME", "USER", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
})  # fmt: skip
CHILD_ENV_PREFIXES: tuple[str, ...] = ("LC_", "AWS_")
# The module a pipeline process runs (``python -m``): this package's own. The tests run theirs, which installs
# their hooks around it (``tests/workers/hooks.py`` sets this and lets their own variables through).
CHILD_MODULE = "workers.child"


def _child_env() -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if name in CHILD_ENV_NAMES or name.startswith(CHILD_ENV_PREFIXES)
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p)
    return env


class _Spare:
    """A started ``python -m workers.child`` waiting for its request on stdin."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.stderr_file = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [sys.executable, "-m", CHILD_MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr_file,
            env=env,
            close_fds=True,
        )

    def usable(self, env: dict[str, str]) -> bool:
        return self.process.poll() is None and self.env == env

    def discard(self) -> None:
        for stream in (self.process.stdin, self.process.stdout, self.stderr_file):
            with contextlib.suppress(OSError, ValueError):
                stream.close()  # EOF on stdin: the spare exits by itself
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(KILL_GRACE_S)
        if self.process.poll() is None:
            self.process.kill()


class PipelineProcess:
    """One ``python -m workers.child`` process and the thread that reads its JSON lines."""

    def __init__(self, process: subprocess.Popen, stderr_file) -> None:
        self.process = process
        self._stderr_file = stderr_file
        self._inbox: queue.Queue[dict | None] = queue.Queue()
        self._reader_done = threading.Event()
        self._terminated = False
        self._stderr_tail: str | None = None
        threading.Thread(target=self._read, name=f"child-{process.pid}-reader", daemon=True).start()

    @classmethod
    def start(cls, request: dict, *, warm: bool = True) -> PipelineProcess:
        """Hand ``request`` to a pipeline process: this thread's warm spare when it matches the current
        environment, else a new one; then start the next spare, which imports the compiler while this job
        runs, so the next job skips the ~1 s of interpreter and library start-up."""
        env = _child_env()
        spare: _Spare | None = getattr(_spares, "spare", None)
        _spares.spare = None
        if spare is not None and not spare.usable(env):
            spare.discard()
            spare = None
        spare = spare or _Spare(env)
        spare.process.stdin.write((json.dumps(request, default=str) + "\n").encode())
        spare.process.stdin.flush()  # stdin stays open: its EOF tells the child that we died
        if warm:
            _spares.spare = _Spare(env)
        return cls(spare.process, spare.stderr_file)

    def _read(self) -> None:
        try:
            for line in self.process.stdout:
                with contextlib.suppress(ValueError):
                    self._inbox.put(json.loads(line))
        finally:
            self._reader_done.set()
            self._inbox.put(None)

    def messages(self, wait_s: float) -> list[dict]:
        out = []
        try:
            item = self._inbox.get(timeout=wait_s)
            while True:
                if item is not None:
                    out.append(item)
                item = self._inbox.get_nowait()
        except queue.Empty:
            return out

    def finished(self) -> bool:
        # Done when the process has exited and every line it wrote has been read.
        return self.process.poll() is not None and self._reader_done.is_set() and self._inbox.empty()

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    @property
    def terminated(self) -> bool:
        return self._terminated

    def terminate(self) -> None:
        if not self._terminated and self.process.poll() is None:
            self._terminated = True
            self.process.terminate()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(KILL_GRACE_S)

    def stderr_tail(self) -> str:
        if self._stderr_tail is not None:
            return self._stderr_tail
        with contextlib.suppress(OSError, ValueError):
            self._stderr_file.seek(0, os.SEEK_END)
            size = self._stderr_file.tell()
            self._stderr_file.seek(max(0, size - STDERR_TAIL_BYTES))
            return self._stderr_file.read().decode("utf-8", "replace")
        return ""

    def close(self) -> None:
        self.kill()
        self._stderr_tail = self.stderr_tail()  # kept for the crash report after the file is gone
        for stream in (self.process.stdin, self.process.stdout, self._stderr_file):
            with contextlib.suppress(OSError, ValueError):
                stream.close()
