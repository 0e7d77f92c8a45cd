"""Group analysis over the bundles of real two-node CPU starts of vLLM 0.32.0 on one host
(``tests/data/realruns/group_*``, recorded by ``tests/e2e/twonode.py``; host paths rewritten):
``healthy`` (both nodes up, the fixed request answered), ``killed`` (node 1's vLLM SIGKILLed
while loading the model), ``env`` (node 1 with an extra ``VLLM_*`` variable).
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kk3evidence._resources import read_text
from kk3evidence.analysis import group
from kk3evidence.errors import InputError

DATA = Path(__file__).resolve().parents[1] / "data" / "realruns"


def _paths(run: str) -> list[str]:
    return [str(DATA / f"group_{run}" / f"node{i}.tar") for i in (0, 1)]


@pytest.fixture(scope="module")
def healthy() -> group.GroupAnalysis:
    return group.analyze_group(_paths("healthy"))


@pytest.fixture(scope="module")
def killed() -> group.GroupAnalysis:
    return group.analyze_group(_paths("killed"))


def test_healthy_group_has_no_failure_and_one_timeline(healthy: group.GroupAnalysis) -> None:
    assert healthy.first_failure is None
    assert healthy.consistency == ()
    nodes = {e.node for e in healthy.timeline}
    assert nodes == {"node0", "node1"}
    times = [e.t for e in healthy.timeline]
    assert times == sorted(times)
    names = [e.rule for e in healthy.timeline if e.node == "node0"]
    assert names[-1] == "milestone:api-ready"


def test_offset_on_one_host_is_within_its_bound(
    healthy: group.GroupAnalysis, killed: group.GroupAnalysis
) -> None:
    # both "nodes" share one clock: the true offset is 0, the estimate must allow it
    for g in (healthy, killed):
        node1 = g.nodes[1]
        assert node1.offset.method == "shared-events"
        assert node1.offset.bound_s is not None
        assert abs(node1.offset.offset_s) <= node1.offset.bound_s


def test_matrix_has_each_rank_and_the_sync_milestones(healthy: group.GroupAnalysis) -> None:
    rows = {(r["node"], r["process"]): r["milestones"] for r in healthy.matrix}
    tp1 = next(v for (n, p), v in rows.items() if n == "node1" and p.startswith("Worker_TP1"))
    tp0 = next(v for (n, p), v in rows.items() if n == "node0" and p.startswith("Worker_TP0"))
    assert {"load-start", "weights-loaded", "profiled"} <= set(tp1) & set(tp0)
    # the profiling pass ends together on both ranks once clocks are corrected
    assert abs(tp1["profiled"] - tp0["profiled"]) < 0.05


def test_killed_node_is_the_first_failure_and_node0_errors_are_consequences(
    killed: group.GroupAnalysis,
) -> None:
    ff = killed.first_failure
    assert ff is not None
    assert (ff.node, ff.kind, ff.rule) == ("node1", "death", "GROUP-DEATH")
    assert "SIGKILL" in ff.text
    assert killed.consequences
    assert {c.node for c in killed.consequences} == {"node0"}
    assert all(c.t >= ff.t for c in killed.consequences)
    texts = " ".join(c.text for c in killed.consequences)
    assert "Connection closed by peer" in texts
    assert "Engine core initialization failed" in texts


def test_node0_alone_blames_a_peer_but_the_group_names_node1(killed: group.GroupAnalysis) -> None:
    alone = killed.nodes[0].analysis.first_failure
    assert alone is not None and alone.rule == "CSQ006"  # an echo of a peer's death


def test_group_json_is_a_valid_analysis_with_the_node_named(killed: group.GroupAnalysis) -> None:
    out = group.to_json(killed)
    schema = json.loads(read_text("schemas", "analysis.schema.json"))
    jsonschema.validate(out, schema)
    assert out["first_failure"]["node"] == "node1"
    assert out["group"]["id"] == "twonode"
    assert [n["node"] for n in out["group"]["nodes"]] == ["node0", "node1"]
    assert all(c["node"] == "node0" for c in out["consequences"])


def test_healthy_json_validates(healthy: group.GroupAnalysis) -> None:
    out = group.to_json(healthy)
    jsonschema.validate(out, json.loads(read_text("schemas", "analysis.schema.json")))
    assert out["first_failure"] is None
    assert out["group"]["nodes"][1]["clock"]["pairs"] == 2


def test_text_and_markdown_name_the_node(killed: group.GroupAnalysis) -> None:
    text = group.render_text(killed)
    assert "First causal failure: node1" in text
    md = group.render_markdown(killed)
    assert "node **node1**" in md


def test_consistency_names_the_differing_version() -> None:
    g = group.analyze_group(_paths("healthy"))
    n0, n1 = g.nodes
    n0.fingerprint = {**n0.fingerprint, "python": {"nccl_version": "2.28.9"}}
    n1.fingerprint = {**n1.fingerprint, "python": {"nccl_version": "2.30.7"}}
    found = group.consistency([n0, n1])
    (diff,) = [d for d in found if d["what"] == "python.nccl_version"]
    assert diff["message"] == "node1 runs NCCL 2.30.7; node0 runs NCCL 2.28.9"


def test_consistency_ignores_per_node_flags_but_not_dtype() -> None:
    g = group.analyze_group(_paths("healthy"))
    n0, n1 = g.nodes
    argv = list(n1.launch["argv"])
    argv[argv.index("--dtype") + 1] = "bfloat16"
    n1.launch = {**n1.launch, "argv": argv}
    found = group.consistency([n0, n1])
    assert [d["what"] for d in found] == ["argv.dtype"]
    assert "node1 runs --dtype bfloat16" in found[0]["message"]


def test_one_bundle_is_not_a_group() -> None:
    with pytest.raises(InputError, match="at least two"):
        group.analyze_group(_paths("healthy")[:1])


def test_missing_bundle_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        group.analyze_group([_paths("healthy")[0], str(tmp_path / "nope.tar")])


def test_real_node_with_another_vllm_variable_is_named() -> None:
    g = group.analyze_group(_paths("env"))
    assert g.first_failure is None
    (diff,) = g.consistency
    assert diff["what"] == "env.VLLM_ENGINE_READY_TIMEOUT_S"
    assert diff["message"] == (
        "node1 has VLLM_ENGINE_READY_TIMEOUT_S=900; node0 does not set VLLM_ENGINE_READY_TIMEOUT_S"
    )


def test_cli_analyze_check_report_diff_take_a_group(tmp_path: Path) -> None:
    import subprocess
    import sys

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "kk3evidence", *args],
            capture_output=True,
            text=True,
            check=False,
        )

    killed = _paths("killed")
    r = cli("analyze", "--json", *killed)
    assert r.returncode == 3 and json.loads(r.stdout)["first_failure"]["node"] == "node1"
    r = cli("check", *_paths("env"))
    assert r.returncode == 6 and "VLLM_ENGINE_READY_TIMEOUT_S" in r.stdout
    r = cli("check", *_paths("healthy"))
    # consistent nodes, but a CPU build is outside the CUDA boundaries: each node fails those
    assert r.returncode == 6, r.stdout
    assert "same versions, NCCL_*/GLOO_*/VLLM_* environment and argv on every node" in r.stdout
    assert "CPU build" in r.stdout
    r = cli("report", *killed)
    assert r.returncode == 0 and "node **node1**" in r.stdout and "Hand-off of node1" in r.stdout
    r = cli("diff", "--json", *_paths("healthy"), *_paths("env"))
    out = json.loads(r.stdout)
    assert [p["node"] for p in out["pairs"]] == ["node0", "node1"]
    assert any("VLLM_ENGINE_READY_TIMEOUT_S" in v for v in out["variables"])
    r = cli("analyze", "-", killed[0])
    assert r.returncode == 2 and "stdin" in r.stderr


def _shift_clock(src: Path, dst: Path, wall_s: float, mono_s: float) -> None:
    """Re-pack ``src`` as if its host's wall clock were ``wall_s`` ahead (and its monotonic
    clock had another base): every receive time and the group's clock samples move."""
    from kk3evidence.bundle.archive import BundleWriter, open_bundle

    dw, dm = int(wall_s * 1e9), int(mono_s * 1e9)
    with open_bundle(src) as b:
        w = BundleWriter(dst.with_suffix(".staging"), bundle_id=b.bundle_id)
        for name in b.names():
            data = b.read_bytes(name)
            if name == "logs/lines.tsv":
                rows = data.decode().splitlines()
                out = [rows[0]]
                for row in rows[1:]:
                    off, stream, wall, mono = row.split("\t")
                    out.append(f"{off}\t{stream}\t{int(wall) + dw}\t{int(mono) + dm}")
                w.add_bytes(name, ("\n".join(out) + "\n").encode())
            elif name.endswith(".json"):
                w.write_json(name, json.loads(data))
            else:
                w.add_bytes(name, data)
        g = json.loads(json.dumps(b.group))
        for s in g["clock"]["samples"]:
            s["wall_ns"] += dw
            s["mono_ns"] += dm
        w.set_group(g)
        w.finalize(dst)


def test_a_node_clock_five_seconds_ahead_is_corrected(tmp_path: Path) -> None:
    base = group.analyze_group(_paths("healthy")).nodes[1].offset
    shifted = tmp_path / "node1.tar"
    _shift_clock(Path(_paths("healthy")[1]), shifted, wall_s=5.0, mono_s=-777.0)
    g = group.analyze_group([_paths("healthy")[0], str(shifted)])
    off = g.nodes[1].offset
    assert off.offset_s == pytest.approx(base.offset_s + 5.0, abs=1e-6)
    assert off.bound_s is not None and abs(off.offset_s - 5.0) <= off.bound_s
    # corrected, the profiling pass still ends together on both nodes
    rows = {(r["node"], r["process"].split()[0]): r["milestones"] for r in g.matrix}
    assert (
        abs(rows[("node1", "Worker_TP1")]["profiled"] - rows[("node0", "Worker_TP0")]["profiled"])
        < 0.05
    )


def _node(
    name: str, rank: int, ff: tuple[str, str, float] | None, *, killed_at: float | None = None
) -> group.NodeRun:
    """A node whose first failure is (category, basis, time) at line 5, or killed at a time."""
    from kk3evidence.model import Analysis, Finding

    finding = None
    times: dict[int, float] = {}
    if ff is not None:
        category, basis, t = ff
        finding = Finding(
            5, "R1", "engine_init", category, "failure", f"{category} here", basis=basis
        )
        times[5] = t
    analysis = Analysis(name, 10, "engine_init", (), finding, (), (finding,) if finding else ())
    launch = {"signal": 9, "exit_code": None} if killed_at is not None else {"exit_code": 1}
    return group.NodeRun(
        source=name,
        node=name,
        rank=rank,
        host="h",
        group_id="g",
        analysis=analysis,
        fingerprint={},
        launch=launch,
        marks={},
        times=times,
        last_line_t=killed_at,
    )


def test_an_earlier_stated_failure_beats_a_later_death() -> None:
    first, _ = group._pick_first(
        [_node("node0", 0, ("oom", "rule", 10.0)), _node("node1", 1, None, killed_at=30.0)]
    )
    assert first is not None and (first.node, first.category) == ("node0", "oom")


def test_a_peer_loss_just_before_the_death_is_its_consequence() -> None:
    first, _ = group._pick_first(
        [_node("node0", 0, ("hang", "rule", 30.4)), _node("node1", 1, None, killed_at=30.9)]
    )
    assert first is not None and (first.node, first.kind) == ("node1", "death")


def test_stalls_count_only_when_no_node_stated_a_failure() -> None:
    first, _ = group._pick_first(
        [_node("node0", 0, ("hang", "stall", 50.0)), _node("node1", 1, ("nccl", "rule", 200.0))]
    )
    assert first is not None and first.node == "node1"
    first, _ = group._pick_first(
        [_node("node0", 0, ("hang", "stall", 100.0)), _node("node1", 1, ("hang", "stall", 50.0))]
    )
    assert first is not None and first.node == "node1"


def test_a_node_stopped_on_purpose_is_not_a_failure() -> None:
    n = _node("node1", 1, None, killed_at=5.0)
    n.launch = {"signal": 2, "interrupted_by": "SIGINT"}
    assert group._pick_first([_node("node0", 0, None), n]) == (None, None)


def test_a_node_killed_before_its_first_line_dies_when_capture_saw_it_end() -> None:
    n = _node("node1", 1, None, killed_at=None)
    n.launch = {"signal": 9, "ended_at": "2026-12-01T03:43:39+00:00"}
    first, _ = group._pick_first([_node("node0", 0, None), n])
    assert first is not None and first.kind == "death" and "capture saw it end" in first.text


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=1, max_value=5000))
def test_milestones_are_found_the_same_whatever_the_block_size(block: int) -> None:
    from kk3evidence.analysis.engine import AnalysisEngine
    from kk3evidence.bundle.archive import open_bundle

    path = _paths("healthy")[0]
    marks = group.group_data().milestones

    def scan(size: int) -> dict[str, list[group.Mark]]:
        with open_bundle(path) as b, pytest.MonkeyPatch.context() as mp:
            mp.setattr(group, "BLOCK_SIZE", size)
            return group._scan_log(b, AnalysisEngine(path), marks)

    small, whole = scan(block), scan(1 << 24)
    strip = lambda d: {k: [(m.line_no, m.process, m.text) for m in v] for k, v in d.items()}  # noqa: E731
    assert strip(small) == strip(whole)
    # the previous line of a process is only looked for in the same block: None or the same
    for name, marks_small in small.items():
        for a, b in zip(marks_small, whole[name], strict=True):
            assert a.prev in (None, b.prev)


def test_real_dtype_mismatch_names_node1_and_the_flag() -> None:
    # node 1 ran --dtype bfloat16 against node 0's float32: gloo aborted on node 1 in the first
    # all-reduce; node 0 only saw the connection go ("Read error")
    g = group.analyze_group(_paths("dtype"))
    ff = g.first_failure
    assert ff is not None and ff.node == "node1"
    assert "gloo::EnforceNotMet" in ff.text
    assert {c.node for c in g.consequences} >= {"node0"}
    (diff,) = g.consistency
    assert diff["what"] == "argv.dtype"
    assert diff["message"] == "node1 runs --dtype bfloat16; node0 runs --dtype float32"
    assert "the nodes differ" in group.render_text(g)


def test_consistency_names_a_differing_loaded_library() -> None:
    g = group.analyze_group(_paths("healthy"))
    n0, n1 = g.nodes
    lib = {"name": "libnccl", "path": "/usr/lib/libnccl.so.2", "pids": [1]}
    n0.fingerprint = {**n0.fingerprint, "libraries": [{**lib, "version": "2.28.9"}]}
    n1.fingerprint = {**n1.fingerprint, "libraries": [{**lib, "version": "2.30.7"}]}
    (diff,) = group.consistency([n0, n1])
    assert diff["message"] == "node1 loads libnccl 2.30.7; node0 loads libnccl 2.28.9"


def test_matrix_has_one_row_per_process_with_its_rank(killed: group.GroupAnalysis) -> None:
    rows = [(r["node"], r["process_rank"]) for r in killed.matrix]
    assert rows == [("node0", 0), ("node1", 1)]
    node1 = killed.matrix[1]["milestones"]
    assert "weights-loaded" not in node1  # killed while loading
    assert "Milestones (s) by node and process:" in group.render_text(killed)
