"""classify_line and the classifier's precedence with the shipped rules."""

from __future__ import annotations

from kk3evidence.analysis.classify import Classifier, classify_line
from kk3evidence.analysis.grammar import parse_line


def test_failure_line_is_classified_with_stage_category_and_process() -> None:
    f = classify_line(
        "(EngineCore pid=28020) ERROR 11-30 01:56:15 [core.py:1510] ValueError: To serve at least "
        "one request with the model's max seq len (2048), (0.0 GiB KV cache is needed, which is "
        "larger than the available KV cache memory (0.0 GiB). Based on the available memory"
    )
    assert f is not None
    assert (f.kind, f.category, f.stage) == ("failure", "kv_cache", "engine_init")
    assert f.process == "EngineCore pid=28020"


def test_milestone_line_is_a_milestone_finding() -> None:
    f = classify_line(
        "(Worker pid=1) INFO 11-30 01:48:03 [default_loader.py:501] "
        "Loading weights took 0.01 seconds"
    )
    assert f is not None and (f.kind, f.stage) == ("milestone", "weights_access")


def test_noise_beats_failure_anchor_in_the_same_line() -> None:
    # The ulimit warning quotes "Too many open files" but is not a failure.
    line = (
        "(APIServer pid=1) WARNING 11-30 01:47:53 [system_utils.py:255] Found ulimit of 20000 and "
        "failed to automatically increase with error current limit exceeds maximum limit. This "
        "can cause fd limit errors like `OSError: [Errno 24] Too many open files`."
    )
    assert classify_line(line) is None
    hit = Classifier().classify(parse_line(1, line))
    assert hit is not None and hit.rule.kind == "noise"


def test_plain_info_lines_and_garbage_are_unclassified() -> None:
    info = "(APIServer pid=1) INFO 11-30 01:48:12 [entry.py:136] Supported tasks: ['generate']"
    assert classify_line(info) is None
    assert classify_line(b"\xff\xfe\x00garbage") is None
    assert classify_line("") is None


def test_unknown_exception_line_falls_back_to_the_traceback_or_bare_line_rule() -> None:
    text = "RuntimeError: a brand new failure that no rule describes yet"
    bare = classify_line(text)
    assert bare is not None and bare.rule == "EXC003" and bare.category == "other"
    f = classify_line(text, exception_line=True)
    assert f is not None and f.rule == "EXC001" and f.category == "other"
    assert classify_line("WARNING 01-01 00:00:00 [x.py:1] " + text) is None


def test_clean_shutdown_noise_needs_the_shutdown_context() -> None:
    text = (
        "(APIServer pid=1) ERROR 11-30 01:48:24 [async_llm.py:906] "
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue."
    )
    c = Classifier()
    after = c.classify(parse_line(1, text), shutdown_requested=True)
    assert after is not None and after.rule.kind == "noise"
