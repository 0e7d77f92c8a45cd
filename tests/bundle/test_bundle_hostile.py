"""Bundles from others: every hostile or corrupt shape is refused cleanly, with a located reason,
exit 4, no traceback, and nothing written to disk."""

from __future__ import annotations

import gzip
import io
import json
import lzma
import os
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from bundle_factory import (
    TOP,
    RawMember,
    build_tar,
    dumps,
    manifest_doc,
    notes_doc,
    tar_bytes,
    valid_files,
    valid_raw_members,
    with_member,
    write_bundle,
)
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kk3evidence.bundle.archive import Limits, best_problem, open_bundle, validate
from kk3evidence.cli import main
from kk3evidence.errors import BundleError

Builder = Callable[[Path], Path]
CASES: dict[str, tuple[Builder, str, str | None]] = {}


def case(code: str, member: str | None) -> Callable[[Builder], Builder]:
    """Register a hostile bundle builder with the problem code and member it must produce."""

    def register(fn: Builder) -> Builder:
        CASES[fn.__name__] = (fn, code, member)
        return fn

    return register


def _raw(tmp: Path, members: list[RawMember], **kw: object) -> Path:
    return build_tar(tmp / "hostile.tar", members, **kw)  # type: ignore[arg-type]


def _with_notes(data: bytes) -> list[RawMember]:
    files = {**valid_files(), "notes.json": data}
    return valid_raw_members(files)


# --- member types and names --------------------------------------------------------------


@case("link", "kk3-test/logs/evil")
def symlink(tmp: Path) -> Path:
    m = RawMember(f"{TOP}/logs/evil", type=tarfile.SYMTYPE, linkname="/etc/passwd")
    return _raw(tmp, [*valid_raw_members(), m])


@case("link", "kk3-test/logs/hard")
def hardlink(tmp: Path) -> Path:
    m = RawMember(f"{TOP}/logs/hard", type=tarfile.LNKTYPE, linkname=f"{TOP}/launch.json")
    return _raw(tmp, [*valid_raw_members(), m])


@case("special-file", "kk3-test/logs/tty")
def char_device(tmp: Path) -> Path:
    m = RawMember(f"{TOP}/logs/tty", type=tarfile.CHRTYPE, devmajor=5, devminor=0)
    return _raw(tmp, [*valid_raw_members(), m])


@case("special-file", "kk3-test/logs/sda")
def block_device(tmp: Path) -> Path:
    m = RawMember(f"{TOP}/logs/sda", type=tarfile.BLKTYPE, devmajor=8, devminor=0)
    return _raw(tmp, [*valid_raw_members(), m])


@case("special-file", "kk3-test/logs/pipe")
def fifo(tmp: Path) -> Path:
    m = RawMember(f"{TOP}/logs/pipe", type=tarfile.FIFOTYPE)
    return _raw(tmp, [*valid_raw_members(), m])


@case("absolute-path", "/etc/cron.d/kk3")
def absolute_path(tmp: Path) -> Path:
    return _raw(tmp, [*valid_raw_members(), RawMember("/etc/cron.d/kk3", b"* * * * * root x\n")])


@case("path-traversal", "kk3-test/../../home/user/.bashrc")
def dot_dot(tmp: Path) -> Path:
    m = RawMember(f"{TOP}/../../home/user/.bashrc", b"evil\n")
    return _raw(tmp, [*valid_raw_members(), m])


@case("path-traversal", "kk3-test/logs/../../escape")
def dot_dot_via_pax_path(tmp: Path) -> Path:
    # The ustar name is harmless; the pax "path" record overrides it.
    m = RawMember(f"{TOP}/logs/ok.log", b"x", pax={"path": f"{TOP}/logs/../../escape"})
    return _raw(tmp, [*valid_raw_members(), m])


@case("duplicate-member", "kk3-test/launch.json")
def duplicate_names(tmp: Path) -> Path:
    members = valid_raw_members()
    return _raw(tmp, [*members, RawMember(f"{TOP}/launch.json", members[2].data)])


@case("unlisted-member", "logs/extra.log")
def unlisted_member(tmp: Path) -> Path:
    files = {**valid_files(), "logs/extra.log": b"smuggled\n"}
    return _raw(tmp, valid_raw_members(files, listed=valid_files()))


@case("unexpected-member", "bin/run.sh")
def member_outside_the_allowed_set(tmp: Path) -> Path:
    files = {**valid_files(), "bin/run.sh": b"#!/bin/sh\nrm -rf /\n"}
    return _raw(tmp, valid_raw_members(files, listed=valid_files()))


@case("missing-member", "requests/fixed.json")
def listed_member_missing(tmp: Path) -> Path:
    listed = {**valid_files(), "requests/fixed.json": b"{}"}
    return _raw(tmp, valid_raw_members(valid_files(), listed=listed))


@case("missing-member", "launch.json")
def required_member_missing(tmp: Path) -> Path:
    files = {k: v for k, v in valid_files().items() if k != "launch.json"}
    return _raw(tmp, valid_raw_members(files))


@case("multiple-top-folders", "other/launch.json")
def two_top_folders(tmp: Path) -> Path:
    return _raw(tmp, [*valid_raw_members(), RawMember("other/launch.json", b"{}")])


@case("outside-top-folder", "README.txt")
def member_outside_top_folder(tmp: Path) -> Path:
    return _raw(tmp, [*valid_raw_members(), RawMember("README.txt", b"hello")])


@case("bad-name", "kk3-test/logs/\\xff.log")
def non_utf8_name(tmp: Path) -> Path:
    return _raw(tmp, [*valid_raw_members(), RawMember(f"{TOP}/logs/\udcff.log", b"x")])


@case("bad-name", None)
def very_long_name(tmp: Path) -> Path:
    return _raw(tmp, [*valid_raw_members(), RawMember(f"{TOP}/logs/" + "a" * 2000, b"x")])


@case("bad-name", "kk3-test/logs/a\\x1b[2Jb")
def control_characters_in_name(tmp: Path) -> Path:
    return _raw(tmp, [*valid_raw_members(), RawMember(f"{TOP}/logs/a\x1b[2Jb", b"x")])


@case("special-file", "kk3-test/logs/sparse.log")
def gnu_sparse_member(tmp: Path) -> Path:
    m = RawMember(f"{TOP}/logs/sparse.log", type=tarfile.GNUTYPE_SPARSE, size=0)
    return _raw(tmp, [*valid_raw_members(), m])


@case("special-file", "kk3-test/logs/odd")
def unknown_member_type(tmp: Path) -> Path:
    m = RawMember(f"{TOP}/logs/odd", b"abc", type=b"Z", size=3)
    return _raw(tmp, [*valid_raw_members(), m])


@case("duplicate-member", "kk3-test/logs/a.log")
def names_differing_only_in_case(tmp: Path) -> Path:
    files = {**valid_files(), "logs/A.log": b"1", "logs/a.log": b"2"}
    return _raw(tmp, valid_raw_members(files))


@case("corrupt-archive", "kk3-test/logs/neg.log")
def negative_size_in_pax_record(tmp: Path) -> Path:
    m = RawMember(f"{TOP}/logs/neg.log", b"abc", pax={"size": "-100"})
    return _raw(tmp, [*valid_raw_members(), m])


@case("header-too-large", None)
def gnu_long_name_claims_gigabytes(tmp: Path) -> Path:
    info = tarfile.TarInfo("././@LongLink")
    info.type = tarfile.GNUTYPE_LONGNAME
    info.size = 3 * 2**30
    (tmp / "ln.tar").write_bytes(info.tobuf(tarfile.GNU_FORMAT) + b"a" * 10_000)
    return tmp / "ln.tar"


# --- sizes and counts ----------------------------------------------------------------------


@case("member-too-large", "notes.json")
def oversized_json_member(tmp: Path) -> Path:
    big = dumps(notes_doc()) + b" " * (16 * 1024 * 1024)
    return _raw(tmp, _with_notes(big))


@case("member-too-large", "logs/combined.log")
def declared_size_beyond_limit(tmp: Path) -> Path:
    members = valid_raw_members()
    members = with_member(members, 3, size=64 * 2**30)  # 64 GiB declared, little data present
    return _raw(tmp, members)


@case("too-many-members", None)
def too_many_members(tmp: Path) -> Path:
    extra = [RawMember(f"{TOP}/probes/p{i}", b"") for i in range(10_001)]
    return _raw(tmp, [*valid_raw_members(), *extra])


@case("compression-bomb", None)
def gzip_bomb(tmp: Path) -> Path:
    out = tmp / "bomb.tar.gz"
    files = valid_files()
    size = 300 * 2**20
    with open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        gz.write(tar_bytes(valid_raw_members(files)[:3], end_marker=False))
        info = tarfile.TarInfo(f"{TOP}/logs/combined.log")
        info.size = size
        gz.write(info.tobuf(tarfile.PAX_FORMAT))
        zeros = b"\0" * 2**20
        for _ in range(size // len(zeros)):
            gz.write(zeros)
        gz.write(b"\0" * 1024)
    return out


@case("header-too-large", None)
def pax_header_claims_gigabytes(tmp: Path) -> Path:
    info = tarfile.TarInfo("././@PaxHeader")
    info.type = tarfile.XHDTYPE
    info.size = 4 * 2**30
    head = info.tobuf(tarfile.USTAR_FORMAT)
    data = tar_bytes(valid_raw_members()[:1], end_marker=False) + head + b"\0" * 4096
    (tmp / "pax.tar").write_bytes(data)
    return tmp / "pax.tar"


# --- truncated, corrupt, not a tar ---------------------------------------------------------


@case("truncated", None)
def truncated_gzip(tmp: Path) -> Path:
    good = write_bundle(tmp / "good.tar.gz")
    data = good.read_bytes()
    good.unlink()
    (tmp / "cut.tar.gz").write_bytes(data[: len(data) // 2])
    return tmp / "cut.tar.gz"


@case("truncated", "logs/combined.log")
def truncated_tar_inside_member(tmp: Path) -> Path:
    data = tar_bytes(valid_raw_members())
    log_at = data.index(b"(APIServer pid=1)")
    (tmp / "cut.tar").write_bytes(data[: log_at + 20])
    return tmp / "cut.tar"


@case("truncated", None)
def truncated_tar_at_member_boundary(tmp: Path) -> Path:
    return _raw(tmp, valid_raw_members(), end_marker=False)


@case("corrupt-archive", "launch.json")
def corrupt_header_checksum(tmp: Path) -> Path:
    data = bytearray(tar_bytes(valid_raw_members()))
    at = data.index(f"{TOP}/launch.json".encode())
    data[at + 148 : at + 156] = b"0000000\0"  # wrong header checksum
    (tmp / "corrupt.tar").write_bytes(bytes(data))
    return tmp / "corrupt.tar"


@case("trailing-data", None)
def trailing_garbage_after_tar(tmp: Path) -> Path:
    return _raw(tmp, valid_raw_members(), trailing=b"\0" * 512 + b"#!/bin/sh\necho appended\n")


@case("corrupt-archive", None)
def gzip_with_garbage_after_stream(tmp: Path) -> Path:
    good = write_bundle(tmp / "good.tar.gz")
    data = good.read_bytes()
    good.unlink()
    (tmp / "junk.tar.gz").write_bytes(data + b"this is not gzip")
    return tmp / "junk.tar.gz"


@case("not-tar", None)
def plain_text(tmp: Path) -> Path:
    (tmp / "notes.tar").write_bytes(b"this is just some text\n" * 100)
    return tmp / "notes.tar"


@case("not-tar", None)
def short_garbage(tmp: Path) -> Path:
    (tmp / "x.tar").write_bytes(b"\x01\x02\x03")
    return tmp / "x.tar"


@case("not-tar", None)
def zip_named_tar(tmp: Path) -> Path:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("kk3-test/manifest.json", "{}")
    (tmp / "bundle.tar").write_bytes(buf.getvalue())
    return tmp / "bundle.tar"


@case("not-tar", None)
def gzip_of_text(tmp: Path) -> Path:
    (tmp / "x.tar.gz").write_bytes(gzip.compress(b"hello world\n" * 100))
    return tmp / "x.tar.gz"


@case("unsupported-compression", None)
def xz_compressed(tmp: Path) -> Path:
    (tmp / "x.tar.xz").write_bytes(lzma.compress(tar_bytes(valid_raw_members())))
    return tmp / "x.tar.xz"


@case("empty-file", None)
def zero_bytes(tmp: Path) -> Path:
    (tmp / "empty.tar").write_bytes(b"")
    return tmp / "empty.tar"


@case("not-a-file", None)
def a_directory(tmp: Path) -> Path:
    (tmp / "dir.tar").mkdir()
    return tmp / "dir.tar"


@case("not-a-file", None)
def a_named_pipe(tmp: Path) -> Path:
    # Opening a FIFO for reading would block forever: it must be refused before that.
    os.mkfifo(tmp / "pipe.tar")
    return tmp / "pipe.tar"


@case("not-found", None)
def missing_file(tmp: Path) -> Path:
    return tmp / "does-not-exist.tar"


@case("not-tar", None)
def only_end_of_archive_blocks(tmp: Path) -> Path:
    return _raw(tmp, [])


# --- manifest and JSON ---------------------------------------------------------------------


@case("missing-manifest", "manifest.json")
def no_manifest(tmp: Path) -> Path:
    return _raw(tmp, valid_raw_members()[1:])


@case("sha256-mismatch", "launch.json")
def wrong_sha256(tmp: Path) -> Path:
    files = valid_files()
    listed = {**files, "launch.json": files["launch.json"].replace(b"vllm", b"VLLM")}
    return _raw(tmp, valid_raw_members(files, listed=listed))


@case("size-mismatch", "logs/combined.log")
def wrong_size(tmp: Path) -> Path:
    files = valid_files()
    listed = {**files, "logs/combined.log": files["logs/combined.log"] + b"more"}
    return _raw(tmp, valid_raw_members(files, listed=listed))


@case("unsupported-version", "manifest.json")
def newer_major_version(tmp: Path) -> Path:
    files = valid_files()
    doc = manifest_doc(files, schema="kk3evidence/bundle/v2")
    return _raw(tmp, valid_raw_members(files, manifest=doc))


@case("unsupported-version", "launch.json")
def newer_member_version(tmp: Path) -> Path:
    files = valid_files()
    launch = json.loads(files["launch.json"])
    files["launch.json"] = dumps({**launch, "schema": "kk3evidence/launch/v7"})
    return _raw(tmp, valid_raw_members(files))


@case("json-too-deep", "notes.json")
def deeply_nested_json(tmp: Path) -> Path:
    return _raw(tmp, _with_notes(b"[" * 200_000 + b"]" * 200_000))


@case("json-too-deep", "notes.json")
def nested_beyond_limit_but_parsable(tmp: Path) -> Path:
    return _raw(
        tmp,
        _with_notes(b'{"schema":"kk3evidence/notes/v1","notes":' + b"[" * 100 + b"]" * 100 + b"}"),
    )


@case("json-too-large", "notes.json")
def json_with_a_million_values(tmp: Path) -> Path:
    return _raw(tmp, _with_notes(b"[" + b"0," * 1_000_001 + b"0]"))


@case("too-many-members", "manifest.json")
def manifest_lists_too_many_members(tmp: Path) -> Path:
    files = valid_files()
    doc = manifest_doc(files)
    doc["members"] += [
        {"name": f"probes/p{i}", "size": 0, "sha256": "0" * 64} for i in range(10_001)
    ]
    return _raw(tmp, valid_raw_members(files, manifest=doc))


@case("json-invalid", "manifest.json")
def manifest_not_json(tmp: Path) -> Path:
    members = valid_raw_members()
    return _raw(tmp, with_member(members, 0, data=b"{not json"))


@case("json-not-utf8", "notes.json")
def json_not_utf8(tmp: Path) -> Path:
    return _raw(tmp, _with_notes(b'{"schema": "kk3evidence/notes/v1", "notes": ["\xff"]}'))


@case("json-nonfinite", "notes.json")
def json_nan(tmp: Path) -> Path:
    return _raw(tmp, _with_notes(b'{"schema": "kk3evidence/notes/v1", "notes": [], "x": NaN}'))


@case("json-duplicate-key", "notes.json")
def json_duplicate_keys(tmp: Path) -> Path:
    return _raw(tmp, _with_notes(b'{"schema": "kk3evidence/notes/v1", "schema": "x"}'))


@case("schema", "launch.json")
def schema_violation(tmp: Path) -> Path:
    files = valid_files()
    launch = json.loads(files["launch.json"])
    files["launch.json"] = dumps({**launch, "exit_code": "boom"})
    return _raw(tmp, valid_raw_members(files))


@case("duplicate-member", "launch.json")
def listed_twice(tmp: Path) -> Path:
    files = valid_files()
    doc = manifest_doc(files)
    doc["members"].append(dict(doc["members"][1]))
    return _raw(tmp, valid_raw_members(files, manifest=doc))


# --- the tests -------------------------------------------------------------------------------


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cwd and TMPDIR; the test asserts they stay empty."""
    work = tmp_path / "cwd"
    work.mkdir()
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
    return tmp_path


def _snapshot(root: Path) -> list[tuple[str, int]]:
    return sorted(
        (str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1) for p in root.rglob("*")
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_bundle_is_rejected_with_a_located_reason(sandbox: Path, name: str) -> None:
    build, code, member = CASES[name]
    made = sandbox / "made"
    made.mkdir()
    path = build(made)
    before = _snapshot(sandbox)

    problems = validate(path)
    codes = [p.code for p in problems]
    assert code in codes, f"{name}: expected {code}, got {[str(p) for p in problems]}"
    best = best_problem(problems)
    assert best.code == code, f"{name}: most relevant is {best} (all: {codes})"
    if member is not None:
        assert best.member == member, f"{name}: {best}"
    assert "\n" not in str(best)

    with pytest.raises(BundleError) as err:
        open_bundle(path)
    assert "\n" not in err.value.message
    assert err.value.problems

    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 4, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert f"[{code}]" in result.output
    if member is not None:
        assert member in result.output
    summary = result.output.strip().splitlines()[-1]
    assert "INVALID" in summary

    json_result = CliRunner().invoke(main, ["validate", "--json", str(path)])
    assert json_result.exit_code == 4
    report = json.loads(json_result.output)
    assert report["valid"] is False
    assert code in {p["code"] for p in report["problems"]}

    assert _snapshot(sandbox) == before, "reading a bundle wrote something to disk"


def test_a_flipped_byte_in_any_member_names_that_member(tmp_path: Path) -> None:
    good = write_bundle(tmp_path / "good.tar")
    data = good.read_bytes()
    with tarfile.open(good) as tf:
        spans = [(m.name.split("/", 1)[1], m.offset_data, m.size) for m in tf.getmembers()]
    assert len(spans) >= 6
    for name, offset, size in spans:
        for where in {0, size // 2, size - 1}:
            bad = bytearray(data)
            bad[offset + where] ^= 0x01
            path = tmp_path / "flipped.tar"
            path.write_bytes(bytes(bad))
            problems = validate(path)
            assert problems, f"flip in {name}@{where} not detected"
            assert best_problem(problems).member == name, (name, where, [str(p) for p in problems])


def test_every_problem_is_listed_not_just_the_first(tmp_path: Path) -> None:
    files = valid_files()
    listed = {
        **files,
        "launch.json": files["launch.json"].replace(b"vllm", b"VLLM"),
        "logs/combined.log": b"other",
    }
    members = valid_raw_members({**files, "logs/x.log": b"x"}, listed=listed)
    path = build_tar(
        tmp_path / "multi.tar",
        [*members, RawMember(f"{TOP}/logs/l", type=tarfile.SYMTYPE, linkname="x")],
    )
    codes = sorted(p.code for p in validate(path))
    assert codes == ["link", "sha256-mismatch", "size-mismatch", "unlisted-member"]


def test_limits_are_configurable(tmp_path: Path) -> None:
    path = write_bundle(tmp_path / "run.tar", log=b"x" * 5000)
    assert validate(path) == []
    small = Limits(max_member_bytes=1000)
    assert [p.code for p in validate(path, limits=small)] == ["member-too-large", "missing-member"]


def test_leading_dot_slash_names_from_other_tar_tools_are_accepted(tmp_path: Path) -> None:
    members = [RawMember("./" + m.name, m.data) for m in valid_raw_members()]
    path = build_tar(tmp_path / "dots.tar", [RawMember("./", type=tarfile.DIRTYPE), *members])
    assert validate(path) == []


def test_directory_entries_for_bundle_folders_are_accepted(tmp_path: Path) -> None:
    members = valid_raw_members()
    dirs = [
        RawMember(f"{TOP}/", type=tarfile.DIRTYPE),
        RawMember(f"{TOP}/logs/", type=tarfile.DIRTYPE),
    ]
    path = build_tar(tmp_path / "dirs.tar", [dirs[0], members[0], dirs[1], *members[1:]])
    assert validate(path) == []


def test_unknown_major_version_message_says_to_upgrade(tmp_path: Path) -> None:
    path = newer_major_version(tmp_path)
    with pytest.raises(BundleError) as err:
        open_bundle(path)
    assert (
        "bundle schema kk3evidence/bundle/v2 is newer than this kk3evidence (reads v1); "
        "upgrade kk3evidence"
    ) in err.value.message
    # Only the version problem: no cascade of schema complaints.
    assert [p.code for p in err.value.problems] == ["unsupported-version"]  # type: ignore[attr-defined]


def test_newer_minor_version_is_read(tmp_path: Path) -> None:
    files = valid_files()
    doc = manifest_doc(files, schema="kk3evidence/bundle/v1.3", future_field={"x": 1})
    path = build_tar(tmp_path / "minor.tar", valid_raw_members(files, manifest=doc))
    assert validate(path) == []


@pytest.mark.slow
def test_validate_as_a_real_subprocess_never_prints_a_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    for build in (symlink, gzip_with_garbage_after_stream, deeply_nested_json, a_directory):
        out_dir = tmp_path / build.__name__
        out_dir.mkdir()
        path = build(out_dir)
        proc = subprocess.run(
            [sys.executable, "-m", "kk3evidence", "validate", str(path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert proc.returncode == 4, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stdout + proc.stderr
    good = write_bundle(tmp_path / "good.tar.gz")
    proc = subprocess.run(
        [sys.executable, "-m", "kk3evidence", "validate", str(good)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "valid" in proc.stdout


def test_repetitive_real_logs_are_not_mistaken_for_a_bomb(tmp_path: Path) -> None:
    line = (
        "(APIServer pid=15538) WARNING 11-30 01:47:%02d [system_utils.py:255] "
        "Waiting for engine core to start, retrying\n"
    )
    log = "".join(line % (i // 50 % 60) for i in range(80_000)).encode()
    path = write_bundle(tmp_path / "repetitive.tar.gz", log=log)
    assert path.stat().st_size * 100 < len(log)  # really compresses a lot
    small_grace = Limits(ratio_grace_bytes=2**20)
    assert validate(path, limits=small_grace) == []

    bomb = write_bundle(tmp_path / "zeros.tar.gz", log=b"\0" * len(log))
    assert [p.code for p in validate(bomb, limits=small_grace)] == ["compression-bomb"]


_GOOD: dict[str, bytes] = {}


def _good_bytes(kind: str) -> bytes:
    if kind not in _GOOD:
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            _GOOD[kind] = write_bundle(Path(d) / f"good{kind}").read_bytes()
    return _GOOD[kind]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from([".tar", ".tar.gz"]),
    edits=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), max_size=4),
    cut=st.one_of(st.none(), st.floats(0, 1)),
)
def test_mutated_bundles_never_crash_the_reader(
    kind: str, edits: list[tuple[float, int]], cut: float | None
) -> None:
    import tempfile

    data = bytearray(_good_bytes(kind))
    for where, value in edits:
        data[min(int(where * len(data)), len(data) - 1)] = value
    if cut is not None:
        data = data[: int(cut * len(data))]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"mutated{kind}"
        path.write_bytes(bytes(data))
        problems = validate(path)
        for p in problems:
            assert "\n" not in str(p) and p.code
        if problems:
            with pytest.raises(BundleError):
                open_bundle(path)
        else:
            with open_bundle(path) as b:
                for _ in b.iter_log_lines():
                    pass
        assert sorted(x.name for x in Path(d).iterdir()) == [path.name]


def test_integral_float_sizes_still_verify_members(tmp_path: Path) -> None:
    files = valid_files()
    files["launch.json"] = dumps({**json.loads(files["launch.json"]), "exit_code": "bad"})
    doc = manifest_doc(files)
    for entry in doc["members"]:
        entry["size"] = float(entry["size"])
    path = build_tar(tmp_path / "floats.tar", valid_raw_members(files, manifest=doc))
    assert [(p.code, p.member) for p in validate(path)] == [("schema", "launch.json")]


def test_json_members_are_bounded_in_total(tmp_path: Path) -> None:
    files = {**valid_files(), **{f"requests/r{i}.json": b"{}" * 300 for i in range(5)}}
    path = build_tar(tmp_path / "json.tar", valid_raw_members(files))
    codes = [p.code for p in validate(path, limits=Limits(max_json_total_bytes=2000))]
    assert codes == ["archive-too-large"]


def test_each_header_reports_only_its_first_failing_check_in_order(tmp_path: Path) -> None:
    """The archive pass runs one check after another on each header (name, type, uniqueness,
    top folder, member name, size, data) and the first that fails decides: a header that
    breaks several rules is reported once, by the earliest check, and the pass goes on."""
    big = b"x" * 2000
    members = [
        *valid_raw_members(),
        # name before type: a link whose name escapes is a path-traversal
        RawMember(f"{TOP}/../escape", type=tarfile.SYMTYPE, linkname="/etc/passwd"),
        # type before member name: a link under a name no bundle allows is a link
        RawMember(f"{TOP}/odd.bin", type=tarfile.SYMTYPE, linkname="x"),
        # uniqueness before size: the second copy, also too large, is a duplicate
        RawMember(f"{TOP}/logs/combined.log", big),
        # member name before size: an unknown member is unexpected, however large
        RawMember(f"{TOP}/odd.txt", big),
    ]
    path = build_tar(tmp_path / "order.tar", members)
    got = [(p.code, p.member) for p in validate(path, limits=Limits(max_member_bytes=1000))]
    assert got == [
        ("path-traversal", f"{TOP}/../escape"),
        ("link", f"{TOP}/odd.bin"),
        ("duplicate-member", f"{TOP}/logs/combined.log"),
        ("unexpected-member", "odd.txt"),
    ]
