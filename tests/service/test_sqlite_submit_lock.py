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

from service.jobs import _one_writer_at_a_time

HOLD_S = 0.6


def _session(path) -> Session:
    return Session(create_engine(f"sqlite:///{path}"))


def test_a_submit_waits_for_another_process_and_goes_as_soon_as_it_lets_go(tmp_path):
    database = tmp_path / "flexdsa.db"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys, time\n"
         f"fd = os.open({str(database)!r} + '.submit-lock', os.O_RDWR | os.O_CREAT, 0o600)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\n"
         "print('held', flush=True)\n"
         f"time.sleep({HOLD_S})\n"
         "print(repr(time.time()), flush=True)\n"
         "fcntl.flock(fd, fcntl.LOCK_UN)\n"],
        stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    session = _session(database)
    started = time.monotonic()
    with _one_writer_at_a_time(session):
        entered = time.time()
        waited = time.monotonic() - started
    released = float(holder.stdout.readline())
    holder.wait(10)
    assert waited >= HOLD_S * 0.8, waited  # it did wait for the other process
    assert entered - released < 0.05, entered - released  # and went at once when it let go


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
