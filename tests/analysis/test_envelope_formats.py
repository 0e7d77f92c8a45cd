"""The table of envelope formats (``kk3evidence.analysis.envelope.FORMATS``, lnav style).

Every format carries real sample lines that start with its own prefix. Here every sample goes
through :func:`parse_line` (the body, process and level it must give), every format must fire
on its own samples, and every format runs on the other formats' samples: the overlaps found
are pinned below, each one resolved by table order (the sample's own format comes first in the
layer). A new format that overlaps another must say so here, and be ordered so it is resolved.
"""

from __future__ import annotations

import pytest

from kk3evidence.analysis import envelope
from kk3evidence.analysis.envelope import FORMATS, EnvelopeFormat, LogLine, Sample, parse_line

# (format that also fires, format whose sample it fires on)
KNOWN_OVERLAPS = {
    # "[ERROR] HCCL(…)" and "[ERROR] 2025-…(PID:…)" are also "[ERROR] msg": the Ascend formats
    # come first in the level layer, so their source/pid/timestamp are kept.
    ("bracket_level", "cann"),
    ("bracket_level", "torch_npu"),
    # "2025-03-24 22:04:27 | ERROR | stderr | …" also starts with an ISO timestamp: the pipe
    # format comes first in the wrapper layer, so its level and logger name are peeled too.
    ("k8s_iso", "pipe_log"),
    # "3: (EngineCore pid=1) …" is also a host label, "[pod/x/c] …" and "[Stage-0] …" also a
    # bracketed label: srun's, kubectl's and vLLM-Omni's formats come first and keep their
    # names.
    ("host_label", "srun_label"),
    ("bracket_label", "kubectl"),
    ("bracket_label", "omni_stage"),
}

SAMPLES = [(f, s) for f in FORMATS for s in f.samples]


def _fires(fmt: EnvelopeFormat, line: str) -> bool:
    """The format's guard passes and its expression matches at the start of ``line``."""
    head = line.lstrip()[:1] if fmt.layer == "level" else line[:1]
    guard = fmt.guard
    return guard.head_ok(head) and guard.text_ok(line) and fmt.regex.match(line) is not None


def test_every_format_is_named_once_and_has_samples() -> None:
    names = [f.name for f in FORMATS]
    assert len(names) == len(set(names))
    for f in FORMATS:
        assert f.samples, f"envelope format {f.name!r} has no sample lines"
        assert f.layer in ("wrapper", "process", "level")
        assert set(f.yields) <= set(LogLine.__dataclass_fields__), f.name


@pytest.mark.parametrize(
    ("fmt", "sample"),
    SAMPLES,
    ids=[f"{f.name}-{i}" for f in FORMATS for i in range(len(f.samples))],
)
def test_every_sample_parses_to_its_body_process_and_level(
    fmt: EnvelopeFormat, sample: Sample
) -> None:
    line = parse_line(1, sample.line)
    assert (line.body, line.process, line.level) == (sample.body, sample.process, sample.level)
    assert _fires(fmt, sample.line), f"{fmt.name} does not fire on its own sample"


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
def test_every_yielded_field_is_set_by_some_sample(fmt: EnvelopeFormat) -> None:
    parsed = [parse_line(1, s.line) for s in fmt.samples]
    for name in fmt.yields:
        assert any(getattr(p, name) is not None for p in parsed), (fmt.name, name)


def test_formats_overlap_only_where_known_and_table_order_resolves_it() -> None:
    found = {
        (f.name, g.name)
        for f in FORMATS
        for g in FORMATS
        if f is not g and any(_fires(f, s.line) for s in g.samples)
    }
    assert found == KNOWN_OVERLAPS
    order = {f.name: i for i, f in enumerate(FORMATS)}
    layer = {f.name: f.layer for f in FORMATS}
    for also, own in found:
        assert layer[also] == layer[own] and order[own] < order[also], (also, own)


def test_plain_and_non_ascii_first_characters() -> None:
    """Plain lines peel nothing; a non-ASCII first character takes the uncached candidate path
    and the guards' own tests (``str.isdigit`` admits any Unicode digit, as ``\\d`` does)."""
    for text in ("plain words", "", "   ", "\u00e9t\u00e9 | x", "1: something else"):
        line = parse_line(1, text)
        assert (line.body, line.level, line.process, line.wrapper) == (text, None, None, None)
    srun = parse_line(1, "\u0663: (Worker pid=1) INFO 05-10 12:00:00 [x.py:1] up")
    assert (srun.body, srun.process, srun.level) == ("up", "Worker pid=1", "INFO")
    assert "\u0663" not in envelope._TABLES.wrapper.by_head


def test_layers_are_built_from_the_table() -> None:
    tables = envelope._build_tables(FORMATS)
    built = [len(t.entries) for t in (tables.wrapper, tables.process, tables.level)]
    assert sum(built) == len(FORMATS)
    for t in (tables.wrapper, tables.process, tables.level):
        for head, cands in t.by_head.items():
            assert [i for i, _ in cands] == sorted(i for i, _ in cands), head


def test_nccl_keeps_its_source_location_for_rules() -> None:
    line = parse_line(1, "paula09:2528103:2528103 [0] ras/client_support.cc:160 NCCL WARN Call to "
                     "bind failed: Address already in use")
    assert line.source_file == "ras/client_support.cc:160"
    assert line.body == "NCCL WARN Call to bind failed: Address already in use"


def test_nccl_ras_bind_is_noise_but_a_bootstrap_bind_is_a_failure() -> None:
    from kk3evidence.analysis.engine import analyze as _analyze

    msg = b" NCCL WARN Call to bind failed: Address already in use\n"
    ras = b"h:1:1 [0] ras/client_support.cc:160" + msg
    boot = b"h:1:1 [0] misc/socket.cc:484" + msg
    assert _analyze(ras).first_failure is None
    ff = _analyze(boot).first_failure
    assert ff is not None and ff.category == "nccl"


def test_vllm_colour_codes_pasted_without_their_escape_byte_are_dropped() -> None:
    line = parse_line(
        1,
        "INFO 2025-03-30T23:51:21.299840450Z [1;36m(VllmWorkerProcess pid=630)[0;0m ERROR "
        "03-30 23:51:21 multiproc_worker_utils.py:243] KeyError: 'layers.32.k_scale'",
    )
    assert line.body == "KeyError: 'layers.32.k_scale'"
    assert (line.process, line.level) == ("VllmWorkerProcess pid=630", "ERROR")


def test_rsyslog_escaped_colour_codes_and_carriage_returns_are_dropped() -> None:
    line = parse_line(
        1, "#033[2m#033[33m(raylet)#033[0m node_manager.cc:3007: 2 Workers (tasks /"
    )
    assert line.body.endswith("node_manager.cc:3007: 2 Workers (tasks /")
    assert "#033" not in line.text
    frame = parse_line(2, '  File "/v/gpu_model_runner.py", line 9, in capture_model#015')
    assert frame.body == '  File "/v/gpu_model_runner.py", line 9, in capture_model'


def test_c10d_glog_prefix_with_a_three_digit_month_is_peeled() -> None:
    line = parse_line(
        1,
        "[rank6]:[E421 04:13:43.457389636 ProcessGroupGloo.cpp:143] Rank 6 successfully "
        "reached monitoredBarrier",
    )
    assert line.body == "Rank 6 successfully reached monitoredBarrier"
    assert (line.level, line.rank) == ("ERROR", 6)
