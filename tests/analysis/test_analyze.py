"""analyze(): inputs, the CLI contract, robustness, and the real vLLM runs."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kk3evidence.analysis.engine import AnalysisEngine, analyze, utf16_as_utf8
from kk3evidence.cli import main
from kk3evidence.errors import InputError

FAIL_LOG = (
    b"(APIServer pid=1) INFO 11-30 01:47:53 [api_utils.py:286] non-default args: {}\n"
    b"(Worker pid=3) INFO 11-30 01:48:03 [cpu_model_runner.py:68] Starting to load model /m...\n"
    b"(Worker pid=3) INFO 11-30 01:48:03 [default_loader.py:501] "
    b"Loading weights took 0.01 seconds\n"
    b"(EngineCore pid=2) ERROR 11-30 01:56:15 [core.py:1510] EngineCore failed to start.\n"
    b"(EngineCore pid=2) ERROR 11-30 01:56:15 [core.py:1510] Traceback (most recent call last):\n"
    b'(EngineCore pid=2) ERROR 11-30 01:56:15 [core.py:1510]   File "/x.py", line 1, in f\n'
    b"(EngineCore pid=2) ERROR 11-30 01:56:15 [core.py:1510] ValueError: To serve at least one "
    b"request with the model's max seq len (2048), (0.0 GiB KV cache is needed, which is larger "
    b"than the available KV cache memory (0.0 GiB). Based on the available memory\n"
    b"RuntimeError: Engine core initialization failed. See root cause above.\n"
)

SPEC_KEYS = [
    "schema",
    "source",
    "lines_total",
    "last_stage_reached",
    "stages",
    "first_failure",
    "consequences",
    "findings",
    "stall",  # 0.2, additive
    "engine_config",  # 0.2, additive
]


ANALYSIS_SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "schemas" / "analysis.schema.json").read_text(
        encoding="utf-8"
    )
)
_VALIDATOR = jsonschema.Draft202012Validator(ANALYSIS_SCHEMA)


def _check_spec_shape(doc: dict) -> None:  # type: ignore[type-arg]
    errors = [e.message for e in _VALIDATOR.iter_errors(doc)]
    assert not errors, errors
    assert [k for k in doc if k != "extra"] == SPEC_KEYS
    assert doc["schema"] == "kk3evidence/analysis/v1"
    for s in doc["stages"]:
        assert set(s) == {"stage", "status", "first_line", "last_line"}
    if doc["first_failure"] is not None:
        assert set(doc["first_failure"]) == {
            "stage",
            "category",
            "rule",
            "line_no",
            "text",
            "process",
            "basis",  # 0.2, additive
        }
    for c in doc["consequences"]:
        assert {"line_no", "rule", "text"} <= set(c)


# -- inputs ---------------------------------------------------------------------------------------


def test_path_bytes_lines_and_file_objects_agree(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    p.write_bytes(FAIL_LOG)
    results = [
        analyze(p),
        analyze(str(p)),
        analyze(FAIL_LOG),
        analyze(io.BytesIO(FAIL_LOG)),
        analyze(FAIL_LOG.decode().splitlines()),
        analyze(FAIL_LOG.splitlines(keepends=True)),
    ]
    firsts = {(r.first_failure.line_no, r.first_failure.rule) for r in results if r.first_failure}
    assert firsts == {(7, "KV001")}
    assert {r.lines_total for r in results} == {8}


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_a_utf16_log_with_a_byte_order_mark_reads_as_its_text(
    tmp_path: Path, encoding: str
) -> None:
    """Windows PowerShell writes `>` and `Tee-Object` output as UTF-16LE with a byte-order
    mark and CRLF line ends (corpus b16-file-invoicevlm-…): same answer, same line numbers."""
    bom = "\ufeff".encode(encoding)
    text = FAIL_LOG.decode().replace("\n", "\r\n")
    p = tmp_path / "server.log"
    p.write_bytes(bom + text.encode(encoding))
    ref = analyze(FAIL_LOG)
    for got in (analyze(p), analyze(p.read_bytes()), analyze(io.BytesIO(p.read_bytes()))):
        assert got.first_failure is not None and ref.first_failure is not None
        assert (got.first_failure.line_no, got.first_failure.rule) == (7, "KV001")
        assert got.first_failure.text == ref.first_failure.text
        assert got.lines_total == ref.lines_total


def test_a_utf16_log_split_inside_a_character_still_decodes() -> None:
    data = "\ufeff".encode("utf-16-le") + FAIL_LOG.decode().encode("utf-16-le")
    out = b"".join(utf16_as_utf8(iter([data[i : i + 3] for i in range(0, len(data), 3)])))
    assert out == FAIL_LOG


def test_any_chunking_gives_the_same_answer() -> None:
    ref = analyze(FAIL_LOG).to_json()
    for size in (1, 7, 64, 333):
        eng = AnalysisEngine("<bytes>")
        for i in range(0, len(FAIL_LOG), size):
            eng.feed(FAIL_LOG[i : i + size])
        assert eng.finish().to_json() == ref


def test_bundle_is_analysed_without_extracting(tmp_path: Path) -> None:
    bundle_factory = pytest.importorskip("bundle_factory")
    for name in ("run.tar", "run.tar.gz"):
        out = bundle_factory.write_bundle(tmp_path / name, log=FAIL_LOG)
        a = analyze(out)
        assert a.first_failure is not None and a.first_failure.line_no == 7
        assert a.source == str(out)


def test_gzip_compressed_plain_log(tmp_path: Path) -> None:
    import gzip

    p = tmp_path / "server.log.gz"
    p.write_bytes(gzip.compress(FAIL_LOG))
    a = analyze(p)
    assert a.first_failure is not None and a.first_failure.line_no == 7
    bad = tmp_path / "bad.log.gz"
    bad.write_bytes(gzip.compress(FAIL_LOG)[:40])
    with pytest.raises(InputError):
        analyze(bad)


def test_missing_file_and_directory_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        analyze(tmp_path / "nope.log")
    with pytest.raises(InputError, match="directory"):
        analyze(tmp_path)


def test_corrupt_bundle_is_an_input_error_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage-not-gzip")
    with pytest.raises(InputError):
        analyze(bad)


def test_last_line_without_newline_counts_and_crlf_is_fine() -> None:
    a = analyze(b"a\r\nb\r\nRuntimeError: Engine core initialization failed. See root cause above.")
    assert a.lines_total == 3


def test_empty_input() -> None:
    a = analyze(b"")
    assert (a.lines_total, a.first_failure, a.stages, a.last_stage_reached) == (0, None, (), None)


def test_fifty_megabyte_single_line_does_not_crash() -> None:
    data = b"x" * (50 * 1024 * 1024) + b"\nRuntimeError: Cannot find any model weights with `/m`\n"
    a = analyze(io.BytesIO(data))
    assert a.lines_total == 2
    assert a.extra.long_lines_truncated == 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=3000))
def test_random_binary_never_crashes(data: bytes) -> None:
    a = analyze(data)
    assert a.lines_total == data.count(b"\n") + (0 if not data or data.endswith(b"\n") else 1)
    json.dumps(a.to_json())


_PIECES = [
    "Traceback (most recent call last):\n",
    '  File "/x.py", line 1, in f\n',
    "    code()\n",
    "ValueError: boom\n",
    "\n",
    "The above exception was the direct cause of the following exception:\n",
    "(Worker pid=1) ERROR 05-10 12:00:00 [m.py:1] ",
    "[rank0]: ",
    "Loading weights took 1.0 seconds\n",
    "INFO:     Application startup complete.\n",
    "RuntimeError: Engine core initialization failed. See root cause above.\n",
    "\r",
    "\x00",
    "\x1b[31m",
    "NCCL error: unhandled system error\n",
    "[shutdown] API server: shutdown triggered\n",
    "EngineDeadError\n",
]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(_PIECES), st.text(max_size=30)), max_size=60))
def test_random_log_shaped_text_never_crashes(parts: list[str]) -> None:
    a = analyze("".join(parts).encode("utf-8", "surrogatepass"))
    doc = a.to_json()
    _check_spec_shape(doc)
    if a.first_failure is not None:
        assert a.first_failure.line_no in {f.line_no for f in a.findings}


# -- CLI ------------------------------------------------------------------------------------------


def test_cli_json_exit_codes_and_shape(tmp_path: Path) -> None:
    bad = tmp_path / "bad.log"
    bad.write_bytes(FAIL_LOG)
    good = tmp_path / "good.log"
    good.write_bytes(b"INFO:     Application startup complete.\n")
    r = CliRunner().invoke(main, ["analyze", str(bad), "--json"])
    assert r.exit_code == 3, r.output
    doc = json.loads(r.output)
    _check_spec_shape(doc)
    assert list(doc) == SPEC_KEYS  # exactly the SPEC's top-level keys
    assert doc["first_failure"]["line_no"] == 7 and doc["source"] == str(bad)
    entry = next(f for f in doc["findings"] if f["line_no"] == 7)
    assert entry["first_failure"] is True and entry["next_steps"] and entry["context"]["before"]
    r = CliRunner().invoke(main, ["analyze", str(good), "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["first_failure"] is None


def test_cli_human_and_markdown_forms(tmp_path: Path) -> None:
    bad = tmp_path / "bad.log"
    bad.write_bytes(FAIL_LOG)
    r = CliRunner().invoke(main, ["analyze", str(bad), "--context", "1"])
    assert r.exit_code == 3
    assert "First causal failure: line 7" in r.output and "Next steps:" in r.output
    assert "weights_access" in r.output and "Consequences" in r.output
    r = CliRunner().invoke(main, ["analyze", str(bad), "--markdown"])
    assert r.exit_code == 3 and r.output.startswith("# Analysis of") and "```text" in r.output


def test_cli_usage_and_unreadable_input(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["analyze", "x", "--json", "--markdown"])
    assert r.exit_code == 2
    r = CliRunner().invoke(main, ["analyze", str(tmp_path / "missing.log")])
    assert r.exit_code == 4 and "Traceback" not in r.output


def test_cli_reads_stdin_in_a_real_subprocess() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kk3evidence", "analyze", "-", "--json"],
        input=FAIL_LOG,
        capture_output=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert proc.returncode == 3, proc.stderr
    assert json.loads(proc.stdout)["first_failure"]["rule"] == "KV001"


def test_rules_list_and_show() -> None:
    r = CliRunner().invoke(main, ["rules", "list"])
    assert r.exit_code == 0 and "MS031" in r.output
    r = CliRunner().invoke(main, ["rules", "list", "--json", "--kind", "noise"])
    assert r.exit_code == 0 and {x["kind"] for x in json.loads(r.output)} == {"noise"}
    r = CliRunner().invoke(main, ["rules", "show", "KV001"])
    assert r.exit_code == 0 and "Next steps" in r.output and "Matches:" in r.output
    r = CliRunner().invoke(main, ["rules", "show", "NOPE999"])
    assert r.exit_code == 2


# -- real vLLM 0.32 CPU runs (tests/data/realruns) -----------------------------------------------

# scenario -> (first failure line, category) or None for a clean run
REAL_EXPECTED: dict[str, tuple[int, str] | None] = {
    "ok_baseline": None,
    "ok_cold_start": None,
    "ok_prefix_caching": None,
    "ok_request_too_long": None,
    "fail_weights_missing": (96, "weights"),
    "fail_corrupt_safetensors": (102, "weights"),
    "fail_kv_cache_too_small": (74, "kv_cache"),
    "fail_kvcache_space_exceeds_ram": (57, "kv_cache"),
    "fail_port_in_use": (38, "port"),
    "fail_cli_no_vllm_dist_metadata": (25, "other"),
    "fail_config_invalid_json": (26, "config"),
}


@pytest.mark.parametrize("scenario", sorted(REAL_EXPECTED))
def test_real_vllm_run(realruns: Path, scenario: str) -> None:
    a = analyze(realruns / scenario / "output.log")
    _check_spec_shape(a.to_json())
    want = REAL_EXPECTED[scenario]
    if want is None:
        assert a.first_failure is None, a.first_failure
        assert a.last_stage_reached == "serving"
        assert all(s.status == "completed" for s in a.stages)
    else:
        assert a.first_failure is not None
        assert (a.first_failure.line_no, a.first_failure.category) == want


def test_real_runs_never_report_a_consequence_rule_as_first(realruns: Path) -> None:
    for log in sorted(realruns.glob("*/output.log")):
        a = analyze(log)
        if a.first_failure is not None:
            kinds = {f.line_no: f.kind for f in a.findings}
            assert kinds[a.first_failure.line_no] == "failure", log.parent.name


# -- the fast path agrees with itself -------------------------------------------------------------


def _engines() -> list[str]:
    out = ["ahocorasick"]
    for mod, name in (("re2", "re2"), ("hyperscan", "hyperscan")):
        try:
            __import__(mod)
        except ImportError:
            continue
        out.append(name)
    return out


def _mixed_log() -> bytes:
    corpus = Path(__file__).resolve().parents[2] / "corpus"
    logs = sorted(corpus.glob("*/output.log"))
    if not logs:
        pytest.skip("corpus/ not present")
    return b"".join(p.read_bytes().rstrip(b"\n") + b"\n" for p in logs[::3]) * 2


@pytest.mark.parametrize("engine", _engines())
def test_every_prefilter_engine_and_block_size_gives_the_same_analysis(
    engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _mixed_log()
    ref = analyze(io.BytesIO(data), engine="ahocorasick").to_json()
    got = analyze(io.BytesIO(data), engine=engine).to_json()
    assert got == ref
    import kk3evidence.analysis.engine as mod

    monkeypatch.setattr(mod, "BLOCK_SIZE", 4096)
    small = analyze(io.BytesIO(data), engine=engine).to_json()
    assert small == ref


def test_named_pipe_is_streamed_without_losing_its_first_bytes(tmp_path: Path) -> None:
    src = tmp_path / "server.log"
    src.write_bytes(FAIL_LOG)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", f"cat '{src}' > '{fifo}'"])
    try:
        a = analyze(fifo)
    finally:
        writer.wait(timeout=30)
    assert a.lines_total == 8
    assert a.first_failure is not None and a.first_failure.line_no == 7


def test_kept_finding_text_is_bounded_for_huge_lines() -> None:
    big = b"RuntimeError: Cannot find any model weights with `/m` " + b"y" * 200_000 + b"\n"
    a = analyze(big * 3)
    assert a.first_failure is not None
    assert len(a.first_failure.text) < 9000 and "more characters]" in a.first_failure.text


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(min_value=1, max_value=5000), min_size=1, max_size=30))
def test_random_chunking_of_real_logs_never_changes_the_analysis(sizes: list[int]) -> None:
    data = _MIXED
    ref = _MIXED_REF
    eng = AnalysisEngine("<bytes>")
    pos = 0
    i = 0
    while pos < len(data):
        step = sizes[i % len(sizes)]
        eng.feed(data[pos : pos + step])
        pos += step
        i += 1
    assert eng.finish().to_json() == ref


def _mixed_or_empty() -> bytes:
    corpus = Path(__file__).resolve().parents[2] / "corpus"
    logs = sorted(corpus.glob("*/output.log"))[::7]
    return b"".join(p.read_bytes().rstrip(b"\n") + b"\n" for p in logs)


_MIXED = _mixed_or_empty()
_MIXED_REF = analyze(_MIXED, label="<bytes>").to_json()


def test_cli_extra_rules_are_added_to_the_shipped_ones(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(b"INFO:     Application startup complete.\nWARNING frobnicator jammed at 3\n")
    rules = tmp_path / "mine.toml"
    rules.write_text(
        'schema = "kk3evidence/rules/v1"\n[[rule]]\nid = "MINE001"\nname = "frobnicator-jammed"\n'
        'kind = "failure"\nstage = "serving"\ncategory = "other"\nseverity = "error"\n'
        'status = "experimental"\nsummary = "The frobnicator jammed."\n'
        'anchors = ["frobnicator jammed"]\n'
        'pattern = "frobnicator jammed at {int:slot}"\nmatch = ["frobnicator jammed at 3"]\n',
        encoding="utf-8",
    )
    r = CliRunner().invoke(main, ["analyze", str(log), "--json", "--rules", str(rules)])
    assert r.exit_code == 3, r.output
    doc = json.loads(r.output)
    assert doc["first_failure"]["rule"] == "MINE001"
    entry = next(f for f in doc["findings"] if f["rule"] == "MINE001")
    assert entry["captures"] == {"slot": "3"}
    r = CliRunner().invoke(main, ["analyze", str(log), "--rules", str(tmp_path / "nope.toml")])
    assert r.exit_code == 4 and "nope.toml" in r.output
