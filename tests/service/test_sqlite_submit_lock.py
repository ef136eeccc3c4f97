"""Submissions on SQLite queue on a lock of ours, not in SQLite's busy handler (which sleeps up to 100 ms
between tries however soon the database is free): inside a process a thread lock, between the processes of
``flexdsa serve --workers N`` an flock beside the database, each woken as soon as the holder lets go."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from service.jobs.service import _one_writer_at_a_time


def _session(path) -> Session:
    return Session(create_engine(f"sqlite:///{path}"))


def test_a_submit_waits_for_another_process_and_goes_once_it_lets_go(tmp_path):
    """Ordering by events, not by the clock: the submit does not get in while another process holds the lock,
    and gets in after that process has let go. How soon after (the hand-over, against SQLite's own busy
    handler) is measured by ``python -m bench.mechanics`` (submit lock)."""
    database = tmp_path / "flexdsa.db"
    released = tmp_path / "released"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys\n"
         f"fd = os.open({str(database)!r} + '.submit-lock', os.O_RDWR | os.O_CREAT, 0o600)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\n"
         "print('held', flush=True)\n"
         "sys.stdin.readline()\n"  # hold until the test says so
         f"open({str(released)!r}, 'w').close()\n"
         "fcntl.flock(fd, fcntl.LOCK_UN)\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        entered = threading.Event()
        saw_release = []

        def submit() -> None:
            with _one_writer_at_a_time(_session(database)):
                saw_release.append(released.exists())
                entered.set()

        thread = threading.Thread(target=submit, daemon=True)
        thread.start()
        # However long it is given, the submit stays out while the other process holds the lock.
        assert not entered.wait(0.5), "the submit got in while another process held the lock"
        holder.stdin.write("release\n")
        holder.stdin.flush()
        assert entered.wait(30), "the submit never got in after the other process let go"  # a hang guard
        thread.join(30)
        assert saw_release == [True]  # it got in after the other process had let go, and once
        assert holder.wait(10) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)


def test_submits_in_one_process_take_turns(tmp_path):
    session = _session(tmp_path / "flexdsa.db")
    inside = []
    overlaps = []

    def submit(n: int) -> None:
        with _one_writer_at_a_time(session):
            if inside:
                overlaps.append(n)
            inside.append(n)
            time.sleep(0.02)
            inside.remove(n)

    threads = [threading.Thread(target=submit, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlaps == []
