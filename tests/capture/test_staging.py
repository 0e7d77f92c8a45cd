"""Each capture gets its own staging folder and a bundle name nobody else holds; a bundle is
never overwritten (SPEC §3)."""

from __future__ import annotations

import subprocess
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from progs.helpers import PY, base_env, own_lines, run_capture

from kk3evidence.bundle.archive import BundleWriter, open_bundle, validate
from kk3evidence.capture.staging import default_output, reserve
from kk3evidence.errors import BundleError, UsageError

NOW = datetime(2026, 12, 1, 3, 4, 5, tzinfo=UTC)


def test_captures_of_one_second_get_distinct_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    got: list[tuple[Path, Path]] = []
    lock = threading.Lock()

    def one() -> None:
        pair = reserve(None, None, NOW)
        with lock:
            got.append(pair)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    outputs = sorted(str(o) for o, _ in got)
    assert len(set(outputs)) == 8
    assert str(default_output(NOW)) in outputs
    assert "kk3-20261201-030405-8.tar" in outputs
    assert all(s.is_dir() and s.name == o.name + ".staging" for o, s in got)


def test_an_existing_bundle_name_is_skipped_by_default_and_refused_with_o(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    default_output(NOW).write_bytes(b"someone's bundle")
    out, _ = reserve(None, None, NOW)
    assert out.name == "kk3-20261201-030405-2.tar"
    with pytest.raises(UsageError, match="never overwritten"):
        reserve(default_output(NOW), None, NOW)


def test_a_staging_folder_in_use_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "run.tar"
    reserve(out, None, NOW)
    with pytest.raises(UsageError, match="already exists"):
        reserve(out, None, NOW)


def test_finalize_never_overwrites_a_bundle(tmp_path: Path) -> None:
    out = tmp_path / "run.tar"
    out.write_bytes(b"precious")
    writer = BundleWriter(tmp_path / "st")
    with pytest.raises(BundleError, match="never overwritten"):
        writer.finalize(out)
    assert out.read_bytes() == b"precious"
    assert (tmp_path / "st").is_dir()  # what was captured is kept for another try
    assert not list(tmp_path.glob("run.tar.partial*"))


def test_capture_onto_an_existing_file_is_refused_and_the_file_kept(tmp_path: Path) -> None:
    out = tmp_path / "run.tar"
    out.write_bytes(b"precious")
    ran = run_capture(out, [PY, "-c", "print('never run')"])
    assert ran.returncode == 2
    assert "never overwritten" in own_lines(ran.stderr)[0]
    assert b"never run" not in ran.stdout
    assert out.read_bytes() == b"precious"
    assert not (tmp_path / "run.tar.staging").exists()


@pytest.mark.slow
def test_eight_parallel_captures_without_o_give_eight_bundles_each_with_its_own_run(
    tmp_path: Path,
) -> None:
    prog = "import sys\nfor i in range(50): print('run', sys.argv[1], 'line', i, flush=True)"
    procs = [
        subprocess.Popen(
            [PY, "-m", "kk3evidence", "capture", "--no-probe", "--", PY, "-c", prog, f"R{n}"],
            cwd=tmp_path,
            env=base_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for n in range(8)
    ]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, errors
    bundles = sorted(tmp_path.glob("kk3-*.tar"))
    assert len(bundles) == 8
    assert not list(tmp_path.glob("*.staging"))
    seen: set[str] = set()
    ids: set[str] = set()
    for bundle in bundles:
        assert validate(bundle) == []
        with open_bundle(bundle) as b:
            log = b.read_bytes("logs/combined.log").decode()
            argv = b.launch["argv"] if b.launch else []
        runs = {line.split()[1] for line in log.splitlines() if line.startswith("run ")}
        assert runs == {argv[-1]}  # only its own run's lines
        assert log.count("\n") == 50
        seen |= runs
        ids.add(b.bundle_id)
    assert seen == {f"R{n}" for n in range(8)}
    assert len(ids) == 8
