"""What a command prints: its own lines, not other libraries' noise.

ONNX Runtime writes warnings from native code straight to file descriptor 2 (one coloured line per unused
initializer when a session opens a model), ``onnxruntime.quantization`` logs "Please consider to run
pre-processing before quantization" through Python's root logger once per model it quantises (dozens of times
in an int8 search), and libraries raise Python warnings. Under ``library_output(log_path)`` all of that goes to
``log_path`` (fd 2 is pointed at the file, and ``sys.stderr``, which the command's own messages and progress
bar use, at a copy of the terminal); with ``verbose`` it is shown as before. ``lines`` says how many lines the
log took, so the command can say where they are.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass
class LibraryLog:
    path: Path | None

    def lines(self) -> int:
        if self.path is None or not self.path.exists():
            return 0
        with self.path.open("rb") as handle:
            return sum(1 for _ in handle)


@contextmanager
def library_output(log_path: Path, *, verbose: bool = False) -> Iterator[LibraryLog]:
    """Send other libraries' output to ``log_path`` for the duration (``verbose``: leave it on the terminal,
    with Python's warnings and log records at WARNING and above shown there too)."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    if verbose:
        if not root.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
            root.addHandler(handler)
            root.setLevel(logging.WARNING)
        try:
            yield LibraryLog(None)
        finally:
            root.handlers[:] = saved_handlers
            root.setLevel(saved_level)
        return
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = log_path.open("w", buffering=1)
    handler = logging.StreamHandler(log_file)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)  # what reached the terminal before: warnings, not the libraries' INFO chatter
    saved_showwarning = warnings.showwarning
    warnings.showwarning = _to_log(log_file)
    terminal_fd, saved_stderr = _point_fd2_at(log_file)
    try:
        yield LibraryLog(log_path)
    finally:
        _restore_fd2(terminal_fd, saved_stderr)
        warnings.showwarning = saved_showwarning
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        log_file.close()


def _to_log(log_file):
    def show(message, category, filename, lineno, file=None, line=None) -> None:
        log_file.write(warnings.formatwarning(message, category, filename, lineno, line))

    return show


def _point_fd2_at(log_file) -> tuple[int | None, object]:
    """fd 2 -> the log; ``sys.stderr`` -> a copy of the old fd 2 when it wrote there (a test runner's own
    stream is left as it is). Returns what ``_restore_fd2`` needs."""
    sys.stderr.flush()
    try:
        terminal_fd = os.dup(2)
    except OSError:  # no fd 2 at all (a daemon): nothing to redirect
        return None, sys.stderr
    saved_stderr = sys.stderr
    writes_to_fd2 = _fileno(sys.stderr) == 2
    os.dup2(log_file.fileno(), 2)
    if writes_to_fd2:
        sys.stderr = os.fdopen(os.dup(terminal_fd), "w", buffering=1, encoding=getattr(saved_stderr, "encoding", None))
    return terminal_fd, saved_stderr


def _restore_fd2(terminal_fd: int | None, saved_stderr) -> None:
    if terminal_fd is None:
        return
    if sys.stderr is not saved_stderr:
        sys.stderr.flush()
        sys.stderr.close()
        sys.stderr = saved_stderr
    os.dup2(terminal_fd, 2)
    os.close(terminal_fd)


def _fileno(stream) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None
