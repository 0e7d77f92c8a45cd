"""Disk-full and SIGKILL paths never lose data silently: what is missing from the log is
counted in the manifest's ``losses``; ``seal`` on a full disk says how much to free."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from progs.helpers import PY, base_env, capture_argv, prog

from kk3evidence.bundle.archive import open_bundle, seal, validate
from kk3evidence.bundle.ledger import LEDGER_NAME, read_ledger
from kk3evidence.errors import BundleError


def _kill_group_of(staging: Path) -> None:
    with contextlib.suppress(OSError, ValueError, KeyError, ProcessLookupError):
        os.killpg(json.loads((staging / "launch.json").read_text())["pid"], signal.SIGKILL)


def _log_bytes_and_losses(bundle: Path) -> tuple[int, int, dict[str, object]]:
    with open_bundle(bundle) as b:
        size = b.member("logs/combined.log").size
        lost = sum(
            int(loss.get("bytes") or 0)
            for loss in b.manifest["losses"]
            if loss.get("member") == "logs/combined.log"
        )
        return size, lost, b.manifest


@pytest.mark.slow
def test_killed_during_a_flood_every_byte_shown_is_in_the_bundle_or_counted_lost(
    tmp_path: Path,
) -> None:
    staging = tmp_path / "staging"
    cmd = [
        PY,
        "-c",
        "import os, time\nline = b'x' * 199 + b'\\n'\nfor _ in range(40):\n"
        "    os.write(1, line * 5000)\nos.write(1, b'ready\\n')\ntime.sleep(600)",
    ]
    proc = subprocess.Popen(
        capture_argv(tmp_path / "run.tar", cmd, ["--staging", str(staging), "--no-probe"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=base_env(),
    )
    try:
        assert proc.stdout is not None
        shown = b""
        while not shown.endswith(b"ready\n"):
            chunk = os.read(proc.stdout.fileno(), 1 << 20)
            assert chunk, "capture ended early"
            shown += chunk
        # Everything is on the terminal now; kill capture before its writer has caught up.
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=60)
        _kill_group_of(staging)
    assert (staging / LEDGER_NAME).exists()
    sealed = seal(staging, tmp_path / "sealed.tar")
    assert validate(sealed) == []
    size, lost, manifest = _log_bytes_and_losses(sealed)
    # Killed while idle (every chunk received was passed through): exact, to the byte.
    assert size + lost == len(shown)
    notes = {n["what"] for n in manifest["not_collected"]}  # type: ignore[union-attr]
    assert "launch.json (end of run)" in notes


#: the most one read of CMD's pipe returns (pump.READ_SIZE): the chunk in passage at the kill
IN_PASSAGE = 1 << 20


def _capture_killed_after(tmp_path: Path, staging: Path, kill_after: int) -> bytes:
    """Run a flood under capture, SIGKILL capture once ``kill_after`` bytes are shown, then
    read what the terminal got to the end (what was already in the pipe)."""
    # 24 MB of numbered lines on stdout only (stderr would be logged but not shown here)
    program = (
        "import os\n"
        "block = b''.join(b'%09d %s\\n' % (i, b'x' * 90) for i in range(4096))\n"
        "for _ in range(60):\n"
        "    os.write(1, block)\n"
    )
    cmd = [PY, "-c", program]
    proc = subprocess.Popen(
        capture_argv(tmp_path / "run.tar", cmd, ["--staging", str(staging), "--no-probe"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=base_env(),
        process_group=0,
    )
    shown = bytearray()
    try:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        while len(shown) < kill_after:
            chunk = os.read(fd, 1 << 16)
            assert chunk, "capture ended early"
            shown += chunk
        proc.send_signal(signal.SIGKILL)
        while chunk := os.read(fd, 1 << 20):
            shown += chunk
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=60)
        _kill_group_of(staging)
    return bytes(shown)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_killed_at_a_random_point_of_a_flood_the_log_and_losses_account_for_every_byte(
    tmp_path: Path, seed: int
) -> None:
    """SIGKILL at a random moment of a 24 MiB flood (the pump and the writer both busy):
    every byte shown is in the log or counted lost; the only slack is the one chunk that
    was counted (before being shown) and not yet fully shown when capture died."""
    staging = tmp_path / "staging"
    kill_after = random.Random(seed).randrange(1, 20 << 20)
    shown = _capture_killed_after(tmp_path, staging, kill_after)
    sealed = seal(staging, tmp_path / "sealed.tar")
    assert validate(sealed) == []
    size, lost, _ = _log_bytes_and_losses(sealed)
    assert len(shown) <= size + lost <= len(shown) + IN_PASSAGE
    with open_bundle(sealed) as b:
        log = b.read_bytes("logs/combined.log")
    # What is in the log is what was shown, in order, from the start.
    assert shown.startswith(log) if len(log) <= len(shown) else log.startswith(shown)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs (root only; skipped elsewhere), unmounted afterwards."""
    mnt = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    ran = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
        capture_output=True,
        check=False,
    )
    if ran.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


@pytest.mark.slow
def test_disk_full_losses_are_recorded_and_seal_says_what_to_free(
    tmp_path: Path, small_disk: Path
) -> None:
    staging = small_disk / "run.tar.staging"
    cmd = [PY, prog("flood.py"), "6"]
    ran = subprocess.run(
        capture_argv(small_disk / "run.tar", cmd, ["--no-probe"]),
        capture_output=True,
        env=base_env(),
        timeout=300,
        check=False,
    )
    assert ran.returncode == 0  # CMD's status: capture never fails the command
    assert b"cannot record output" in ran.stderr
    assert not (small_disk / "run.tar").exists()  # no room for the bundle
    assert staging.is_dir()
    ledger = read_ledger(staging)
    assert ledger is not None and ledger["losses"]
    # Still full: seal says how much to free and where, and keeps everything.
    with pytest.raises(BundleError, match=r"needs about \d+ MiB"):
        seal(staging, small_disk / "sealed.tar")
    assert staging.is_dir()
    # Written elsewhere: a valid bundle whose losses account for what is missing.
    sealed = seal(staging, tmp_path / "sealed.tar")
    assert validate(sealed) == []
    size, lost, _ = _log_bytes_and_losses(sealed)
    assert size < len(ran.stdout)
    assert size + lost >= len(ran.stdout)


@pytest.mark.slow
def test_seal_on_a_full_disk_holds_the_stubs_it_cannot_write_and_still_scans_them(
    tmp_path: Path, small_disk: Path
) -> None:
    """The capture died before writing fingerprint.json and the disk is full: seal cannot
    write the stub into the staging folder, holds it in memory, and every later step (the
    placeholder scan, the tar) reads it from there. Found by CI on a loaded machine, where
    the flood filled the disk before the capture had written its fingerprint."""
    from kk3evidence.bundle.archive import BundleWriter

    staging = small_disk / "run.tar.staging"
    writer = BundleWriter(staging)
    log = writer.path_of("logs/combined.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(b"INFO start\nkey=<redacted:hf_token#1>\n")
    writer.checkpoint()
    with open(small_disk / "filler", "wb") as fp, contextlib.suppress(OSError):
        while True:
            fp.write(b"\0" * 65536)
            fp.flush()
    assert not (staging / "fingerprint.json").exists()
    sealed = seal(staging, tmp_path / "sealed.tar")
    assert validate(sealed) == []
    with open_bundle(sealed) as b:
        whats = {n["what"] for n in b.manifest["not_collected"]}
        assert {"fingerprint.json", "launch.json"} <= whats
        assert any(r["placeholder"] == "<redacted:hf_token#1>" for r in b.manifest["redactions"])
