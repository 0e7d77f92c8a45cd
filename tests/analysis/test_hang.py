"""``hang`` as an answer (SPEC §2/§4): the stall verdict, the rank matrix, the waits, durations."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from kk3evidence.analysis.engine import AnalysisEngine, analyze
from kk3evidence.analysis.hang import (
    HangScan,
    HeldHangScan,
    StallInputs,
    apply_hang,
    describe_stall,
    receive_times,
    waiting_in,
)
from kk3evidence.analysis.progress import MilestoneWatcher

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "tests" / "data" / "realruns" / "hang_two_node_missing_node1"

WORLD = (
    "(Worker pid=7) INFO 12-01 03:47:40 [parallel_state.py:1906] world_size={w} rank={r} "
    "local_rank={r} distributed_init_method=tcp://127.0.0.1:29612 backend=gloo\n"
)
STOP = (
    "(EngineCore pid=6) INFO 12-01 03:48:51 [core.py:1454] [shutdown] EngineCore: "
    "trigger received signal=SIGTERM\n"
)


def test_the_real_two_node_bundle_is_a_comm_group_hang_naming_rank_1_and_the_tcpstore() -> None:
    a = analyze(RUN / "bundle.tar")
    ff = a.first_failure
    assert ff is not None
    assert (ff.stage, ff.category, ff.basis, ff.line_no) == ("comm_group", "hang", "stall", 34)
    assert a.stall is not None
    assert a.stall["missing_ranks"] == [1] and a.stall["world_size"] == 2
    assert a.stall["ranks"][0]["rank"] == 0
    waits = {p["waiting_in"] for p in a.stall["processes"]}
    assert "TCPStore" in waits
    worker = next(p for p in a.stall["processes"] if p["waiting_in"] == "TCPStore")
    assert any(":29612" in s and "LISTEN" in s for s in worker["sockets"])
    assert worker["stacks_same_in_second_snapshot"] is True
    assert a.stall["stopped_by"] == "stall" and a.stall["since"].startswith("2026-12-01T03:47:40")
    # per-stage durations from lines.tsv
    timed = {s.stage: s for s in a.stages}
    assert timed["comm_group"].seconds is not None and timed["comm_group"].seconds > 60
    assert all(s.started_s is not None for s in a.stages)
    j = a.to_json()
    assert j["first_failure"]["basis"] == "stall" and j["stall"]["missing_ranks"] == [1]
    text = "\n".join(describe_stall(a.stall))
    assert "rank 1: never appeared" in text and "TCPStore" in text


def test_the_real_two_node_log_alone_is_a_hang_too() -> None:
    a = analyze(RUN / "output.log")
    ff = a.first_failure
    assert ff is not None and (ff.category, ff.basis, ff.line_no) == ("hang", "stall", 34)
    assert a.stall is not None and a.stall["missing_ranks"] == [1]
    assert a.stall["gaps"][0]["seconds"] >= 60  # 03:47:40 -> 03:48:51


def test_a_slice_that_stops_without_a_stop_request_is_not_called_a_hang() -> None:
    a = analyze((WORLD.format(w=2, r=0)).encode())
    assert a.first_failure is None and a.stall is None


def test_a_run_that_exited_0_is_not_a_hang() -> None:
    data = (WORLD.format(w=2, r=0) + STOP).encode()
    assert analyze(data).first_failure is not None
    ok = analyze(data, stall_inputs=StallInputs(launch={"exit_code": 0}))
    assert ok.first_failure is None


def test_a_timeout_line_is_a_hang_with_the_stall_details() -> None:
    data = (
        WORLD.format(w=4, r=0)
        + WORLD.format(w=4, r=1).replace("pid=7", "pid=8")
        + "(APIServer pid=1) TimeoutError: Timed out waiting for engine core processes to start. "
        "Waited 600s (configured by VLLM_ENGINE_READY_TIMEOUT_S).\n"
    ).encode()
    a = analyze(data)
    ff = a.first_failure
    assert ff is not None and ff.category == "hang" and ff.basis == "rule"
    assert a.stall is not None and a.stall["missing_ranks"] == [2, 3]


def test_an_earlier_failure_wins_over_a_later_timeout() -> None:
    data = (
        b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
        b"torch.distributed.DistStoreError: Timed out after 9 seconds waiting for clients. "
        b"1/2 clients joined.\n"
    )
    a = analyze(data)
    ff = a.first_failure
    assert ff is not None and ff.line_no == 1 and ff.category != "hang" and a.stall is None


def test_waits_are_named_from_the_innermost_known_frame() -> None:
    frames = [
        {"function": "_create_c10d_store", "file": "torch/distributed/rendezvous.py", "line": 1},
        {"function": "init_process_group", "file": "torch/distributed/c10d.py", "line": 2},
    ]
    assert waiting_in(frames)[:2] == ("TCPStore", "comm_group")  # type: ignore[index]
    assert waiting_in(frames[1:])[:2] == ("init_process_group", "comm_group")  # type: ignore[index]
    assert waiting_in([{"function": "compile_fx", "file": "torch/_inductor/x.py"}])[1] == (  # type: ignore[index]
        "engine_init"
    )
    assert waiting_in([{"function": "main", "file": "x.py"}]) is None


@settings(max_examples=30, deadline=None)
@given(cut=st.lists(st.integers(min_value=1, max_value=4000), max_size=4))
def test_a_scan_fed_one_block_late_gives_the_verdict_of_an_eager_one(cut: list[int]) -> None:
    # analyze() holds the last block back from the hang scan (HeldHangScan): a stall verdict
    # must come out the same as with every block scanned at once, however the log is cut.
    data = (RUN / "output.log").read_bytes()
    pieces, pos = [], 0
    for c in sorted(set(cut)):
        pieces.append(data[pos:c])
        pos = max(pos, c)
    pieces.append(data[pos:])
    results = []
    for scan in (HangScan(), HeldHangScan()):
        eng = AnalysisEngine("x")
        for piece in pieces:
            eng.feed(piece)
            scan.feed(piece)
        inputs = StallInputs(launch={"exit_code": 1})
        results.append(apply_hang(eng.finish(), scan, inputs).to_json())
    assert results[0] == results[1]
    assert results[0]["stall"] is not None


@settings(max_examples=40, deadline=None)
@given(cut=st.lists(st.integers(min_value=1, max_value=4000), max_size=6))
def test_the_rank_matrix_does_not_depend_on_how_the_log_is_cut(cut: list[int]) -> None:
    data = (RUN / "output.log").read_bytes()
    whole = HangScan()
    whole.feed(data)
    whole.finish()
    parts = HangScan()
    pos = 0
    for c in sorted(set(cut)):
        parts.feed(data[pos:c])
        pos = max(pos, c)
    parts.feed(data[pos:])
    parts.finish()
    assert parts.world_size == whole.world_size == 2
    assert {k: v.milestones for k, v in parts.ranks.items()} == {
        k: v.milestones for k, v in whole.ranks.items()
    }
    assert parts.lines == whole.lines and list(parts.tail)[-1] == list(whole.tail)[-1]


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(st.integers(min_value=0, max_value=2**62), min_size=1, max_size=60),
    chunk=st.integers(min_value=1, max_value=300),
    wanted=st.sets(st.integers(min_value=0, max_value=70), max_size=10),
)
def test_receive_times_finds_each_wanted_line_in_any_chunking(
    rows: list[int], chunk: int, wanted: set[int]
) -> None:
    tsv = b"offset\tstream\twall_ns\tmono_ns\n" + b"".join(
        b"%d\tout\t%d\t%d\n" % (i, w, i) for i, w in enumerate(rows)
    )
    blocks = [tsv[i : i + chunk] for i in range(0, len(tsv), chunk)]
    got = receive_times(blocks, wanted)
    assert got == {n: rows[n - 1] / 1e9 for n in wanted if 1 <= n <= len(rows)}


def test_the_milestone_watcher_follows_the_stage_as_the_log_grows() -> None:
    w = MilestoneWatcher()
    data = (RUN / "output.log").read_bytes()
    seen = []
    for i in range(0, len(data), 777):
        for m in w.feed(data[i : i + 777], at=float(i)):
            seen.append(m.stage)
    assert w.stage == "comm_group" and w.last is not None and "world_size=2" in w.last.text
    assert seen[0] == "container_init" and not w.ready


def test_the_hang_scan_stops_at_the_ready_line_whatever_the_blocks() -> None:
    # A ready line, then a rank's world line and later timestamps: none of them count (the
    # scan stops at the ready line), read in one block or line by line (blind set 10's data
    # showed ranks and gaps after `ready` counted only when they shared the ready line's block).
    from kk3evidence.analysis.hang import HangScan

    log = (
        b"INFO 01-01 00:00:00 [api_server.py:1] Starting vLLM API server on http://0.0.0.0:8000\n"
        b'INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK\n'
        b"INFO 01-01 05:00:00 [parallel_state.py:1] world_size=2 rank=1 local_rank=1 "
        b"distributed_init_method=tcp://127.0.0.1:1 backend=nccl\n"
        b"INFO 01-01 09:00:00 [x.py:1] much later\n"
    )
    results = []
    for size in (len(log), 7):
        scan = HangScan()
        for i in range(0, len(log), size):
            scan.feed(log[i : i + size])
        scan.finish()
        results.append((scan.ready, scan.world_size, dict(scan.ranks), scan.gaps))
    assert results[0] == results[1]
    assert results[0][0] and results[0][1] is None and results[0][3] == []


def test_sampled_timestamps_give_the_same_gaps_in_any_block_size() -> None:
    from kk3evidence.analysis.hang import HangScan

    # one line a tenth of a second, and three hours of silence before line 5001
    lines = [
        f"INFO 01-01 {i // 5000 * 3:02d}:{i // 600 % 60:02d}:{i // 10 % 60:02d} [x.py:1] step {i}\n"
        for i in range(6000)
    ]
    log = "".join(lines).encode()
    gaps = []
    for size in (len(log), 333, 4096):
        scan = HangScan()
        for i in range(0, len(log), size):
            scan.feed(log[i : i + size])
        scan.finish()
        gaps.append(scan.gaps)
    assert gaps[0] == gaps[1] == gaps[2]
    assert gaps[0][0][0] > 7000  # the silence before line 5001 is found past the first 4000


def test_the_rank_matrix_past_the_fully_read_milestones_is_the_same_in_any_block_size() -> None:
    # 64 ranks, 7,000 milestone lines before the weights stage: past the first 4,000 the scan
    # samples milestone lines by position in the whole log, so each rank's first line of each
    # stage does not depend on how the log was cut (it did with per-block sampling).
    from kk3evidence.analysis.hang import HangScan

    def line(r: int, body: str) -> str:
        return f"(Worker_TP{r} pid={1000 + r}) INFO 01-01 00:00:{r % 60:02d} [x.py:1] {body}\n"

    world = [line(r, f"world_size=64 rank={r} local_rank={r % 8} backend=nccl") for r in range(64)]
    busy = [line(i % 64, "Starting to load model /m ...") for i in range(7000)]
    done = [line(r, "Loading weights took 1.00 GB and 2.0 seconds") for r in range(64)]
    log = "".join(world + busy + done).encode()
    seen = []
    for size in (len(log), 4096, 65536, 1_000_003):
        scan = HangScan()
        for i in range(0, len(log), size):
            scan.feed(log[i : i + size])
        scan.finish()
        seen.append({k: dict(v.milestones) for k, v in scan.ranks.items()})
    assert seen[0] == seen[1] == seen[2] == seen[3]
    assert len(seen[0]) == 64
