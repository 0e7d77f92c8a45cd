"""Ray session logs into ``logs/extra/ray/`` (bounded, redacted, analysed with the rest).

No Ray cluster runs here: the session folder is laid out as Ray documents it
(``session_latest/logs/{worker-*.out,worker-*.err,raylet.out,dashboard.log}``) and the worker's
output is a real vLLM Ray worker's (corpus/issue-4327-fp8-unsupported-ray-worker, from
https://github.com/vllm-project/vllm/issues/4327).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kk3evidence.bundle.archive import open_bundle, validate
from kk3evidence.capture import raylogs

REPO = Path(__file__).resolve().parents[2]
WORKER_LOG = (REPO / "corpus" / "issue-4327-fp8-unsupported-ray-worker" / "output.log").read_bytes()
SECRET = b"hf_raySecretToken0123456789abcdefgh"


def _session(tmp: Path) -> Path:
    logs = tmp / "ray" / "session_latest" / "logs"
    logs.mkdir(parents=True)
    (logs / "worker-4f2a-01000000-2202490.err").write_bytes(WORKER_LOG)
    (logs / "worker-4f2a-01000000-2202490.out").write_bytes(b"token " + SECRET + b"\n")
    (logs / "raylet.out").write_bytes(b"[2024-04-24 16:06:30,000 I 1 1] raylet started\n" * 5)
    (logs / "dashboard.log").write_bytes(b"not wanted\n")
    old = logs / "worker-0000-old.err"
    old.write_bytes(b"an earlier run\n")
    os.utime(old, (1_000_000, 1_000_000))
    return logs


def test_collect_takes_this_runs_worker_and_raylet_logs_bounded(tmp_path: Path) -> None:
    logs = _session(tmp_path)
    (logs / "raylet.err").write_bytes(b"x" * 50 + b"\n" + b"y" * 200 + b"\n")
    written: dict[str, bytes] = {}
    notes: list[tuple[str, str]] = []
    members = raylogs.collect(
        logs,
        since=2_000_000,
        write=written.__setitem__,
        redact=lambda data: data.replace(SECRET, b"<redacted>"),
        note=lambda what, why: notes.append((what, why)),
        limits=raylogs.RayLimits(per_file=220, total=10_000, max_files=10),
    )
    names = {m.rsplit("/", 1)[1] for m in members}
    assert names == {
        "worker-4f2a-01000000-2202490.err",
        "worker-4f2a-01000000-2202490.out",
        "raylet.out",
        "raylet.err",
    }
    assert all(m.startswith("logs/extra/ray/") for m in members)
    assert SECRET not in b"".join(written.values())
    assert written["logs/extra/ray/raylet.err"] == b"y" * 200 + b"\n"  # whole last lines only
    assert any("only the last" in why for _w, why in notes)


def test_no_session_folder_is_recorded_not_raised(tmp_path: Path) -> None:
    notes: list[tuple[str, str]] = []
    members = raylogs.collect(
        tmp_path / "none",
        0,
        write=lambda m, d: None,
        redact=lambda d: d,
        note=lambda w, y: notes.append((w, y)),
    )
    assert members == [] and "no Ray session logs" in notes[0][1]


def test_uses_ray() -> None:
    assert raylogs.uses_ray(["vllm", "serve", "m", "--distributed-executor-backend", "ray"], {})
    assert raylogs.uses_ray(["vllm", "serve", "m"], {"RAY_ADDRESS": "10.0.0.5:6379"})
    assert not raylogs.uses_ray(["vllm", "serve", "m", "-tp", "2"], {})


def test_capture_puts_ray_logs_in_the_bundle_and_analyses_them(tmp_path: Path) -> None:
    # the "server" writes its Ray worker log during the run, as a Ray worker would
    logs = tmp_path / "ray" / "session_latest" / "logs"
    logs.mkdir(parents=True)
    source = REPO / "corpus" / "issue-4327-fp8-unsupported-ray-worker" / "output.log"
    prog = (
        "import pathlib, sys; "
        f"pathlib.Path({str(logs / 'worker-aa-01-7.err')!r}).write_bytes("
        f"pathlib.Path({str(source)!r}).read_bytes()); "
        "print('head node: waiting for workers')"
    )
    bundle = tmp_path / "ray.tar"
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "RAY_TMPDIR": str(tmp_path),
        "RAY_ADDRESS": "127.0.0.1:6379",
        "HF_TOKEN": SECRET.decode(),
    }
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "kk3evidence",
            "capture",
            "-o",
            str(bundle),
            "--no-probe",
            "--",
            sys.executable,
            "-c",
            prog,
        ],
        capture_output=True,
        env=env,
        check=False,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert validate(bundle) == []
    with open_bundle(bundle) as b:
        assert "logs/extra/ray/worker-aa-01-7.err" in b.names()
        assert b.analysis is not None
        (extra,) = b.analysis["extra_logs"]
        assert extra["member"] == "logs/extra/ray/worker-aa-01-7.err"
        assert extra["first_failure"] is not None
        assert "fp8" in json.dumps(extra["first_failure"])
