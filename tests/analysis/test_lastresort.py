"""The last resort (analysis/lastresort.py, rule EXC010): when nothing in a log states a
failure, its first error-level line that no rule knows is the answer (basis "fallback");
a log with any stated failure, or that flags no error, is unchanged."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kk3evidence.analysis.engine import AnalysisEngine, analyze
from kk3evidence.analysis.grammar import parse_line
from kk3evidence.analysis.lastresort import MAX_LINES, ErrorLineCollector, is_error_level

START = (
    "INFO 05-01 01:50:00 [api_server.py:1043] vLLM API server version 0.8.5\n"
    "INFO 05-01 01:50:40 [launcher.py:36] Available routes are:\n"
    "INFO:     Started server process [7]\n"
    "INFO:     Application startup complete.\n"
)
# vLLM's own message (serving_chat.py logs it when a prompt cannot be rendered) that no rule
# is written for.
UNKNOWN_ERROR = "ERROR 05-01 01:51:54 [serving_chat.py:245] Error in preprocessing prompt inputs\n"


def test_an_unknown_error_level_line_is_the_last_resort_answer() -> None:
    a = analyze((START + UNKNOWN_ERROR).encode())
    ff = a.first_failure
    assert ff is not None
    assert (ff.line_no, ff.rule, ff.basis, ff.category) == (5, "EXC010", "fallback", "other")
    assert ff.stage == "serving"  # the server had answered: stage from the milestones


def test_a_stated_failure_wins_and_the_last_resort_is_not_looked_at() -> None:
    cuda = "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    log = START + UNKNOWN_ERROR + cuda
    ff = analyze(log.encode()).first_failure
    assert ff is not None and ff.rule != "EXC010" and ff.line_no == 6


def test_info_lines_mentioning_error_and_shutdown_errors_stay_clean() -> None:
    log = (
        START
        + "INFO 05-01 01:51:00 [metrics.py:1] ERROR counters: 0 errors, 0 failed requests\n"
        + "INFO 05-01 01:52:00 [launcher.py:254] [shutdown] API server: shutdown triggered\n"
        + UNKNOWN_ERROR
    )
    a = analyze(log.encode())
    assert a.first_failure is None


_CUT_TB = "".join(
    f"ERROR 05-01 01:51:54 [core.py:1] {body}\n"
    for body in (
        "Traceback (most recent call last):",
        '  File "/v/vllm/engine.py", line 3, in step',
        "    out = self.model(x)",
        "          ^^^^^^^^^^^^^",
    )
)


def test_a_log_cut_inside_a_traceback_answers_its_header_not_a_piece() -> None:
    ff = analyze((START + _CUT_TB).encode()).first_failure
    assert ff is not None
    assert (ff.line_no, ff.rule, ff.basis) == (5, "EXC011", "fallback")
    assert ff.stage == "serving"  # the frames' `in step` and the ready milestones agree


def test_a_traceback_that_ends_is_not_a_cut_one() -> None:
    # The log goes on after the frames: the traceback was not cut, so it is not a cut one
    # (whatever ended it is the classifier's business), and nothing else flags an error.
    closed = _CUT_TB + "INFO 05-01 01:52:00 [x.py:1] ok\n" * 6
    assert analyze((START + closed).encode()).first_failure is None


def test_an_earlier_error_line_wins_over_a_cut_traceback() -> None:
    ff = analyze((START + UNKNOWN_ERROR + _CUT_TB).encode()).first_failure
    assert ff is not None and (ff.line_no, ff.rule) == (5, "EXC010")


def test_error_levels_the_envelope_does_not_peel_are_recognised() -> None:
    yes = [
        "[2025-01-01 10:00:00,000 E 123 456] core_worker.cc:496: Failed to register worker",
        "[rank0]:[E822 16:31:16.131931664 ProcessGroupNCCL.cpp:632] [Rank 0] boom",
        "E1201 10:00:00.000123 12 foo.cc:12] failed to connect",
        "[2025-01-01 10:00:00] ERROR something broke",
        "2025-01-01T10:00:00.000Z ERROR worker: boom",
        "2024:10:01-12:00:00:(123) |CCL_ERROR| fi_getinfo error",
        'time="2025-01-01" level=error msg="failed to start"',
        "ERROR 05-01 01:51:54 [serving_chat.py:898] Error in x",
        "CRITICAL 01-01 10:00:01 [launcher.py:2] The engine stopped responding",
    ]
    no = [
        "INFO 01-01 10:00:00 [x.py:1] ERROR counters are zero",
        "WARNING 01-01 10:00:00 [x.py:1] retrying after ERROR",
        "the model reported an ERROR rate of 0 in the middle of a sentence line",
        "Everything is fine",
    ]
    assert [t for t in yes if not is_error_level(parse_line(1, t))] == []
    assert [t for t in no if is_error_level(parse_line(1, t))] == []


def test_the_collector_is_bounded() -> None:
    log = b"".join(b"ERROR 01-01 00:00:00 [x.py:1] line %d\n" % i for i in range(10_000))
    eng = AnalysisEngine("-")
    eng.feed(log)
    eng.finish()
    col = eng._error_lines
    assert len(col.lines) == MAX_LINES and col.full
    assert col.lines[-1][0] == MAX_LINES


_LINE = st.sampled_from(
    [
        b"INFO 01-01 00:00:00 [x.py:1] ok\n",
        b"ERROR 01-01 00:00:00 [x.py:1] bad\n",
        b"[2025-01-01 10:00:00,000 E 1 2] core_worker.cc:1: ERROR twice on one line\n",
        b"plain text\n",
        b"\n",
    ]
)


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(_LINE, max_size=80), cuts=st.lists(st.integers(0, 4000), max_size=6))
def test_collector_line_numbers_do_not_depend_on_chunking(
    lines: list[bytes], cuts: list[int]
) -> None:
    data = b"".join(lines)
    want = [
        (i + 1, ln.rstrip(b"\n"))
        for i, ln in enumerate(lines)
        if any(t in ln for t in (b"ERROR", b" E "))
    ][:MAX_LINES]
    eng = AnalysisEngine("-")
    points = sorted({min(c, len(data)) for c in cuts})
    prev = 0
    for p in [*points, len(data)]:
        eng.feed(data[prev:p])
        prev = p
    eng.finish()
    assert eng._error_lines.lines == want


def test_collector_scans_only_whole_lines_it_is_given() -> None:
    col = ErrorLineCollector()
    block = b"x\nERROR a\nERROR b\n"
    col.scan(block, 2, len(block), base=1)
    assert col.lines == [(2, b"ERROR a"), (3, b"ERROR b")]


def test_a_glog_line_after_the_first_is_collected() -> None:
    log = b"INFO 05-01 01:50:00 [api_server.py:1043] vLLM API server version 0.8.5\n" + (
        b"E1201 10:00:00.000123 12 coordinator.cc:12] failed to connect to the coordinator\n"
    )
    ff = analyze(log).first_failure
    assert ff is not None and (ff.line_no, ff.rule) == (2, "EXC010")


_RICH_TB = (
    "INFO 07-19 02:29:31 llm_engine.py:134] # GPU blocks: 915, # CPU blocks: 512\n"
    "╭──────── Traceback (most recent call last) ────────╮\n"
    "│ /workdir/vllm/vllm/transformers_utils/tokenizer.py:36 in get_tokenizer │\n"
    "│   35 │   try:                                                          │\n"
)


def test_a_rich_boxed_traceback_ends_in_its_exception_line() -> None:
    log = _RICH_TB + "╰───────────────────────────────────────────────────╯\n"
    log += "RuntimeError: the tokenizer could not be built\n"
    ff = analyze(log.encode()).first_failure
    assert ff is not None and (ff.line_no, ff.rule, ff.basis) == (6, "EXC001", "fallback")


def test_a_rich_boxed_traceback_cut_in_its_box_answers_its_header() -> None:
    ff = analyze(_RICH_TB.encode()).first_failure
    assert ff is not None and (ff.line_no, ff.rule) == (2, "EXC011")


def test_a_glog_line_at_a_window_boundary_is_collected() -> None:
    from kk3evidence.analysis import lastresort

    filler = b"INFO 01-01 00:00:00 [x.py:1] ok\n"
    head = filler * (lastresort._FIRST_WINDOW // len(filler) + 1)
    cut = head.rfind(b"\n", 0, lastresort._FIRST_WINDOW) + 1
    block = head[:cut] + b"E1201 10:00:00.000123 12 c.cc:12] failed to connect\n" + head[cut:]
    col = ErrorLineCollector()
    col.scan(block, 0, len(block), base=0)
    assert [no for no, _ in col.lines] == [block[:cut].count(b"\n") + 1]


def test_an_spdlog_error_line_is_the_last_resort() -> None:
    """spdlog's default pattern (InfiniStore beside vLLM, vllm-project/aibrix#1093): the level
    is lower case in its second bracket; with no other failure it is the answer."""
    log = (
        "[2025-05-15 15:48:40.101] [infini] [info] connected to 10.0.0.5:12345\n"
        "[2025-05-15 15:48:41.233] [infini] [error] [libinfinistore.cpp:910] "
        "Please register memory first\n"
    )
    ff = analyze(log).first_failure
    assert ff is not None and (ff.line_no, ff.rule) == (2, "EXC010")


def test_json_records_and_nginx_errors_are_error_level_lines() -> None:
    """Structured logs of the controllers and gateways beside vLLM (zap/logrus JSON, nginx's
    error log): their error records are last-resort answers, their info records are not."""
    errors = (
        '{"level":"error","ts":"2025-06-01T10:00:00.000Z","caller":"reconcile.go:120",'
        '"msg":"failed to reconcile InferenceService"}',
        '{"severity": "ERROR", "message": "upstream vllm-0 unreachable"}',
        "2025/06/01 10:00:00 [error] 7#7: *1 connect() failed (111: Connection refused) while "
        "connecting to upstream",
    )
    quiet = (
        '{"level":"info","ts":"2025-06-01T10:00:00.000Z","msg":"reconciled"}',
        "2025/06/01 10:00:00 [notice] 1#1: start worker processes",
        'INFO 06-01 10:00:00 [api_server.py:1] args: {"level":"error"} is only a value here',
    )
    for line in errors:
        ff = analyze(f"INFO starting\n{line}\n").first_failure
        assert ff is not None and (ff.line_no, ff.rule) == (2, "EXC010"), line
    for line in quiet:
        assert analyze(f"INFO starting\n{line}\n").first_failure is None, line


def test_slurm_and_systemd_kills_are_answers() -> None:
    """A vLLM start-up under Slurm or systemd: the scheduler's own lines say why it died."""
    head = "INFO 06-01 10:00:00 [api_server.py:1] vLLM API server version 0.11.0\n"
    cases = {
        "slurmstepd: error: Detected 1 oom_kill event in StepId=8538204.0. Some of the step "
        "tasks have been OOM Killed.": ("OOM011", "oom"),
        "Apr 18 14:22:19 node1 systemd[1]: vllm.service: Failed with result 'oom-kill'.": (
            "OOM011", "oom"),
        "slurmstepd: error: *** JOB 10763635 ON c0662 CANCELLED AT 2026-10-02T14:02:37 DUE TO "
        "TIME LIMIT ***": ("ENG025", "hang"),
    }
    for line, (rule, cat) in cases.items():
        ff = analyze(head + line + "\n").first_failure
        assert ff is not None and (ff.line_no, ff.rule, ff.category) == (2, rule, cat), line
