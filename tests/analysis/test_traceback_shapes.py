"""Traceback shapes that pastes produce (issue 13): indentation drift, headerless frame runs,
bare exception class names; and the per-line helpers of the dense-log hot path."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kk3evidence._literals import LiteralScanner
from kk3evidence.analysis import engine
from kk3evidence.analysis.engine import analyze
from kk3evidence.analysis.grammar import TracebackTracker, parse_line
from kk3evidence.analysis.hang import HangScan

CORPUS = Path(__file__).resolve().parents[2] / "corpus"


def _roles(text: str) -> list[str | None]:
    t = TracebackTracker()
    return [t.feed(parse_line(i, ln)).tb_role for i, ln in enumerate(text.split("\n"), 1)]


def test_an_exception_line_reindented_after_drifting_frames_ends_the_traceback() -> None:
    log = (
        "Traceback (most recent call last):\n"
        'File "/a/serving.py", line 642, in gen\n'
        "     parser.process(tok)\n"
        '   File "/a/harmony.py", line 627, in process\n'
        "     self._inner.process(tok)\n"
        " harmony.HarmonyError: Unexpected token 12"
    )
    assert _roles(log) == ["header", "frame", "frame", "frame", "frame", "exception"]


def test_a_headerless_frame_run_ends_at_a_bare_exception_class_name() -> None:
    log = (
        '   File ".../tpu/utils.py", line 205, in make_mesh\n'
        "     devices = sorted(devices, key=lambda x: x.coords)\n"
        "   AttributeError"
    )
    assert _roles(log) == ["frame", "frame", "exception"]


def test_lines_indented_deeper_than_the_frames_stay_frames() -> None:
    log = (
        "Traceback (most recent call last):\n"
        '  File "/a/x.py", line 1, in f\n'
        "    ValueError\n"  # a source line that happens to look like a class name
        "    ~~~~^^^\n"
        "  [Previous line repeated 996 more times]\n"
        '  File "/a/y.py", line 2, in g\n'
        "    Foo: int = 3\n"
        "RecursionError: maximum recursion depth exceeded"
    )
    roles = _roles(log)
    assert roles[1:7] == ["frame"] * 6
    assert roles[7] == "exception"


def test_a_file_line_that_lost_its_indentation_is_a_frame_inside_a_traceback_only() -> None:
    inside = 'Traceback (most recent call last):\nFile "/a/x.py", line 1, in f\nKeyError: 1'
    assert _roles(inside) == ["header", "frame", "exception"]
    # Outside a traceback a column-0 File line opens one only when it is a whole frame line
    # (function name included: a paste that lost its indentation, blind sets 10 and 11); the
    # line after it then ends the frames, and a log that states nothing stays clean.
    assert _roles('File "/a/x.py", line 1\nINFO ready') == [None, None]
    assert _roles('File "/a/x.py", line 1, in f\nINFO ready') == ["frame", "exception"]
    assert analyze('File "/a/x.py", line 1, in f\nINFO ready\n').first_failure is None


def test_an_indented_message_line_at_the_frame_indent_needs_the_exception_shape() -> None:
    log = (
        "Traceback (most recent call last):\n"
        '  File "/a/x.py", line 1, in f\n'
        "    g()\n"
        "  and then something\n"  # lowercase: not an exception line, still part of the frames
        "OSError: [Errno 28] No space left on device"
    )
    assert _roles(log) == ["header", "frame", "frame", "frame", "exception"]


def test_a_headerless_bare_exception_is_a_fallback_failure() -> None:
    log = (
        "INFO 12-01 10:00:00 [api_server.py:1] starting\n"
        '  File "/v/tpu_inference/utils.py", line 205, in make_mesh\n'
        "    devices = sorted(devices)\n"
        "  AttributeError\n"
    )
    a = analyze(log)
    ff = a.first_failure
    assert ff is not None and ff.line_no == 4 and ff.basis == "fallback"


@pytest.mark.parametrize(
    "case",
    [
        "b5-crush611-gptoss-harmony-stream-generator-indented",
        "b5-marin4413-tpu-v6e4-make-optimized-mesh-attributeerror",
    ],
)
def test_the_real_pasted_tracebacks_get_their_labelled_first_line(case: str) -> None:
    label = tomllib.loads((CORPUS / case / "case.toml").read_text(encoding="utf-8"))
    data = (CORPUS / case / "output.log").read_bytes()
    for runs in (True, False):  # the frame-run fast path and the line-by-line path agree
        try:
            engine.FRAME_RUNS = runs
            ff = analyze(data).first_failure
        finally:
            engine.FRAME_RUNS = True
        assert ff is not None and ff.line_no == label["first_line"]


_LINES = st.sampled_from(
    [
        '  File "/v/vllm/v1/worker/gpu_worker.py", line 9, in load_model',
        ' File "/x.py", line 2, in g',
        '   File "/y.py", line 3, in h',
        'File "/z.py", line 4, in k',
        "    x = a | b",
        "     source()",
        "    ValueError",
        " openai_harmony.HarmonyError: bad token",
        "   AttributeError",
        "  torch.OutOfMemoryError: CUDA out of memory",
        "  Érreur: non",
        "  [Previous line repeated 3 more times]",
        "",
        "Traceback (most recent call last):",
        "RuntimeError: boom",
    ]
)
_PREFIXES = st.sampled_from(
    ["", "(Worker pid=7) ERROR 11-30 01:56:46 [m.py:1] ", "[rank1]: ", "   "]
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_PREFIXES, _LINES), min_size=1, max_size=30))
def test_frame_runs_match_line_by_line_on_reindented_tracebacks(
    lines: list[tuple[str, str]],
) -> None:
    head = "(Worker pid=7) ERROR 11-30 01:56:46 [m.py:1] Traceback (most recent call last):\n"
    data = (head + "".join(p + t + "\n" for p, t in lines)).encode()
    try:
        engine.FRAME_RUNS = True
        fast = analyze(data).to_json()
        engine.FRAME_RUNS = False
        slow = analyze(data).to_json()
    finally:
        engine.FRAME_RUNS = True
    assert fast == slow


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text(alphabet="abé→ \x00", max_size=3), max_size=8),
    st.text(alphabet="abé→ \x00", max_size=20),
)
def test_literal_set_finds_exactly_the_literals_in_a_line(lits: list[str], text: str) -> None:
    assert LiteralScanner(lits).ids(text) == [i for i, a in enumerate(lits) if a in text]


def test_ranks_found_late_in_a_block_get_their_own_line_numbers() -> None:
    world = (
        "(Worker pid={p}) INFO 12-01 03:47:40 [parallel_state.py:1906] world_size=3 rank={r} "
        "local_rank={r} distributed_init_method=tcp://127.0.0.1:29612 backend=gloo\n"
    )
    block = "".join("filler\n" * 5 + world.format(p=10 + r, r=r) for r in range(3))
    scan = HangScan()
    scan.feed(block.encode())
    assert {r: v.first_line for r, v in scan.ranks.items()} == {0: 6, 1: 12, 2: 18}


_BODY_LINES = st.sampled_from(
    [
        b'  File "/x.py", line 2, in g',
        b'   File "/y.py", line 3, in h',
        b"    x = f(a) | g(b)",
        b"     source()",
        b"    ValueError",
        b" openai_harmony.HarmonyError: bad token",
        b"   AttributeError",
        b"  \xc3\x89rreur: non",
        b"  \x1b[31mred\x1b[0m",
        b"  across cluster]",
        b"  x\r",
        b"  y\rz",
        b"Traceback (most recent call last):",
        b"",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_BODY_LINES, min_size=1, max_size=20), st.one_of(st.none(), st.integers(0, 4)))
def test_the_one_pass_run_cut_equals_the_bytes_find_path(
    lines: list[bytes], frame_indent: int | None
) -> None:
    bodies = b"\n".join(lines)
    want = min(engine._first_special(bodies), engine._exception_cut(bodies, frame_indent))
    assert engine._run_cut(bodies, frame_indent) == want


def test_the_run_scanner_is_built_where_hyperscan_is_installed() -> None:
    pytest.importorskip("hyperscan")
    assert engine._run_scanner()[0] is not None


def test_a_databricks_notebook_cell_frame_keeps_the_ipython_traceback_open() -> None:
    from kk3evidence.analysis.engine import analyze

    a = analyze(
        b"AssertionError                            Traceback (most recent call last)\n"
        b"File <command-2469377940857761>, line 10\n"
        b"      9 )\n"
        b"---> 10 output = llm.generate([\"Hello\"], sampling_params=sampling_params)\n"
        b"\n"
        b"File /local_disk0/env/lib/python3.10/site-packages/vllm/entrypoints/llm.py:157, in "
        b"LLM.generate(self, prompts)\n"
        b"--> 157 return self._run_engine(use_tqdm)\n"
    )
    ff = a.first_failure
    assert ff is not None and ff.line_no == 1


# --- pastes that lost all indentation (a forum or blog post flattens code blocks) -----------


def test_a_traceback_flattened_to_column_0_keeps_its_source_and_caret_lines_as_frames() -> None:
    log = (
        "Traceback (most recent call last):\n"
        'File "/v/engine.py", line 12, in step\n'
        "outputs = self.model_executor.execute_model(req)\n"
        "^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        'File "/v/runner.py", line 40, in execute_model\n'
        "return self.forward(x)\n"
        'File "/v/runner.py", line 80, in forward\n'
        "raise ValueError(msg)\n"
        "ValueError: bad shape"
    )
    assert _roles(log) == ["header"] + ["frame"] * 7 + ["exception"]


def test_a_flattened_frame_without_source_ends_at_a_dotted_exception_with_its_cause() -> None:
    log = (
        "Traceback (most recent call last):\n"
        'File "<frozen runpy>", line 198, in _run_module_as_main\n'
        "ray.exceptions.RayTaskError(ValueError): ray::Worker.load() failed"
    )
    assert _roles(log) == ["header", "frame", "exception"]


def test_a_flattened_frame_without_source_ends_at_a_lowercase_or_private_exception() -> None:
    for exc in ("socket.gaierror: [Errno -2] Name or service not known", "_InactiveRpcError"):
        log = (
            "Traceback (most recent call last):\n"
            'File "/usr/lib/python3.10/socket.py", line 955, in getaddrinfo\n' + exc
        )
        assert _roles(log) == ["header", "frame", "exception"], exc


def test_a_flattened_raise_after_a_glued_frame_is_still_a_source_line() -> None:
    """Gaudi's vllm-fork (HabanaAI/vllm-fork#1559, corpus b13-habanapr1559): a torchrun paste
    without indentation in which one frame was glued to the source line above it."""
    case = next(CORPUS.glob("b13-habanapr1559-*"))
    text = (case / "output.log").read_text(encoding="utf-8")
    assert _roles(text)[6] == "frame"  # `raise NotImplementedError`
    ff = analyze(case / "output.log").first_failure
    label = tomllib.loads((case / "case.toml").read_text(encoding="utf-8"))
    assert ff is not None and ff.line_no == label["first_line"]


def test_an_unindented_statement_after_a_caret_line_ends_nothing_it_should_not() -> None:
    # A log line of another kind after a flattened frame's source: the traceback ends there
    # (exception role), as it did before flattening was understood: nothing is swallowed.
    log = (
        'File "/v/a.py", line 3, in f\n'
        "x = g()\n"
        "INFO 12-01 10:00:00 [api_server.py:1] Starting vLLM API server\n"
        "ERROR 12-01 10:00:01 [core.py:9] EngineCore failed to start."
    )
    roles = _roles(log)
    assert roles[:2] == ["frame", "frame"]
    assert roles[3] is None


# --- characters of web pages: the same log answers the same ---------------------------------

_WEB_CASES = [
    "b13-habanapr1559-hpu-embedding-warmup-graphs-notimplementederror",
    "b5-crush611-gptoss-harmony-stream-generator-indented",
    "b12-9280-lora-modules-to-save-lm-head-unsupported-lora-weight",
    "b11-8912-llama31-tool-call-keyerror-starlette-frames",
    "realrun-fail-kv-cache-too-small",
    "realrun-fail-headdim16-first-request",
    "issue-6732-pynccl-unhandled-cuda-error",
]
_WEB_FORMS = {
    # every blank a no-break space (an HTML page's &nbsp;)
    "nbsp": lambda s: s.replace(" ", "\u00a0"),
    # indentation in ideographic spaces, a zero-width space before each newline
    "cjk": lambda s: "\n".join(
        "\u3000" * (len(ln) - len(ln.lstrip(" "))) + ln.lstrip(" ") + "\u200b"
        for ln in s.split("\n")
    ),
    # a blog editor's curly quotes and a byte-order mark at the start
    "curly": lambda s: "\ufeff"
    + s.replace('"', "\u201c", 1).replace('"', "\u201d").replace("'", "\u2019"),
}


@pytest.mark.parametrize("form", sorted(_WEB_FORMS))
@pytest.mark.parametrize("case", _WEB_CASES)
def test_a_log_copied_from_a_web_page_gets_the_answer_of_the_plain_log(
    case: str, form: str, tmp_path: Path
) -> None:
    src = CORPUS / case / "output.log"
    plain = analyze(src).first_failure
    copy = tmp_path / "copied.log"
    copy.write_bytes(_WEB_FORMS[form](src.read_bytes().decode("utf-8")).encode("utf-8"))
    got = analyze(copy).first_failure
    assert plain is not None and got is not None
    assert (got.line_no, got.category, got.rule) == (plain.line_no, plain.category, plain.rule)


def test_web_characters_split_across_read_blocks_are_still_plain_blanks() -> None:
    """The engine rewrites whole lines: a no-break space whose two bytes straddle a read-block
    boundary reaches the scanner with the line it belongs to. The rule's words (`illegal
    memory access`) hold blanks: without the rewrite only the generic exception fallback
    (category other) would answer."""
    line = "ERROR 12-01 10:00:01 [core.py:9] RuntimeError: CUDA error: an illegal memory access\n"
    line = line.replace("illegal ", "illegal\u00a0").replace("memory ", "memory\u00a0")
    data = ("INFO 12-01 10:00:00 [a.py:1] x\n" * 3 + line).encode()
    cut = data.index("\u00a0".encode()) + 1  # between the NBSP's two bytes
    eng = engine.AnalysisEngine()
    eng.feed(data[:cut])
    eng.feed(data[cut:])
    ff = eng.finish().first_failure
    assert ff is not None and ff.line_no == 4 and ff.category == "illegal_memory"


def test_a_stopped_run_copied_from_a_web_page_gets_the_same_stall_verdict(tmp_path: Path) -> None:
    """The stall scan (`--stopped`) reads the same rewritten bytes as the rule engine: the
    two-node hang's missing rank is still found with every blank a no-break space."""
    src = CORPUS / "realrun-hang-two-node-missing-node1" / "output.log"
    copy = tmp_path / "copied.log"
    copy.write_bytes(src.read_bytes().decode("utf-8").replace(" ", "\u00a0").encode("utf-8"))
    plain, copied = analyze(src, stopped=True), analyze(copy, stopped=True)
    assert copied.first_failure is not None and plain.first_failure is not None
    assert copied.first_failure.line_no == plain.first_failure.line_no
    stall = copied.to_json()["stall"]
    assert stall["missing_ranks"] == plain.to_json()["stall"]["missing_ranks"] == [1]
    assert stall["world_size"] == 2


def test_a_flush_left_paste_with_a_blank_before_its_later_lines_keeps_its_exception() -> None:
    """A paste whose frames lost their indentation while every later line gained one blank
    (vllm-project/vllm#13307, corpus b15-13307): the exception line sits one blank deeper than
    the frames and still ends them, in the tracker and in the engine's fast path."""
    case = next(CORPUS.glob("b15-13307-*"))
    text = (case / "output.log").read_text(encoding="utf-8")
    assert _roles(text)[:6] == ["header", "frame", "frame", "frame", "frame", "exception"]
    ff = analyze(case / "output.log").first_failure
    label = tomllib.loads((case / "case.toml").read_text(encoding="utf-8"))
    assert ff is not None and ff.line_no == label["first_line"] == 6


def test_a_source_line_two_blanks_deep_under_flush_left_frames_stays_a_frame() -> None:
    log = (
        "Traceback (most recent call last):\n"
        'File "/v/runner.py", line 80, in forward\n'
        "  Config(x)\n"
        "RuntimeError: bad"
    )
    assert _roles(log) == ["header", "frame", "frame", "exception"]
