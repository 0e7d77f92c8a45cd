"""The expanded-size limit (issue 16): a gzip that would expand past it is refused at the header
that declares it, before any of its data is inflated, and the refusal says how to lift it."""

from __future__ import annotations

import gzip
import random
import subprocess
import sys
from pathlib import Path

import pytest
from bundle_factory import TOP, RawMember, header, valid_raw_members

from kk3evidence.bundle.archive import Limits, validate
from kk3evidence.bundle.tarsafe import MAX_BUNDLE_ENV, max_bundle_bytes

MiB = 1024 * 1024


def _block() -> bytes:
    """1 MiB that deflate shrinks a few hundred times (under the 600:1 bomb ratio)."""
    rnd = random.Random(3)
    noise = bytes(rnd.getrandbits(8) for _ in range(1500))
    return (noise + b"INFO tick\n" * 100_000)[:MiB]


def _bomb(tmp: Path, declared: int, blocks: int) -> Path:
    """A small valid bundle whose log member declares ``declared`` bytes; ``blocks`` MiB of it
    are present as repeated gzip members, then the stream is corrupt. A reader that inflates
    the member (to skip or hash it) reports the corruption; one that stops at the header
    does not."""
    members = valid_raw_members()
    log = next(i for i, m in enumerate(members) if m.name.endswith("logs/combined.log"))
    before = b"".join(header(m) + m.data + b"\0" * (-len(m.data) % 512) for m in members[:log])
    body = gzip.compress(_block(), mtime=0)
    out = tmp / "bomb.tar.gz"
    with out.open("wb") as fp:
        fp.write(gzip.compress(before + header(RawMember(members[log].name, size=declared)),
                               mtime=0))
        for _ in range(blocks):
            fp.write(body)
        fp.write(b"\x1f\x8b\x08\x00garbage that is not deflate data" * 4)
    return out


def test_a_member_declaring_more_than_the_limit_is_refused_before_inflating(
    tmp_path: Path,
) -> None:
    bomb = _bomb(tmp_path, declared=64 * MiB, blocks=40)
    limits = Limits(max_member_bytes=16 * MiB, max_total_bytes=16 * MiB)
    problems = validate(bomb, limits=limits)
    codes = [p.code for p in problems]
    assert codes[0] == "member-too-large", [str(p) for p in problems]
    assert "corrupt-archive" not in codes and "truncated" not in codes  # never inflated
    assert MAX_BUNDLE_ENV in problems[0].message
    assert problems[0].member == "logs/combined.log"


def test_a_total_past_the_limit_stops_the_pass_at_the_header(tmp_path: Path) -> None:
    bomb = _bomb(tmp_path, declared=12 * MiB, blocks=40)
    limits = Limits(max_member_bytes=16 * MiB, max_total_bytes=12 * MiB)
    problems = validate(bomb, limits=limits)
    codes = [p.code for p in problems]
    assert codes[0] == "archive-too-large", [str(p) for p in problems]
    assert "corrupt-archive" not in codes and "truncated" not in codes
    assert MAX_BUNDLE_ENV in problems[0].message and "GiB" in problems[0].message


def test_under_the_limit_the_member_is_read_and_the_damage_found(tmp_path: Path) -> None:
    """The control: the same bomb under a limit it fits is inflated (and found corrupt)."""
    bomb = _bomb(tmp_path, declared=64 * MiB, blocks=40)
    codes = [p.code for p in validate(bomb, limits=Limits(max_member_bytes=1024 * MiB))]
    assert "corrupt-archive" in codes or "truncated" in codes, codes


@pytest.mark.parametrize(("value", "expected"), [
    ("", 4 * 1024 * MiB), ("0.5", 512 * MiB), ("10", 10 * 1024 * MiB),
    ("zero", 4 * 1024 * MiB), ("-3", 4 * 1024 * MiB), ("nan", 4 * 1024 * MiB),
])
def test_the_limit_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: int
) -> None:
    monkeypatch.setenv(MAX_BUNDLE_ENV, value)
    assert max_bundle_bytes() == expected
    assert Limits().max_total_bytes == expected == Limits().max_member_bytes


def test_validate_cli_refuses_in_one_line_and_the_variable_lifts_it(tmp_path: Path) -> None:
    bomb = _bomb(tmp_path, declared=64 * MiB, blocks=40)
    cmd = [sys.executable, "-m", "kk3evidence", "validate", str(bomb)]
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2]), MAX_BUNDLE_ENV: "0.03125"}
    low = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    assert low.returncode == 4
    assert "member-too-large" in low.stdout and MAX_BUNDLE_ENV in low.stdout
    assert "Traceback" not in low.stderr
    env[MAX_BUNDLE_ENV] = "1"
    high = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    assert high.returncode == 4 and "member-too-large" not in high.stdout
    assert TOP  # the factory's top folder names the members above
