"""Answers for failing logs that state no failure in a form the rules know (issue 13's "no
failing log gets 'no failure'"): a serving stall read from vLLM's stats lines, IPython
tracebacks, frames followed by a paste's elision marker, the tail of a multi-line ERROR record,
stack dumps of several processes mixed within lines, and ``analyze --stopped`` for a plain log
whose run is known to be over. Each shape comes from a real log of the corpus (named)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from kk3evidence.analysis.engine import AnalysisEngine, analyze
from kk3evidence.analysis.grammar import is_filler, is_interleaved_frames
from kk3evidence.analysis.hang import HangScan, apply_hang, describe_stall
from kk3evidence.analysis.serving_stall import ServingStallWatch
from kk3evidence.cli import main

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "corpus"

V1_STATS = (
    "DEBUG 05-11 18:07:{s:02d} [loggers.py:111] Engine {e}: Avg prompt throughput: {p} tokens/s,"
    " Avg generation throughput: {g} tokens/s, Running: {r} reqs, Waiting: 0 reqs, GPU KV cache "
    "usage: 0.0%, Prefix cache hit rate: 0.0%\n"
)
V0_STATS = (
    "INFO 02-03 13:14:04 llm_engine.py:706] Avg prompt throughput: {p} tokens/s, Avg generation "
    "throughput: {g} tokens/s, Running: {r} reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache "
    "usage: 0.0%, CPU KV cache usage: 0.0%\n"
)
READY = "INFO:     Application startup complete.\n"


def _stats(*rows: tuple[str, str, str, int], fmt: str = V1_STATS) -> str:
    return "".join(
        fmt.format(s=10 * i % 60, e=e, p=p, g=g, r=r) for i, (e, p, g, r) in enumerate(rows)
    )


# -- serving stall ---------------------------------------------------------------------------


def test_the_real_zero_throughput_log_is_a_serving_stall() -> None:
    a = analyze(next(CORPUS.glob("b10-17972-*")) / "output.log")
    ff = a.first_failure
    assert ff is not None
    assert (ff.line_no, ff.stage, ff.category, ff.basis, ff.rule) == (
        5, "serving", "hang", "stall", "STALL002"
    )
    assert a.stall is not None
    assert (a.stall["since_line"], a.stall["until_line"], a.stall["stats_lines"]) == (5, 8, 4)
    assert a.stall["requests_running"] == 1 and a.stall["engine"] == "000"
    assert "0 tokens/s on 4 stats lines" in describe_stall(a.stall)[0]


def test_two_zero_lines_with_requests_running_are_a_stall_v0_format_too() -> None:
    a = analyze((READY + _stats(("0", "0.0", "0.0", 2), ("0", "0.0", "0.0", 2), fmt=V0_STATS))
                .encode())
    assert a.first_failure is not None and a.first_failure.rule == "STALL002"
    assert a.stall is not None and a.stall["engine"] is None and a.stall["requests_running"] == 2


def test_one_zero_line_an_idle_server_or_progress_between_are_no_stall() -> None:
    one = _stats(("000", "0.0", "0.0", 1), ("000", "3.1", "12.0", 1))
    idle = _stats(("000", "0.0", "0.0", 0), ("000", "0.0", "0.0", 0), ("000", "0.0", "0.0", 0))
    moving = _stats(("000", "0.0", "0.0", 1), ("000", "0.0", "7.5", 1), ("000", "0.0", "0.0", 1))
    for text in (one, idle, moving):
        a = analyze((READY + text).encode())
        assert a.first_failure is None and a.stall is None, text


def test_each_engine_of_a_data_parallel_server_is_judged_on_its_own_lines() -> None:
    # Engine 001 makes progress between engine 000's two zero lines: engine 000 still stalls.
    text = _stats(
        ("000", "0.0", "0.0", 1), ("001", "0.0", "9.0", 3), ("000", "0.0", "0.0", 1),
    )
    a = analyze((READY + text).encode())
    assert a.first_failure is not None and a.first_failure.line_no == 2
    assert a.stall is not None and a.stall["engine"] == "000"


def test_a_stated_failure_wins_over_a_serving_stall() -> None:
    text = _stats(("000", "0.0", "0.0", 1), ("000", "0.0", "0.0", 1))
    text += "ERROR 05-11 18:09:00 [core.py:1] RuntimeError: CUDA error: out of memory\n"
    ff = analyze((READY + text).encode()).first_failure
    assert ff is not None and ff.basis == "rule" and ff.category != "hang"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=12))
def test_the_serving_stall_does_not_depend_on_how_the_log_is_cut(cuts: list[int]) -> None:
    data = (
        READY
        + _stats(("000", "1.0", "5.0", 1), ("000", "0.0", "0.0", 1), ("001", "0.0", "0.0", 2))
        + _stats(("000", "0.0", "0.0", 1), ("001", "0.0", "0.0", 2), ("000", "0.0", "0.0", 1))
    ).encode()
    whole = analyze(data)
    eng, scan, pos = AnalysisEngine("-"), HangScan(), 0
    for c in cuts:
        eng.feed(data[pos : pos + c])
        scan.feed(data[pos : pos + c])
        pos += c
    eng.feed(data[pos:])
    scan.feed(data[pos:])
    got = apply_hang(eng.finish(), scan)
    assert got.first_failure == whole.first_failure and got.stall == whole.stall
    assert whole.stall is not None and whole.stall["stats_lines"] == 3  # engine 000: 2, 4, 6


# -- IPython tracebacks ------------------------------------------------------------------------

IPYTHON_TB = (
    "---------------------------------------------------------------------------\n"
    "RayActorError                             Traceback (most recent call last)\n"
    "Cell In[3], line 1\n"
    '----> 1 llm = LLM(model="gpt2", tensor_parallel_size=2)\n'
    "\n"
    "File /mnt/workdir/vllm/entrypoints/llm.py:89, in LLM.__init__(self, model, tokenizer)\n"
    "     74     kwargs[\"disable_log_stats\"] = True\n"
    "---> 89 self.llm_engine = LLMEngine.from_engine_args(engine_args)\n"
    "\n"
    "File [/usr/lib/python3/dist-packages/ray/_private/worker.py:2547](https://host/lab/tree/"
    "worker.py#line=2546), in get(object_refs, timeout)\n"
    "   2545         raise value.as_instanceof_cause()\n"
    "-> 2547     raise value\n"
    "\n"
    "RayActorError: The actor died unexpectedly before finishing this task.\n"
)


def test_an_ipython_traceback_ends_at_its_exception_line() -> None:
    a = analyze(IPYTHON_TB.encode())
    ff = a.first_failure
    assert ff is not None and ff.line_no == 14 and ff.text.startswith("RayActorError:")


def test_an_excerpt_inside_ipython_frames_answers_its_first_frame() -> None:
    a = analyze(next(CORPUS.glob("b11-3374-*")) / "output.log")
    ff = a.first_failure
    assert ff is not None and (ff.line_no, ff.rule, ff.basis) == (1, "EXC011", "fallback")


def test_ipython_marked_source_lines_do_not_end_the_frames() -> None:
    cut = IPYTHON_TB.rsplit("\n\n", 1)[0] + "\n"  # without the exception line
    ff = analyze(cut.encode()).first_failure
    assert ff is not None and ff.rule == "EXC011" and ff.line_no == 2


# -- elision markers, ERROR records, interleaved dumps -----------------------------------------


def test_frames_followed_by_a_paste_elision_marker_are_a_cut_traceback() -> None:
    a = analyze(next(CORPUS.glob("b10-43222-*")) / "output.log")
    ff = a.first_failure
    assert ff is not None and (ff.line_no, ff.rule) == (1, "EXC011")
    assert all(is_filler(t) for t in ("", "   ", "[ ...... ]", "...", "<snip>", "(truncated)"))
    assert not any(is_filler(t) for t in ("[rank0]: boom", "... 3 more", "ok ..."))


def test_a_frame_run_then_other_output_is_not_a_cut_traceback() -> None:
    frames = (
        '(W pid=1) ERROR 05-20 10:42:56 [x.py:1]   File "/v/m.py", line 1, in forward\n'
        "(W pid=1) ERROR 05-20 10:42:56 [x.py:1]     return f(x)\n"
    )
    assert analyze((frames + "\n[ ...... ]\n").encode()).first_failure is not None
    steps = (f"(A pid=2) INFO 05-20 10:43:{i:02d} [a.py:1] step\n" for i in range(5))
    later = frames + "".join(steps)
    assert analyze(later.encode()).first_failure is None


def test_the_tail_of_a_multi_line_error_record_is_an_error_level_fallback() -> None:
    a = analyze(next(CORPUS.glob("b10-23814-*")) / "output.log")
    ff = a.first_failure
    assert ff is not None and (ff.line_no, ff.rule, ff.basis) == (2, "EXC010", "fallback")


def test_stack_dumps_mixed_within_lines_are_the_weakest_fallback() -> None:
    a = analyze(next(CORPUS.glob("b11-sglang38849-*")) / "output.log")
    ff = a.first_failure
    assert ff is not None and (ff.line_no, ff.rule, ff.basis) == (1, "EXC012", "fallback")
    assert not is_interleaved_frames('  File "/v/a.py", line 3, in f  File "/v/b.py", line 4')
    assert not is_interleaved_frames("INFO loading File x, line 3")


# -- analyze --stopped -----------------------------------------------------------------------


def test_stopped_turns_a_plain_log_that_never_became_ready_into_a_stall() -> None:
    log = str(next(CORPUS.glob("b10-50430-*")) / "output.log")
    plain = CliRunner().invoke(main, ["analyze", log])
    assert plain.exit_code == 0 and "No failure found." in plain.output
    assert "add --stopped" in plain.output
    stopped = CliRunner().invoke(main, ["analyze", "--stopped", log])
    assert stopped.exit_code == 3, stopped.output
    assert "rule STALL001" in stopped.output and "comm_group" in stopped.output
    a = analyze(log, stopped=True)
    assert a.stall is not None and a.stall["world_size"] == 8 and a.stall["missing_ranks"] == []


def test_stopped_does_not_change_a_log_that_became_ready() -> None:
    a = analyze((READY + "INFO 05-11 18:07:00 [a.py:1] ok\n").encode(), stopped=True)
    assert a.first_failure is None


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=300), min_size=1, max_size=10))
def test_the_live_serving_watch_finds_the_stall_the_analysis_finds(cuts: list[int]) -> None:
    # capture's watchdog feeds the log as it grows (ServingStallWatch.feed): the same stall
    data = (READY + _stats(("000", "2.0", "9.0", 1), ("000", "0.0", "0.0", 1),
                           ("000", "0.0", "0.0", 1))).encode()
    watch, pos = ServingStallWatch(), 0
    for c in cuts:
        watch.feed(data[pos : pos + c])
        pos += c
    watch.feed(data[pos:])
    want = analyze(data).extra.serving_stall
    assert watch.stall == want and want is not None and want.first_line == 3
    watch.gap()  # a skipped flood: no run continues across it
    watch.feed(_stats(("000", "0.0", "0.0", 1)).encode())
    assert watch.stall == want


# -- one zero line, then silence (vLLM V1 at INFO level) ---------------------------------------

REAL_STALL = REPO / "tests" / "data" / "realruns" / "serving_stall_sigstop_worker"


def _later(seconds: int) -> str:
    minute, second = 7 + seconds // 60, seconds % 60
    return f"(APIServer pid=1) INFO 05-11 18:{minute:02d}:{second:02d} [a.py:1] x\n"


def test_one_zero_line_then_a_silent_log_is_a_stall_only_after_the_silence() -> None:
    # V1 logs the zero lines after the first at DEBUG: at INFO a stuck engine prints one
    # (here at 18:07:10) and falls silent; the log's later timestamps measure the silence.
    head = READY + _stats(("000", "3.0", "40.0", 4), ("000", "0.0", "0.0", 4))
    silent = analyze((head + _later(40) + "INFO:     Shutting down\n").encode())
    assert silent.first_failure is not None and silent.first_failure.rule == "STALL002"
    assert silent.stall is not None and silent.stall["silent_s"] == 30.0
    assert "then no stats line for 30 s" in describe_stall(silent.stall)[0]
    for text in (head, head + _later(20)):  # nothing after it, or not long enough
        assert analyze(text.encode()).first_failure is None


def test_the_real_frozen_worker_run_is_a_serving_stall_from_its_log_and_its_bundle() -> None:
    # tests/e2e/test_serving_stall_vllm.py recorded it: vLLM 0.32 CPU, four requests, the
    # VLLM::Worker process SIGSTOPped 0.7 s later, capture --stall-action stop.
    log = analyze(REAL_STALL / "output.log")
    ff = log.first_failure
    assert ff is not None and (ff.line_no, ff.rule, ff.category) == (102, "STALL002", "hang")
    assert log.stall is not None and log.stall["silent_s"] >= 25
    bundle = analyze(REAL_STALL / "bundle.tar")
    assert bundle.first_failure == ff and bundle.stall is not None
    procs = bundle.stall["processes"]
    stopped = [p for p in procs if p["stopped"]]
    assert [p["name"] for p in stopped] == ["VLLM::Worker"]
    assert any(p["waiting_in"] == "the workers' answer (collective_rpc)" for p in procs)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=500), min_size=1, max_size=12))
def test_the_silence_after_one_zero_line_does_not_depend_on_how_the_log_is_cut(
    cuts: list[int],
) -> None:
    head = READY + _stats(("000", "3.0", "40.0", 4), ("000", "0.0", "0.0", 4))
    # a timestamped line 40 s later, then 70 lines without a timestamp: too far from the end
    # to count in any chunking; with 10 such lines it counts in every one
    for tail_lines, want in ((70, None), (10, "STALL002")):
        data = (head + _later(40) + "  untimestamped\n" * tail_lines).encode()
        eng, pos = AnalysisEngine("-"), 0
        for c in cuts:
            eng.feed(data[pos : pos + c])
            pos += c
        eng.feed(data[pos:])
        got = apply_hang(eng.finish(), HangScan()).first_failure
        assert (got.rule if got else None) == want == (
            analyze(data).first_failure.rule if analyze(data).first_failure else None
        )


# -- found in review ---------------------------------------------------------------------------


def test_the_first_stall_is_kept_when_a_later_one_shares_its_block() -> None:
    text = READY + _stats(*(("000", "0.0", g, 1) for g in ("0.0", "0.0", "5.0", "0.0", "0.0")))
    data = text.encode()
    whole = analyze(data)
    assert whole.stall is not None and (whole.stall["since_line"], whole.stall["stats_lines"]) == (
        2, 2
    )
    eng = AnalysisEngine("-")
    for line in data.splitlines(keepends=True):
        eng.feed(line)
    assert apply_hang(eng.finish(), HangScan()).stall == whole.stall


def test_a_malformed_stats_number_is_no_crash() -> None:
    bad = V1_STATS.format(s=0, e="000", p="1..0", g="0.0", r=1) * 3
    assert analyze((READY + bad).encode()).first_failure is None


def test_a_budget_that_skips_the_middle_does_not_join_a_run_across_it() -> None:
    # A zero line in the head, an hour of progress in the skipped middle, timestamps an hour
    # later in the tail: the run must not continue across the gap (it did, found in review).
    from kk3evidence.analysis.budget import Budget

    head = READY + _stats(("000", "3.0", "40.0", 2), ("000", "0.0", "0.0", 2)) + "x\n" * 50
    middle = _stats(*(("000", "1.0", "9.0", 2) for _ in range(300)))
    tail = "".join(
        f"(APIServer pid=1) INFO 05-11 19:{i:02d}:00 [a.py:1] later\n" for i in range(3)
    ) + "y\n" * 5
    data = (head + middle + tail).encode()
    assert analyze(data).first_failure is None
    budgeted = analyze(data, budget=Budget(len(head) + 10, len(tail) + 10))
    assert budgeted.coverage is not None and budgeted.first_failure is None


def test_a_connect_retry_counts_only_in_a_log_that_never_becomes_ready() -> None:
    retry = "h:1:2 [1] NCCL INFO Call to connect returned Connection refused, retrying\n"
    alone = analyze(retry.encode()).first_failure
    assert alone is not None and alone.rule == "NCCL026"
    up = "INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)\n"
    later_ready = retry + "h:1:2 [1] NCCL INFO Connected all rings\n" + up
    assert analyze(later_ready.encode()).first_failure is None


def test_a_warning_holding_an_escaped_traceback_is_no_interleaved_dump() -> None:
    body = 'Traceback: File "/a.py", line 3, in f\\n  File "/b.py", line 4, in g'
    warn = f"WARNING 05-11 18:07:00 [x.py:1] handled: {body}\n"
    assert analyze(warn.encode()).first_failure is None
    err = f"ERROR 05-11 18:07:00 [x.py:1] crashed: {body}\n"
    ff = analyze(err.encode()).first_failure
    assert ff is not None and ff.rule in ("EXC010", "EXC012")


def test_silence_is_measured_without_the_local_time_zone(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import time

    from kk3evidence.analysis.serving_stall import stamp_seconds

    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        gap = stamp_seconds("10-29 02:00:01")
        assert gap is not None and gap - (stamp_seconds("10-29 01:59:55") or 0) == 6
    finally:
        monkeypatch.undo()
        time.tzset()


def test_the_end_of_a_cut_traceback_does_not_depend_on_the_context_asked_for() -> None:
    frames = (
        '(W pid=1) ERROR 05-20 10:42:56 [x.py:1]   File "/v/m.py", line 1, in forward\n'
        "(W pid=1) ERROR 05-20 10:42:56 [x.py:1]     return f(x)\n"
    )
    data = (frames + "\n" * 7 + "[ ...... ]\n" + "\n" * 6).encode()
    got = {c: analyze(data, context=c).first_failure for c in (0, 3, 10)}
    assert all(ff is not None and ff.rule == "EXC011" for ff in got.values()), got


# -- a start-up that ends in the engine's waiting notices (STALL003) -------------------------

_SHM = (
    "(EngineCore pid=7) INFO 10-09 11:{m:02d}:47 [shm_broadcast.py:812] No available shared "
    "memory broadcast block found in 60 seconds. This typically happens when some processes "
    "are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache "
    "quantization).\n"
)
_CAPTURED = (
    "(Worker_TP0 pid=9) INFO 10-09 11:10:39 [gpu_model_runner.py:6854] Graph capturing "
    "finished in 12 secs, took 0.92 GiB\n"
)


def test_a_real_start_up_ending_in_an_hour_of_shm_notices_is_a_stall_at_the_first() -> None:
    """A committed run log (corpus b16-file-decodekuki-…): after graph capture the engine logs
    its shared-memory wait once a minute for an hour, and the file ends."""
    case = next(CORPUS.glob("b16-file-decodekuki-*"))
    ff = analyze(case / "output.log").first_failure
    assert ff is not None
    assert (ff.line_no, ff.stage, ff.category, ff.basis, ff.rule) == (
        6, "engine_init", "hang", "stall", "STALL003"
    )


def test_fewer_than_ten_notices_or_progress_after_them_are_no_stall() -> None:
    few = _CAPTURED + "".join(_SHM.format(m=11 + i) for i in range(9))
    moved = _CAPTURED + "".join(_SHM.format(m=11 + i) for i in range(12)) + _CAPTURED
    for text in (few, moved):
        assert analyze(text.encode()).first_failure is None
    ten = _CAPTURED + "".join(_SHM.format(m=11 + i) for i in range(10))
    ff = analyze(ten.encode()).first_failure
    assert ff is not None and (ff.line_no, ff.rule) == (2, "STALL003")
