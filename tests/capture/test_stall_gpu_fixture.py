"""A stall captured on a real NVIDIA H200 (docs/gpu-verification.md, issue 15): rank 0 of a
world of 2 holds 4 GiB and waits for rank 1, which never starts. The bundle stays valid and
says what the real GPU machine said."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from kk3evidence.analysis.engine import analyze
from kk3evidence.bundle.archive import open_bundle, validate

BUNDLE = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "stall-h200" / (
    "stall-rank1-missing.tar"
)


def _snapshot(n: int) -> dict[str, object]:
    with tarfile.open(BUNDLE) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(f"stalls/snapshot-{n}.json"))
        fh = tar.extractfile(member)
        assert fh is not None
        doc: dict[str, object] = json.load(fh)
        return doc


def test_the_h200_stall_bundle_is_valid_and_analyses_as_a_comm_group_hang() -> None:
    assert validate(BUNDLE) == []
    a = analyze(BUNDLE)
    assert a.first_failure is not None
    assert (a.first_failure.stage, a.first_failure.category, a.first_failure.basis) == (
        "comm_group", "hang", "stall")
    assert a.stall is not None and a.stall.get("missing_ranks") == [1]
    with open_bundle(BUNDLE) as b:
        launch = b.launch
    assert launch is not None
    stop = launch["stop"]
    assert isinstance(stop, dict) and stop["reason"] == "stall"
    assert [s["signal"] for s in stop["sent"]] == ["SIGINT", "SIGTERM"]  # type: ignore[index]


def test_the_snapshots_hold_py_spy_stacks_in_the_rendezvous_and_nvml_state() -> None:
    for n in (1, 2):
        snap = _snapshot(n)
        procs = snap["processes"]
        assert isinstance(procs, list)
        frames = [f["function"] for f in procs[0]["stacks"][0]["frames"]]
        assert frames[0] == "_create_c10d_store" and "init_process_group" in frames
        gpu = snap["gpu"]
        assert isinstance(gpu, dict) and gpu["available"] is True
        dev = gpu["devices"][0]
        assert dev["memory_used_bytes"] > 4 << 30  # the 4 GiB rank 0 holds, and its context
        assert procs[0]["pid"] in dev["processes"]
