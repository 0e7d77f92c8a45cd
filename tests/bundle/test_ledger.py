"""The capture's counters survive a SIGKILL of the process that kept them (a store into a
shared file mapping is in the page cache at once), and bad files read as "no counters"."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kk3evidence.bundle.ledger import COUNTERS_NAME, Counters, read_counters


def test_counters_round_trip(tmp_path: Path) -> None:
    c = Counters(tmp_path)
    assert c.usable
    c.add_received(10)
    c.add_received(5)
    c.add_shrink(-3)
    c.add_shrink(0)
    assert read_counters(tmp_path) == (15, -3)
    c.close()
    assert read_counters(tmp_path) == (15, -3)


def test_the_last_store_before_a_sigkill_is_read_back(tmp_path: Path) -> None:
    # The child stores and kills itself at once: no flush, no msync, no close.
    program = (
        "import os, signal, sys\n"
        "from kk3evidence.bundle.ledger import Counters\n"
        "c = Counters(sys.argv[1])\n"
        "for n in range(1, 1001):\n"
        "    c.add_received(n)\n"
        "c.add_shrink(-7)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    ran = subprocess.run([sys.executable, "-c", program, str(tmp_path)], check=False)
    assert ran.returncode == -signal.SIGKILL
    assert read_counters(tmp_path) == (500500, -7)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=40))
def test_any_other_file_is_no_counters(tmp_path_factory: object, raw: bytes) -> None:
    folder = tmp_path_factory.mktemp("c")  # type: ignore[attr-defined]
    (folder / COUNTERS_NAME).write_bytes(raw)
    got = read_counters(folder)
    assert got is None or raw.startswith(b"kk3cnt01")


def test_a_link_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    Counters(tmp_path).close()
    os.replace(tmp_path / COUNTERS_NAME, target)
    (tmp_path / COUNTERS_NAME).symlink_to(target)
    assert read_counters(tmp_path) is None
    assert not Counters(tmp_path).usable  # O_NOFOLLOW: never written through a link


@settings(max_examples=25, deadline=None)
@given(
    log=st.binary(max_size=300).map(lambda b: b.replace(b"\0", b"")),
    unwritten=st.integers(0, 10_000),
    shrink=st.integers(-50, 50),
)
def test_seal_counts_exactly_what_the_counters_say_was_never_written(
    tmp_path_factory: object, log: bytes, unwritten: int, shrink: int
) -> None:
    """received = log size + redaction shrink + lost, whatever the ledger says (or lacks)."""
    from kk3evidence.bundle.archive import BundleWriter, open_bundle, seal

    assume(len(log) + shrink >= 0)  # what came in cannot be negative
    staging = tmp_path_factory.mktemp("s") / "run.tar.staging"  # type: ignore[attr-defined]
    writer = BundleWriter(staging)
    path = writer.path_of("logs/combined.log")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(log)
    writer.checkpoint()
    counters = Counters(staging)
    counters.add_received(len(log) + shrink + unwritten)
    counters.add_shrink(shrink)
    counters.close()
    sealed = seal(staging, staging.parent / "sealed.tar")
    with open_bundle(sealed) as b:
        (loss,) = [x for x in b.manifest["losses"] if "killed" in str(x["reason"])]
    assert loss["bytes"] == max(unwritten, 0)
