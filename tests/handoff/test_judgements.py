"""Judgements the evidence supports (issue 10), on real vLLM 0.32 CPU logs.

``ok_baseline`` (no prefix flag) and ``ok_prefix_caching`` (``--enable-prefix-caching``) are
real captures (tests/data/realruns, see its README): vLLM's V1 engine reports
``enable_prefix_caching=True`` in both, so adding the flag changed nothing.
"""

from __future__ import annotations

import copy
import shlex
from pathlib import Path

from _handoff_fixtures import BASE_ARGV, CPU_FINGERPRINT, fixed_request, launch

from kk3evidence.analysis.engine import analyze
from kk3evidence.handoff.diff import diff
from kk3evidence.handoff.evidence import Evidence, from_dicts
from kk3evidence.handoff.records import Fingerprint, Launch, Notes, Request
from kk3evidence.handoff.report.markdown import evaluate_checklist, render_report

REAL = Path(__file__).resolve().parents[1] / "data" / "realruns"


def real_run(case: str, name: str | None = None) -> Evidence:
    argv = shlex.split((REAL / case / "command.txt").read_text().strip())
    log = (REAL / case / "output.log").read_text(errors="replace").splitlines()
    analysis = analyze(REAL / case / "output.log").to_json()
    return from_dicts(name or case, fingerprint=copy.deepcopy(CPU_FINGERPRINT),
                      launch=launch(argv), analysis=analysis, requests=[fixed_request()],
                      log_lines=log)


def test_adding_the_default_prefix_flag_is_not_a_change() -> None:
    result = diff(real_run("ok_baseline"), real_run("ok_prefix_caching"))
    assert "--enable-prefix-caching" not in [c.label for c in result.variables]
    assert any("enable_prefix_caching=True in both runs" in e for e in result.equivalences)
    assert result.verdict == "none"


def test_report_says_prefix_caching_is_on_by_default() -> None:
    ev = real_run("ok_baseline")
    items = {i.key: i for i in evaluate_checklist(ev)}
    item = items["prefix_caching"]
    assert item.status == "unknown"
    assert "on by default" in item.why and "line 17" in item.why
    assert "not enabled" not in render_report(ev)


def test_served_model_name_is_not_a_feature_flag() -> None:
    ev = real_run("ok_baseline")
    assert "--served-model-name" in ev.argv
    items = {i.key: i for i in evaluate_checklist(ev)}
    assert items["minimal_command"].status == "pass", items["minimal_command"].why


def test_records_keep_unknown_as_none_for_a_0_1_bundle() -> None:
    # 0.1 bundles and partial members: nothing becomes 0, False or ""
    fp = Fingerprint.from_json({"host": {"hostname": "h"}, "gpus": {"devices": "bad"}})
    assert fp.host.cpu_count is None and fp.gpus.count is None and fp.gpus.devices == ()
    assert fp.python.cuda_device_count is None and not fp.python.cpu_build
    lau = Launch.from_json({"argv": ["vllm", "serve", "m"], "exit_code": True})
    assert lau.exit_code is None and lau.argv == ("vllm", "serve", "m")
    assert lau.ready_seconds is None and lau.api_port is None
    notes = Notes.from_json({"notes": ["x"], "cluster": {"text": "shared node"}})
    assert notes.texts == ("x", "shared node") and notes.changes == ()
    assert Notes.from_json(None).cluster is None
    req = Request.from_json({"name": "fixed-1", "kind": "fixed", "status": None,
                             "request_body": {"max_tokens": 8}})
    assert req.status is None and req.body["max_tokens"] == 8 and req.cached_tokens is None
    assert Launch.from_json(BASE_ARGV) == Launch()  # not a mapping: empty, not a crash


CAPTURES = Path(__file__).resolve().parents[1] / "data" / "realcaptures"


def test_real_stale_server_capture_reads_as_a_port_held_by_another_server() -> None:
    from kk3evidence.handoff.evidence import load

    ev = load(CAPTURES / "stale_server_port_held.tar")
    assert ev.launch.port_holder is not None
    assert "--served-model-name old" in ev.launch.port_holder
    assert ev.requests == ()
    assert ev.first_failure is not None and ev.first_failure["category"] == "port"
    md = render_report(ev)
    assert "Before launch, port" in md and "No request was sent to that server" in md


def _probe_request(name: str) -> dict[str, object]:
    req = fixed_request()
    return {**req, "name": name, "kind": "prefix_probe"}


def test_prefix_probe_requests_are_not_a_changed_variable() -> None:
    a = real_run("ok_baseline", "a")
    b = real_run("ok_baseline", "b")
    b = from_dicts("b", fingerprint=b.fingerprint, launch=b.launch, notes=b.notes,
                   analysis=b.analysis, requests=[*b.requests, _probe_request("prefix-1"),
                                                  _probe_request("prefix-2")])
    assert diff(a, b).verdict == "none"


def test_request_steps_on_a_reused_server_are_not_counted_in_the_next_step() -> None:
    # ladder step 0's bundle ran step 1 (a request-only step) on the same server; step 2's
    # bundle starts from step 1's request: that request difference is step 1's variable
    notes = {"notes": ["kk3evidence ladder step 0/2: baseline", "shared with ladder step 1 "
                       "(input_tokens)"], "changes": [], "cluster": None}
    a = real_run("ok_baseline", "a")
    a = from_dicts("a", fingerprint=a.fingerprint, launch=a.launch, notes=notes,
                   analysis=a.analysis, requests=a.requests)
    b0 = real_run("ok_prefix_caching", "b")
    longer = {**fixed_request(), "request_body": {**fixed_request()["request_body"],
                                                  "messages": [{"role": "user",
                                                                "content": "w " * 300}]}}
    b = from_dicts("b", fingerprint=b0.fingerprint, launch=b0.launch, notes=b0.notes,
                   analysis=b0.analysis, requests=[longer])
    result = diff(a, b)
    assert [c.label for c in result.variables] == []
    assert any(c.explained_by and "ladder request step(s) 1 (input_tokens)" in c.explained_by
               for c in result.changes)


def test_the_prefix_probe_checks_judge_the_prefix_item() -> None:
    from dataclasses import replace

    from kk3evidence.handoff.records import PrefixProbe

    ev = real_run("ok_prefix_caching")
    probe = PrefixProbe.from_json({"prefix_caching_enabled": True, "checks": [
        {"id": "second_request_hits_cache", "status": "pass", "evidence": "hits grew by 256"},
        {"id": "inputs_identical", "status": "pass"},
        {"id": "no_memory_error_after_enable", "status": "pass"},
        {"id": "request_ok_with_cache", "status": "pass"}]})
    items = {i.key: i for i in evaluate_checklist(replace(ev, prefix_probe=probe))}
    assert items["prefix_caching"].status == "pass"
    assert "4 prefix checks" in items["prefix_caching"].why


def test_compare_groups_runs_by_effective_prefix_caching() -> None:
    from kk3evidence.handoff.compare import compare

    # --enable-prefix-caching on a V1 engine that had it on anyway: the same configuration
    result = compare([real_run("ok_baseline", "a.tar"), real_run("ok_prefix_caching", "b.tar")])
    assert len(set(result.runs["config"].to_list())) == 1
