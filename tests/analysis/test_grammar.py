"""The envelope layer, the shared blocks and the pattern mini-language."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kk3evidence.analysis.grammar import (
    BLOCKS,
    TracebackTracker,
    compile_pattern,
    decode_line,
    parse_line,
)
from kk3evidence.errors import RuleError

# -- shared blocks ---------------------------------------------------------------------------

BLOCK_CASES = {
    "size": (["20.00 MiB", "1.5 GiB", "512 bytes", "-2.77 GiB", "64.0GiB", "8 GB"], ["GiB", "abc"]),
    "int": (["0", "42", "-3", "1,048,576"], ["x", "-"]),
    "float": (["0.5", "12", "-2.77", "1e-3"], ["abc"]),
    "num": (["7", "7.25", "1,024"], ["seven"]),
    "rank": (["rank 3", "rank=3", "Rank 12", "7"], ["rankless"]),
    "device": (["cuda:0", "GPU 0", "device 3", "GPU3", "CUDA device 1"], ["cpu", "gpu"]),
    "addr": (["host:29500", "[::]:29500", "0.0.0.0:8000", "node-1.cluster:80"], ["host", ":80"]),
    "port": (["8000", "29500"], ["port"]),
    "nzint": (["1", "137", "-6", "010"], ["0", "00", "-0", "1.5"]),
    "path": (["/models/tinyllama", "./config.json", "~/x/y", "/"], ["models"]),
    "word": (["tiny", "model_tag", "v1.2-rc"], [" ", "-x"]),
    "hex": (["0x7f685b234b68", "deadbeef00"], ["0x", "xyz"]),
    "version": (["2.21.5", "0.32.0+cpu", "12.4", "v0.6.3", "580.65.06"], ["12", "v"]),
    "quoted": (["'abc'", '"a b"', "`x`"], ["abc", "'open"]),
    "pyexc": (
        ["ValueError", "torch.OutOfMemoryError", "pkg.mod.MyException", "KeyboardInterrupt"],
        ["StopIteration", "value error"],
    ),
    "pyerr": (
        ["ValueError", "torch.OutOfMemoryError", "pkg.mod.MyException", "NcclFailure"],
        ["UserWarning", "KeyboardInterrupt", "SystemExit", "StopIteration"],
    ),
    "pyclass": (
        ["anyio.WouldBlock", "trio.Cancelled", "a.b.C"],
        ["StopIteration", "WouldBlock", "anyio.wouldblock", "torch.cuda"],
    ),
}


@pytest.mark.parametrize("name", sorted(BLOCK_CASES))
def test_every_shared_block_matches_its_examples_and_rejects_others(name: str) -> None:
    good, bad = BLOCK_CASES[name]
    el = BLOCKS[name]
    for text in good:
        toks = el.parse_string(text, parse_all=True)
        assert "".join(toks) == text, (name, text)
    for text in bad:
        with pytest.raises(Exception):  # noqa: B017 - any ParseException
            el.parse_string(text, parse_all=True)


def test_every_block_has_a_test_case() -> None:
    assert set(BLOCKS) == set(BLOCK_CASES)


# -- pattern mini-language --------------------------------------------------------------------


def test_literal_pattern_searches_body_with_flexible_whitespace() -> None:
    p = compile_pattern("unhandled system error")
    assert p.search("RuntimeError: NCCL error: unhandled   system error (run with ...)") == {}
    assert p.search("unhandled cuda error") is None


def test_star_matches_shortest_text_up_to_next_piece() -> None:
    p = compile_pattern("NCCL error{*}unhandled system error")
    assert p.search("x NCCL error in: foo.cpp:12, unhandled system error, NCCL 2.20") == {}
    assert p.search("unhandled system error before NCCL error") is None


def test_named_captures_are_returned() -> None:
    p = compile_pattern("Available KV cache memory: {size:kv}")
    assert p.search("Available KV cache memory: -2.77 GiB") == {"kv": "-2.77 GiB"}
    p2 = compile_pattern("Tried to allocate {size:req} (GPU {int:gpu}; {*:rest} total")
    caps = p2.search("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.1 GiB total")
    assert caps == {"req": "20.00 MiB", "gpu": "0", "rest": "79.1 GiB"}


def test_anchored_pattern_only_matches_at_body_start() -> None:
    p = compile_pattern("^{pyexc}: boom")
    assert p.search("ValueError: boom") == {}
    assert p.search("see ValueError: boom") is None


def test_literal_braces_are_escaped_by_doubling() -> None:
    p = compile_pattern("Failed core proc(s): {{'EngineCore': {int}}}")
    assert p.search("Failed core proc(s): {'EngineCore': 1}") == {}


@pytest.mark.parametrize("bad", ["{nosuchblock}", "{*}", "", "^", "half {brace", "a } b"])
def test_bad_patterns_raise_rule_error_with_one_line(bad: str) -> None:
    with pytest.raises(RuleError) as info:
        compile_pattern(bad)
    assert "\n" not in str(info.value)


# -- envelope -----------------------------------------------------------------------------------

ENVELOPES = [
    (
        "(APIServer pid=15538) INFO 11-30 01:47:53 [api_utils.py:286] non-default args: {}",
        {
            "process": "APIServer pid=15538",
            "pid": 15538,
            "level": "INFO",
            "timestamp": "11-30 01:47:53",
            "source_file": "api_utils.py:286",
            "body": "non-default args: {}",
        },
    ),
    (
        "(EngineCore_DP0 pid=1) ERROR 05-10 12:00:00 [core.py:1] boom",
        {"process": "EngineCore_DP0 pid=1", "level": "ERROR", "body": "boom"},
    ),
    (
        "(VllmWorker rank=1 pid=77) WARNING 05-10 12:00:00 [x.py:3] careful",
        {"process": "VllmWorker rank=1 pid=77", "rank": 1, "level": "WARNING", "body": "careful"},
    ),
    ("(VllmWorker-0 pid=5) INFO 05-10 12:00:00 [x.py:3] hi", {"rank": 0, "body": "hi"}),
    ("(Worker_TP1 pid=5) INFO 05-10 12:00:00 [x.py:3] hi", {"rank": 1, "body": "hi"}),
    ("(Worker_PP1_TP0 pid=5) INFO 05-10 12:00:00 [x.py:3] hi", {"rank": 0, "pid": 5}),
    ("(VllmWorker TP1 pid=412) ERROR 09-14 03:15:31 [m.py:596] x", {"rank": 1, "body": "x"}),
    (
        "(RayWorkerWrapper pid=9, ip=10.0.0.2) INFO 05-10 12:00:00 [w.py:1] up",
        {"process": "RayWorkerWrapper pid=9, ip=10.0.0.2", "body": "up"},
    ),
    (
        "INFO 05-10 12:00:00 llm_engine.py:176] Initializing an LLM engine",
        {"level": "INFO", "source_file": "llm_engine.py:176", "body": "Initializing an LLM engine"},
    ),
    (
        '(Worker pid=1) ERROR 11-30 01:51:06 [multiproc_executor.py:953]   File "/x.py", line 9',
        {"body": '  File "/x.py", line 9'},
    ),
    (
        "node1:412:530 [0] NCCL WARN Call to connect returned Connection refused",
        {
            "process": "node1:412",
            "pid": 412,
            "level": "WARNING",
            "body": "NCCL WARN Call to connect returned Connection refused",
        },
    ),
    (
        "[rank1]: RuntimeError: NCCL error",
        {"process": "rank1", "rank": 1, "body": "RuntimeError: NCCL error"},
    ),
    (
        "[rank0]:[W1130 01:47:52.123456 ProcessGroupNCCL.cpp:1168] Warning: WorkNCCL timed out",
        {
            "process": "rank0",
            "level": "WARNING",
            "source_file": "ProcessGroupNCCL.cpp:1168",
            "body": "Warning: WorkNCCL timed out",
        },
    ),
    (
        "[E ProcessGroupNCCL.cpp:475] [Rank 1] Watchdog caught collective operation timeout",
        {"level": "ERROR", "rank": 1, "body": "Watchdog caught collective operation timeout"},
    ),
    (
        'INFO:     127.0.0.1:5 - "GET /health HTTP/1.1" 200 OK',
        {"level": "INFO", "body": '127.0.0.1:5 - "GET /health HTTP/1.1" 200 OK'},
    ),
    (
        "vllm-1  | (APIServer pid=1) INFO 05-10 12:00:00 [a.py:1] hello",
        {"wrapper": "vllm-1", "process": "APIServer pid=1", "body": "hello"},
    ),
    (
        "Nov 30 01:02:03 gpu-host vllm[123]: ERROR 05-10 12:00:00 [a.py:1] bad",
        {"wrapper": "vllm", "level": "ERROR", "body": "bad"},
    ),
    (
        "2026-11-30T01:02:03.123456789Z stderr F "
        "(APIServer pid=1) INFO 05-10 12:00:00 [a.py:1] k8s",
        {"process": "APIServer pid=1", "body": "k8s"},
    ),
    ("\x1b[32mINFO\x1b[0m 05-10 12:00:00 [a.py:1] coloured", {"level": "INFO", "body": "coloured"}),
    ("Traceback (most recent call last):", {"process": None, "level": None}),
    (
        "  | ERROR 07-01 13:54:43 multiproc_worker_utils.py:120] Worker pid 1159 died",
        {"wrapper": "|", "level": "ERROR", "body": "Worker pid 1159 died"},
    ),
    (
        "[2026-11-30 02:37:07] vm:1635:1635 [1] graph/tuning.cc:104 NCCL WARN Unrecognized token",
        {
            "timestamp": "2026-11-30 02:37:07",
            "process": "vm:1635",
            "level": "WARNING",
            "body": "NCCL WARN Unrecognized token",
        },
    ),
    (
        " [36m(RayWorkerVllm pid=5085) [0m [E ProcessGroupNCCL.cpp:475] [Rank 4] Watchdog caught",
        {
            "process": "RayWorkerVllm pid=5085",
            "level": "ERROR",
            "rank": 4,
            "body": "Watchdog caught",
        },
    ),
    (
        '[2024-04-17 20:07:13,727] [ERROR] [MainThread] [asyncio] >>>   File "/x.py", line 1',
        {
            "timestamp": "2024-04-17 20:07:13,727",
            "level": "ERROR",
            "body": '  File "/x.py", line 1',
        },
    ),
    (
        "(EngineCore_DP0 pid=6880) ValueError: boom",
        {"process": "EngineCore_DP0 pid=6880", "level": None, "body": "ValueError: boom"},
    ),
    # ROCm HIP runtime log (AMD_LOG_LEVEL), both pid styles (docs/rules-sources.md)
    (
        ":1:hip_code_object.cpp      :505 : 99442499995 us: 350457: [tid:0x7f02e57efc00] "
        "hipErrorNoBinaryForGpu: Unable to find code object for all current devices!",
        {
            "level": "ERROR",
            "pid": 350457,
            "source_file": "hip_code_object.cpp:505",
            "body": "hipErrorNoBinaryForGpu: Unable to find code object for all current devices!",
        },
    ),
    (
        ":3:hip_memory.cpp           :777 : 3852921767 us: [pid:9     tid:0x7fcd5fa0c4c0] "
        "hipMemGetInfo: Returned hipErrorInvalidValue :",
        {"level": "INFO", "pid": 9, "body": "hipMemGetInfo: Returned hipErrorInvalidValue :"},
    ),
    # TensorFlow/XLA logging (TPU), huggingface/transformers#22328
    (
        "2023-03-23 02:02:25.057202: E tensorflow/compiler/xla/xla_client/xla_util.cc:90]   "
        "OP_REQUIRES failed at tpu_execute_op.cc:266 : RESOURCE_EXHAUSTED: Attempting to reserve",
        {
            "level": "ERROR",
            "timestamp": "2023-03-23 02:02:25.057202",
            "source_file": "tensorflow/compiler/xla/xla_client/xla_util.cc:90",
            "body": "  OP_REQUIRES failed at tpu_execute_op.cc:266 : RESOURCE_EXHAUSTED: "
            "Attempting to reserve",
        },
    ),
    # Ascend CANN plog and torch_npu
    (
        "[ERROR] HCCL(36035,mindie_llm_backend_connector):2025-05-13-02:25:58.068.817 "
        "[op_base.cc:974][36818][Init][CommRootInfoConfig]errNo[0x0000000005000002]"
        "HcclCommInitRootInfo failed.",
        {
            "level": "ERROR",
            "pid": 36035,
            "timestamp": "2025-05-13-02:25:58.068.817",
            "source_file": "op_base.cc:974",
            "body": "[Init][CommRootInfoConfig]errNo[0x0000000005000002]"
            "HcclCommInitRootInfo failed.",
        },
    ),
    (
        "[ERROR] 2025-09-03-03:02:37 (PID:7226, Device:1, RankID:3) ERR02200 DIST call hccl "
        "api failed.",
        {"level": "ERROR", "pid": 7226, "rank": 3, "body": "ERR02200 DIST call hccl api failed."},
    ),
]


@pytest.mark.parametrize(
    ("raw", "expected"), ENVELOPES, ids=[str(i) for i in range(len(ENVELOPES))]
)
def test_envelope_fields(raw: str, expected: dict[str, object]) -> None:
    line = parse_line(7, raw)
    assert line.line_no == 7
    for key, value in expected.items():
        assert getattr(line, key) == value, key


def test_progress_bar_keeps_last_carriage_return_segment() -> None:
    raw = b"\rLoading:   0% | 0/1\rLoading: 100% | 1/1\r\n"
    assert decode_line(raw) == "Loading: 100% | 1/1"


def test_crlf_ansi_invalid_utf8_and_nul_are_cleaned_for_display() -> None:
    assert decode_line(b"hello\r\n") == "hello"
    assert decode_line(b"\x1b[1;31mred\x1b[0m") == "red"
    assert decode_line(b"bad \xff\xfe byte") == "bad \ufffd\ufffd byte"
    assert decode_line(b"a\x00b") == "ab"


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=400), st.text(max_size=400)))
def test_parse_line_never_raises(raw: bytes | str) -> None:
    line = parse_line(1, raw)
    assert isinstance(line.body, str)


# -- tracebacks ---------------------------------------------------------------------------------


def _roles(lines: list[str]) -> list[tuple[str | None, int | None, int]]:
    tr = TracebackTracker()
    out = []
    for i, raw in enumerate(lines, 1):
        ln = tr.feed(parse_line(i, raw))
        out.append((ln.tb_role, ln.tb_chain, ln.tb_index))
    return out


def test_chained_traceback_roles_and_chain_positions() -> None:
    log = [
        "Traceback (most recent call last):",
        '  File "/x.py", line 1, in f',
        "    return next(it)",
        "StopIteration",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "/y.py", line 2, in g',
        "importlib.metadata.PackageNotFoundError: No package metadata was found for vllm",
        "after",
    ]
    roles = _roles(log)
    assert roles[0] == ("header", 0, 0)
    assert roles[3] == ("exception", 0, 0)
    assert roles[5][0] == "separator"
    assert roles[7] == ("header", 0, 1)
    assert roles[9] == ("exception", 0, 1)
    assert roles[10][0] is None


def test_frames_without_a_header_open_a_traceback() -> None:
    p = "(EngineCore pid=316) "
    log = [
        p + '  File "/x/core.py", line 144, in __init__',
        p + "    kv = self._initialize_kv_caches(cfg)",
        p + "    ...<6 lines>...",
        "v_caches",  # a hard-wrapped tail of the previous line (another key): ignored
        p + "ValueError: To serve at least one request",
    ]
    roles = [r[0] for r in _roles(log)]
    assert roles == ["frame", "frame", "frame", None, "exception"]


def test_tracebacks_are_tracked_per_process_and_pydantic_detail_lines_kept() -> None:
    p = "(Worker pid=1) ERROR 05-10 12:00:00 [m.py:1] "
    q = "(EngineCore pid=2) INFO 05-10 12:00:00 [c.py:1] "
    log = [
        p + "Traceback (most recent call last):",
        p + '  File "/x.py", line 1, in f',
        q + "unrelated line from another process",
        p + "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
        p + "  Value error, User-specified max_model_len (1000000) is greater",
    ]
    roles = _roles(log)
    assert [r[0] for r in roles] == ["header", "frame", None, "exception", "detail"]
    chains = {r[1] for r in roles if r[0]}
    assert chains == {0}


def test_docker_json_file_lines_are_unwrapped() -> None:
    raw = (
        '{"log":"(APIServer pid=1) ERROR 05-10 12:00:00 [a.py:1] boom\\n",'
        '"stream":"stderr","time":"2026-11-30T01:02:03.1Z"}'
    )
    line = parse_line(1, raw)
    assert (line.process, line.level, line.body) == ("APIServer pid=1", "ERROR", "boom")


_WORDS = st.text(
    alphabet=st.characters(whitelist_categories=("L", "N"), whitelist_characters="._-:'/()="),
    min_size=1,
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_WORDS, min_size=1, max_size=6))
def test_a_literal_pattern_finds_itself_with_any_whitespace(words: list[str]) -> None:
    pattern = " ".join(words)
    p = compile_pattern(pattern)
    assert p.search(pattern) == {}
    assert p.search("prefix  " + "\t ".join(words) + " suffix") == {}


@settings(max_examples=100, deadline=None)
@given(_WORDS, _WORDS, st.text(max_size=40))
def test_star_skips_any_filler_between_two_literals(a: str, b: str, filler: str) -> None:
    p = compile_pattern(f"{a}{{*}}{b}")
    assert p.search(f"{a}{filler}{b}") is not None


@pytest.mark.timeout(120)
def test_pathological_long_candidate_line_is_bounded() -> None:
    from kk3evidence.analysis.engine import analyze

    line = ("NCCL error in: x.cpp:1, " * 40000 + "\n").encode()
    a = analyze(line * 3)
    assert a.lines_total == 3


def test_literal_caret_escapes_and_kubectl_prefix_are_peeled() -> None:
    caret = parse_line(
        1, "^[[36m(RayWorkerWrapper pid=123)^[[0m ERROR 01-01 00:00:00 [x.py:1] boom"
    )
    assert caret.body == "boom" and caret.process == "RayWorkerWrapper pid=123"
    kube = parse_line(1, "[pod/vllm-0/vllm] ERROR 01-01 00:00:00 [x.py:1] boom")
    assert kube.body == "boom" and kube.level == "ERROR" and kube.wrapper == "pod/vllm-0/vllm"
    quoted = parse_line(1, '"  | [2024-09-05T00:38:34Z] ERROR:    [Errno 98] bind failed')
    assert quoted.body == "[Errno 98] bind failed" and quoted.level == "ERROR"


@pytest.mark.parametrize(
    ("raw", "process"),
    [
        ("(pid=12345) ERROR 01-01 00:00:00 [x.py:1] boom", "pid=12345"),
        ("(raylet) ERROR 01-01 00:00:00 [x.py:1] boom", "raylet"),
        (
            "(pid=1, ip=10.0.0.1) ERROR 01-01 00:00:00 [x.py:1] boom [repeated 3x across cluster]",
            "pid=1, ip=10.0.0.1",
        ),
        ("[1,0]<stderr>:ERROR 01-01 00:00:00 [x.py:1] boom", None),
        ("3: (EngineCore pid=1) ERROR 01-01 00:00:00 [x.py:1] boom", "EngineCore pid=1"),
    ],
)
def test_ray_mpirun_and_srun_prefixes_are_peeled(raw: str, process: str | None) -> None:
    ln = parse_line(1, raw)
    assert ln.body == "boom" and ln.level == "ERROR" and ln.process == process


def test_a_numbered_plain_line_keeps_its_number() -> None:
    assert parse_line(1, "1: something else").body == "1: something else"
