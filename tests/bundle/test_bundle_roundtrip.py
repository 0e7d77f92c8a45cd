"""Writing a bundle with BundleWriter and reading it back with open_bundle."""

from __future__ import annotations

import gzip
import io
import json
import math
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import pytest
from bundle_factory import (
    CREATED,
    SAMPLE_LOG,
    analysis_doc,
    launch_doc,
    request_doc,
    write_bundle,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kk3evidence.bundle.archive import (
    BundleWriter,
    Limits,
    is_staging_dir,
    open_bundle,
    seal,
    validate,
)
from kk3evidence.errors import BundleError


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz", ".tgz"])
def test_written_bundle_validates_and_reads_back(tmp_path: Path, suffix: str) -> None:
    out = write_bundle(tmp_path / f"run{suffix}", documents={"analysis.json": analysis_doc()})
    assert validate(out) == []
    with open_bundle(out) as b:
        assert b.bundle_id == "test"
        assert b.top_folder == "kk3-test"
        assert b.compression == ("gzip" if suffix != ".tar" else "tar")
        assert b.launch == launch_doc()
        assert b.fingerprint is not None and b.fingerprint["gpus"]["source"] == "nvml"
        assert b.notes is not None and b.notes["notes"]
        assert b.analysis == analysis_doc()
        assert b.requests() == [request_doc()]
        assert b.metrics("before") is not None and "vllm:x 0" in (b.metrics("before") or "")
        assert b.metrics("after") is None
        assert b"".join(b.iter_log_lines()) == SAMPLE_LOG
        assert b.read_bytes("logs/combined.log") == SAMPLE_LOG
        with b.open_member("logs/combined.log") as fp:
            assert fp.read(5) == SAMPLE_LOG[:5]
        assert b.manifest["sealed_from_staging"] is False
        assert {m["name"] for m in b.manifest["members"]} == set(b.names())


def test_gzip_output_is_really_gzip_and_tar_is_plain(tmp_path: Path) -> None:
    gz = write_bundle(tmp_path / "a.tar.gz")
    plain = write_bundle(tmp_path / "b.tar")
    assert gz.read_bytes()[:2] == b"\x1f\x8b"
    assert plain.read_bytes()[257:262] == b"ustar"


def test_layout_has_one_top_folder_and_manifest_first(tmp_path: Path) -> None:
    out = write_bundle(tmp_path / "run.tar")
    with tarfile.open(out) as tf:
        names = tf.getnames()
        infos = tf.getmembers()
    assert names[0] == "kk3-test/manifest.json"
    # Small members first, the big log last (cheap random access in a .tar.gz).
    assert names[1:4] == [
        "kk3-test/fingerprint.json",
        "kk3-test/launch.json",
        "kk3-test/notes.json",
    ]
    assert names[-1] == "kk3-test/logs/combined.log"
    assert all(n.startswith("kk3-test/") for n in names)
    assert all(i.isreg() and i.mode == 0o644 and i.uid == 0 for i in infos)
    assert {i.mtime for i in infos} == {int(CREATED.timestamp())}


def test_same_inputs_give_byte_identical_bundles(tmp_path: Path) -> None:
    a = write_bundle(tmp_path / "a.tar.gz")
    b = write_bundle(tmp_path / "b.tar.gz")
    assert a.read_bytes() == b.read_bytes()


def test_finalize_is_atomic_and_removes_staging(tmp_path: Path) -> None:
    out = write_bundle(tmp_path / "run.tar")
    leftovers = sorted(p.name for p in tmp_path.iterdir())
    assert leftovers == ["run.tar"]
    assert not list(tmp_path.glob("run.tar.partial*"))
    assert out.stat().st_size > 0


def test_open_stream_appends_and_never_holds_the_log(tmp_path: Path) -> None:
    w = BundleWriter(tmp_path / "stg", created=CREATED)
    with w.open_stream("logs/combined.log") as fp:
        fp.write(b"one\n")
    fp2 = w.open_stream("logs/combined.log")
    fp2.write(b"two\n")
    fp2.flush()
    assert (tmp_path / "stg" / "logs" / "combined.log").read_bytes() == b"one\ntwo\n"
    out = w.finalize(tmp_path / "run.tar")  # closes fp2
    assert fp2.closed
    with open_bundle(out) as b:
        assert list(b.iter_log_lines()) == [b"one\n", b"two\n"]


def test_missing_required_members_get_stubs_recorded_as_not_collected(tmp_path: Path) -> None:
    w = BundleWriter(tmp_path / "stg", created=CREATED)
    out = w.finalize(tmp_path / "run.tar")
    with open_bundle(out) as b:
        assert b.launch is not None and b.launch["argv"] == []
        assert b.fingerprint is not None and b.fingerprint["gpus"]["source"] == "error"
        what = {n["what"] for n in b.not_collected}
        assert {"launch.json", "fingerprint.json", "logs/combined.log"} <= what


def test_write_json_refuses_a_document_that_breaks_its_schema(tmp_path: Path) -> None:
    w = BundleWriter(tmp_path / "stg")
    with pytest.raises(BundleError, match=r"launch\.json .*exit_code"):
        w.write_json("launch.json", launch_doc(exit_code="one"))
    with pytest.raises(BundleError, match=r"not valid|cannot write JSON"):
        w.write_json("notes.json", {"schema": "kk3evidence/notes/v1", "x": math.nan})


@pytest.mark.parametrize(
    "name", ["../evil", "/abs.json", "manifest.json", "other.json", "logs/../x", "logs/.hidden"]
)
def test_writer_refuses_bad_member_names(tmp_path: Path, name: str) -> None:
    w = BundleWriter(tmp_path / "stg")
    with pytest.raises(BundleError):
        w.add_bytes(name, b"x")


def test_writer_refuses_a_non_empty_folder_without_marker(tmp_path: Path) -> None:
    (tmp_path / "stg").mkdir()
    (tmp_path / "stg" / "precious.txt").write_text("keep me")
    with pytest.raises(BundleError, match="not empty"):
        BundleWriter(tmp_path / "stg")
    assert (tmp_path / "stg" / "precious.txt").read_text() == "keep me"


def test_not_collected_and_losses_reach_the_manifest(tmp_path: Path) -> None:
    w = BundleWriter(tmp_path / "stg", created=CREATED)
    w.write_json("launch.json", launch_doc())
    w.add_not_collected("gpus", "pynvml: NVML Shared Library Not Found")
    w.add_loss("logs/combined.log", "disk full", bytes=10, lines=1)
    out = w.finalize(tmp_path / "run.tar")
    with open_bundle(out) as b:
        assert {"what": "gpus", "reason": "pynvml: NVML Shared Library Not Found"} in (
            b.not_collected
        )
        assert b.manifest["losses"][0]["bytes"] == 10


def test_staging_marker_is_recognised(tmp_path: Path) -> None:
    BundleWriter(tmp_path / "stg")
    assert is_staging_dir(tmp_path / "stg")
    assert not is_staging_dir(tmp_path)


def test_iter_log_lines_splits_only_on_newline_and_cuts_huge_lines(tmp_path: Path) -> None:
    log = b"a\rb\n" + b"x" * 5000 + b"\n" + b"y" * 3000 + b"\nmiddle\n" + b"z" * 4096 + b"tail"
    out = write_bundle(tmp_path / "run.tar", log=log)
    with open_bundle(out, limits=Limits(max_line_bytes=1024)) as b:
        lines = list(b.iter_log_lines())
    # a huge line's head comes out and the rest is skipped: line numbers stay the file's
    assert lines == [b"a\rb\n", b"x" * 1024 + b"\n", b"y" * 1024 + b"\n", b"middle\n", b"z" * 1024]
    assert max(len(x) for x in lines) <= 1025


def test_open_member_detects_a_file_changed_after_opening(tmp_path: Path) -> None:
    out = write_bundle(tmp_path / "run.tar")
    b = open_bundle(out)
    data = bytearray(out.read_bytes())
    data[-3000] ^= 0xFF
    out.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="changed"):
        b.read_bytes("logs/combined.log")


def test_streaming_read_reverifies_sha256(tmp_path: Path) -> None:
    # Same size and mtime are not enough to fool the reader: content is hashed again.
    out = write_bundle(tmp_path / "run.tar")
    b = open_bundle(out)
    raw = out.read_bytes()
    off = raw.index(b"last line without newline")
    st = out.stat()
    tampered = raw[:off] + b"L" + raw[off + 1 :]
    out.write_bytes(tampered)
    import os

    os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
    b._file_id = type(b._file_id).of(out.stat())  # pretend the identity check passed
    with pytest.raises(BundleError, match="sha256"):
        list(b.iter_log_lines())


# --- seal ---------------------------------------------------------------------------------


def test_seal_turns_a_killed_capture_into_a_valid_bundle(tmp_path: Path) -> None:
    stg = tmp_path / "stg"
    w = BundleWriter(stg, created=CREATED)
    fp = w.open_stream("logs/combined.log")
    fp.write(b"INFO starting\nINFO loading weights 3")  # cut mid-line
    fp.flush()
    lines = w.open_stream("logs/lines.tsv")
    lines.write(b"offset\tstream\twall_ns\tmono_ns\n0\tout\t1\t1\n14\tou")
    lines.flush()
    # ... the capture process dies here: no launch.json, no fingerprint.json, no finalize (the
    # kernel closes a dead process's files; closing them here does what the kernel would).
    fp.close()
    lines.close()
    out = seal(stg, tmp_path / "run.tar")
    assert validate(out) == []
    with open_bundle(out) as b:
        assert b.manifest["sealed_from_staging"] is True
        assert b"".join(b.iter_log_lines()).endswith(b"loading weights 3")
        assert b.read_bytes("logs/lines.tsv").endswith(b"0\tout\t1\t1\n")
        what = {n["what"] for n in b.not_collected}
        assert {"launch.json", "fingerprint.json"} <= what
    assert stg.is_dir()  # kept unless asked


@pytest.mark.parametrize(
    ("log", "tail", "expected"),
    [
        # capture died with "line 3" still waiting for its newline: the tail is appended
        (b"a\nline 2\n", b"9\nline 3", b"a\nline 2\nline 3"),
        # capture died after writing the completed line but before removing the tail
        (b"a\nline 3 done\n", b"2\nline 3", b"a\nline 3 done\n"),
        # ... with a line of the other stream written in between
        (b"a\nerr\nline 3 done\n", b"2\nline 3", b"a\nerr\nline 3 done\n"),
        # a tail without its offset header is not trusted
        (b"a\n", b"garbage", b"a\n"),
    ],
)
def test_seal_appends_unfinished_tails_and_drops_stale_ones(
    tmp_path: Path, log: bytes, tail: bytes, expected: bytes
) -> None:
    stg = tmp_path / "stg"
    w = BundleWriter(stg, created=CREATED)
    fp = w.open_stream("logs/combined.log")
    fp.write(log)
    fp.close()  # the capture died; its files are closed
    (stg / "logs" / "combined.log.partial-0").write_bytes(tail)
    out = seal(stg, tmp_path / "run.tar")
    assert validate(out) == []
    with open_bundle(out) as b:
        assert b"".join(b.iter_log_lines()) == expected
    assert not (stg / "logs" / "combined.log.partial-0").exists()


def test_seal_keeps_an_early_launch_json_and_lists_found_placeholders(tmp_path: Path) -> None:
    stg = tmp_path / "stg"
    w = BundleWriter(stg, created=CREATED)
    w.write_json("launch.json", launch_doc(ended_at=None, exit_code=None))
    with w.open_stream("logs/combined.log") as fp:
        fp.write(b"token <redacted:HF_TOKEN#1> used\n")
    out = seal(stg, tmp_path / "run.tar.gz")
    with open_bundle(out) as b:
        assert b.launch is not None and b.launch["argv"][0] == "vllm"
        phs = {r["placeholder"] for r in b.redactions}
        assert "<redacted:HF_TOKEN#1>" in phs


def test_seal_moves_an_invalid_json_member_aside(tmp_path: Path) -> None:
    stg = tmp_path / "stg"
    BundleWriter(stg, created=CREATED)
    (stg / "notes.json").write_bytes(b'{"schema": "kk3evidence/notes/v1", "notes": [')
    out = seal(stg, tmp_path / "run.tar")
    with open_bundle(out) as b:
        assert b.notes is None
        assert b.read_bytes("probes/unsealed-notes.json").startswith(b'{"schema"')


@pytest.mark.parametrize("kind", ["missing", "file", "plain-dir"])
def test_seal_refuses_what_is_not_a_staging_folder(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "x"
    if kind == "file":
        target.write_text("hi")
    elif kind == "plain-dir":
        target.mkdir()
    with pytest.raises(BundleError):
        seal(target, tmp_path / "out.tar")
    assert not (tmp_path / "out.tar").exists()


# --- property tests -------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)

log_chunks = st.lists(
    st.one_of(
        st.binary(max_size=200),
        st.sampled_from(
            [b"\r", b"\n", b"\r\n", b"\x00", b"\x1b[31m", b"\x1b[0m", b"\xff\xfe", b"\xc3\x28"]
        ),
        st.integers(min_value=1, max_value=300_000).map(lambda n: b"y" * n),
    ),
    max_size=20,
).map(b"".join)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=json_values, notes=st.lists(st.text(), max_size=5), log=log_chunks, gz=st.booleans())
def test_round_trip_of_arbitrary_json_and_log_bytes(
    body: Any, notes: list[str], log: bytes, gz: bool
) -> None:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / ("run.tar.gz" if gz else "run.tar")
        req = request_doc(request_body=body, response_body={"echo": body})
        write_bundle(
            out,
            log=log,
            documents={
                "requests/fixed.json": req,
                "notes.json": {"schema": "kk3evidence/notes/v1", "notes": notes, "changes": []},
            },
        )
        assert validate(out) == []
        with open_bundle(out) as b:
            assert b.requests() == [json.loads(json.dumps(req))]
            assert b.notes is not None and b.notes["notes"] == notes
            lines = list(b.iter_log_lines())
            assert b"".join(lines) == log
            assert all(x.endswith(b"\n") for x in lines[:-1])
            assert all(b"\n" not in x[:-1] for x in lines)


@settings(max_examples=25, deadline=None)
@given(log=log_chunks)
def test_log_bytes_survive_gzip_exactly(log: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        out = write_bundle(Path(d) / "run.tgz", log=log)
        with gzip.open(out) as gz, tarfile.open(fileobj=io.BytesIO(gz.read())) as tf:
            member = tf.extractfile("kk3-test/logs/combined.log")
            assert member is not None and member.read() == log


@pytest.mark.skipif(shutil.which("tar") is None, reason="no tar program")
@pytest.mark.parametrize(
    "args",
    [
        ["czf", "re.tar.gz", "kk3-test"],
        ["cf", "re.tar", "-C", ".", "."],
        ["--format=posix", "-cf", "re.tar", "kk3-test"],
    ],
)
def test_a_bundle_extracted_and_repacked_with_gnu_tar_still_validates(
    tmp_path: Path, args: list[str]
) -> None:
    out = write_bundle(tmp_path / "run.tar")
    work = tmp_path / "x"
    work.mkdir()
    subprocess.run(["tar", "xf", str(out)], cwd=work, check=True, capture_output=True)
    subprocess.run(["tar", *args], cwd=work, check=True, capture_output=True)
    repacked = work / args[args.index("-cf") + 1 if "-cf" in args else 1]
    assert validate(repacked) == []
    with open_bundle(repacked) as b:
        assert b"".join(b.iter_log_lines()) == SAMPLE_LOG
