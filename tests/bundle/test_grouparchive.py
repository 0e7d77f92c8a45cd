"""Group archives (``kk3evidence merge``): written from verified bundles, read back safely."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kk3evidence.bundle.grouparchive import (
    is_group_archive,
    opened_group_archive,
    write_group_archive,
)
from kk3evidence.errors import BundleError, InputError

DATA = Path(__file__).resolve().parents[1] / "data" / "realruns"
NODES = [str(DATA / "group_killed" / f"node{i}.tar") for i in (0, 1)]


def test_roundtrip_gives_the_same_bytes_in_rank_order(tmp_path: Path) -> None:
    out = write_group_archive(list(reversed(NODES)), tmp_path / "g.tar")
    assert is_group_archive(out)
    assert not is_group_archive(NODES[0])  # a bundle is not a group archive
    with opened_group_archive(out) as paths:
        got = [Path(p).read_bytes() for p in paths]
        names = [Path(p).name for p in paths]
    assert names == ["node1.tar", "node0.tar"]  # the order given, named by rank
    assert got == [Path(NODES[1]).read_bytes(), Path(NODES[0]).read_bytes()]
    assert not any(Path(p).exists() for p in paths)  # temporary copies are gone


def _rewrite(src: Path, dst: Path, edit: object) -> None:
    with tarfile.open(src) as tin, tarfile.open(dst, "w") as tout:
        for m in tin.getmembers():
            data = tin.extractfile(m).read() if m.isfile() else b""  # type: ignore[union-attr]
            m2, data2 = edit(m, data)  # type: ignore[operator]
            if m2 is not None:
                tout.addfile(m2, io.BytesIO(data2))


def test_a_changed_node_bundle_is_refused(tmp_path: Path) -> None:
    good = write_group_archive(NODES, tmp_path / "g.tar")

    def flip(m: tarfile.TarInfo, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
        if m.name.endswith("nodes/node1.tar"):
            data = data[:-600] + bytes([data[-600] ^ 1]) + data[-599:]
        return m, data

    _rewrite(good, tmp_path / "bad.tar", flip)
    with pytest.raises(BundleError, match="sha256"), opened_group_archive(tmp_path / "bad.tar"):
        pass


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("kk3group-twonode/../evil.tar", tarfile.REGTYPE),
        ("kk3group-twonode/extra.txt", tarfile.REGTYPE),
        ("kk3group-twonode/nodes/node9.tar", tarfile.SYMTYPE),
    ],
)
def test_hostile_members_are_refused(tmp_path: Path, name: str, kind: bytes) -> None:
    good = write_group_archive(NODES, tmp_path / "g.tar")
    with tarfile.open(good) as tin, tarfile.open(tmp_path / "bad.tar", "w") as tout:
        for m in tin.getmembers():
            tout.addfile(m, tin.extractfile(m))
        extra = tarfile.TarInfo(name)
        extra.type = kind
        extra.linkname = "/etc/passwd" if kind == tarfile.SYMTYPE else ""
        tout.addfile(extra, io.BytesIO(b""))
    with pytest.raises(BundleError), opened_group_archive(tmp_path / "bad.tar"):
        pass


def test_index_lists_a_missing_node(tmp_path: Path) -> None:
    good = write_group_archive(NODES, tmp_path / "g.tar")

    def drop(m: tarfile.TarInfo, data: bytes) -> tuple[tarfile.TarInfo | None, bytes]:
        return (None, b"") if m.name.endswith("node1.tar") else (m, data)

    _rewrite(good, tmp_path / "bad.tar", drop)
    with pytest.raises(BundleError, match="lacks"), opened_group_archive(tmp_path / "bad.tar"):
        pass


def test_merge_refuses_one_bundle_and_invalid_ones(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="at least two"):
        write_group_archive(NODES[:1], tmp_path / "g.tar")
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar" * 100)
    with pytest.raises(BundleError):
        write_group_archive([NODES[0], str(junk)], tmp_path / "g.tar")
    assert not (tmp_path / "g.tar").exists()


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=4096))
def test_random_bytes_never_crash_the_reader(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    path = tmp_path_factory.mktemp("h") / "x.tar"
    path.write_bytes(data)
    is_group_archive(path)
    try:
        with opened_group_archive(path):
            pass
    except BundleError:
        pass


def test_cli_merge_then_analyze_the_archive(tmp_path: Path) -> None:
    out = tmp_path / "g.tar"
    run = [sys.executable, "-m", "kk3evidence"]
    r = subprocess.run([*run, "merge", "-o", str(out), *NODES], capture_output=True, check=False)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([*run, "analyze", "--json", str(out)], capture_output=True, check=False)
    assert r.returncode == 3
    assert json.loads(r.stdout)["first_failure"]["node"] == "node1"


def test_cli_validate_reads_a_group_archive(tmp_path: Path) -> None:
    out = write_group_archive(NODES, tmp_path / "g.tar")
    r = subprocess.run(
        [sys.executable, "-m", "kk3evidence", "validate", "--json", str(out)],
        capture_output=True,
        check=False,
    )
    assert r.returncode == 0, r.stdout
    doc = json.loads(r.stdout)
    assert doc["valid"] is True and [n["node"] for n in doc["nodes"]] == ["node0.tar", "node1.tar"]
