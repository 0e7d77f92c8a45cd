"""report: the hand-off document in Markdown, GitHub bug-report shape and self-contained HTML."""

from __future__ import annotations

import copy
import os
import re
import shutil
import string
import subprocess
from pathlib import Path

import pytest
from _handoff_fixtures import BASE_ARGV, gpu_fingerprint, run, write
from click.testing import CliRunner

from kk3evidence.cli import main
from kk3evidence.handoff.diff import diff
from kk3evidence.handoff.report import i18n as _i18n
from kk3evidence.handoff.report.markdown import evaluate_checklist, render_report

IN_CI = os.environ.get("CI") == "true"
K3 = ["vllm", "serve", "moonshotai/Kimi-K3", "--tensor-parallel-size", "8",
      "--trust-remote-code", "--gpu-memory-utilization", "0.95"]


def test_markdown_has_every_hand_off_section(tmp_path: Path) -> None:
    base = write(run("base"), tmp_path / "base.tar")
    failed = write(run("fail", argv=[*BASE_ARGV, "--enable-prefix-caching"], failed=True),
                   tmp_path / "fail.tar", with_analysis=False)
    result = CliRunner().invoke(main, ["report", str(failed), "--baseline", str(base)])
    assert result.exit_code == 0, result.output
    md = result.output
    for heading in ("## Summary", "## Environment fingerprint", "## Minimal start command",
                    "## Fixed request and response", "## First failing stage",
                    "## Stage timeline", "## Single-variable result against the baseline",
                    "## Official compatibility boundaries", "## Hand-off checklist",
                    "## Reproducibility limits"):
        assert heading in md
    # the first causal line, found by the real analyzer, is marked among its neighbours
    assert re.search(r">>\s+5\s+\(Worker pid=15700\) ERROR .*Cannot find any model weights", md)
    assert "exactly one variable changed: `--enable-prefix-caching`" in md
    assert "Minimal command (only what starting the engine needs)" in md
    # the flag --baseline names as this round's variable stays in the minimal command, so the
    # hand-off still reproduces the failure (issue 10)
    assert "`--enable-prefix-caching` (feature)" not in md
    minimal = md.split("Minimal command (only what starting the engine needs)")[1]
    assert "--enable-prefix-caching" in minimal.split("```")[1]
    assert md.count("| [") == 11  # the 11 checklist rows


def test_checklist_items_are_judged_from_evidence() -> None:
    base = run("base")
    ev = run("pc", argv=[*BASE_ARGV, "--enable-prefix-caching"])
    items = {i.key: i for i in evaluate_checklist(ev, diff(base, ev), base)}
    assert len(items) == 11
    assert items["one_variable"].status == "pass"
    assert items["prefix_caching"].status == "pass"
    # a round that changed a variable is not evidence that anyone went back (issue 10)
    assert items["reverted_baseline"].status == "unknown"
    assert items["repro_limits"].status == "pass"
    assert items["fixed_request"].status == "pass"
    # the round's own restored flag is not held against it (issue 10)
    assert items["minimal_command"].status == "pass"
    again = {i.key: i for i in evaluate_checklist(run("again"), diff(base, run("again")), base)}
    assert again["reverted_baseline"].status == "pass"  # the baseline's configuration again
    assert items["image_id"].status == "unknown"  # a CPU venv run has no container
    alone = {i.key: i for i in evaluate_checklist(ev)}
    assert alone["one_variable"].status == "unknown"
    assert alone["prefix_caching"].status == "fail"
    assert alone["minimal_command"].status == "fail"  # without a baseline it is an extra


def test_checklist_on_a_gpu_cluster_fingerprint() -> None:
    fp = gpu_fingerprint(other_jobs=2)
    fp["container"]["image_id"] = None
    ev = run("k3", argv=K3, fingerprint=fp)
    items = {i.key: i for i in evaluate_checklist(ev)}
    assert items["driver_cuda_same_time"].status == "pass"
    assert "580.82.07" in items["driver_cuda_same_time"].why
    assert items["image_id"].status == "fail"
    assert items["cluster_state"].status == "pass"
    assert "2 process(es) of other jobs" in items["cluster_state"].why


def test_prefix_caching_evidence_from_metrics() -> None:
    from kk3evidence.handoff.evidence import from_dicts

    ev0 = run("pc", argv=[*BASE_ARGV, "--enable-prefix-caching"])
    ev = from_dicts("pc", fingerprint=ev0.fingerprint, launch=ev0.launch, notes=ev0.notes,
                    analysis=ev0.analysis, requests=ev0.requests, metrics={"after": (
                        'vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 724.0\n'
                        'vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 256.0\n')})
    items = {i.key: i for i in evaluate_checklist(ev)}
    assert items["prefix_caching"].status == "pass"
    assert "256 hits of 724" in items["prefix_caching"].why


def test_notes_changes_drive_one_variable_without_baseline() -> None:
    notes = {"schema": "kk3evidence/notes/v1", "notes": ["reverted to baseline image"],
             "changes": [{"variable": "driver", "from": "575", "to": "580",
                          "at": "2026-11-30T00:00:00Z"}],
             "cluster": {"gpu_processes": [], "text": None}}
    items = {i.key: i for i in evaluate_checklist(run("n", notes=notes))}
    assert items["one_variable"].status == "pass"
    assert items["reverted_baseline"].status == "pass"


def test_github_format_follows_vllm_bug_template(tmp_path: Path) -> None:
    path = write(run("fail", failed=True), tmp_path / "fail.tar")
    md = render_report(path, fmt="github")
    assert md.index("### Your current environment") < md.index("### 🐛 Describe the bug")
    assert "<details>" in md and "</details>" in md
    assert "vLLM" in md and "0.32.0+cpu" in md  # collect_env-like block
    assert "```bash\nvllm serve /models/tinyllama" in md
    assert "### Before submitting a new issue..." in md
    assert not md.startswith("# ")  # the issue title is separate on GitHub


def test_korean_hand_off(tmp_path: Path) -> None:
    path = write(run("fail", failed=True), tmp_path / "fail.tar")
    md = render_report(path, lang="ko")
    assert "## 재현 인계 점검" in md
    assert "호스트 드라이버와 컨테이너 내부 CUDA 정보를 같은 시각에 저장했습니다." in md
    assert "## 재현성의 한계" in md
    # stage names are translated, the contract string kept beside them (issue 10)
    assert "서버는 **가중치 접근 (weights_access)** 단계에서 실패했습니다" in md
    assert "| 가중치 접근 (weights_access) | 실패 |" in md


def test_i18n_catalog_has_both_languages_with_same_fields() -> None:
    fmt = string.Formatter()
    for key in _i18n.catalog_keys():
        en, ko = _i18n._CATALOG[key]
        assert en and ko, key
        fields_en = {f for _, f, _, _ in fmt.parse(en) if f}
        fields_ko = {f for _, f, _, _ in fmt.parse(ko) if f}
        assert fields_en == fields_ko, key
    assert len(_i18n.CHECKLIST) == 11


def test_html_is_one_self_contained_file(tmp_path: Path) -> None:
    path = write(run("fail", failed=True), tmp_path / "fail.tar")
    out = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["report", str(path), "--format", "html", "-o", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert "<svg" in page and "weights_access" in page
    assert "Content-Security-Policy" in page
    # nothing loaded from anywhere
    assert not re.search(r"<(script|link|img|iframe)\b", page)
    assert not re.search(r"(src|href)=\"(https?:)?//", page)
    assert "url(" not in page


def test_unknown_format_is_a_usage_error(tmp_path: Path) -> None:
    path = write(run("a"), tmp_path / "a.tar")
    result = CliRunner().invoke(main, ["report", str(path), "--format", "pdf"])
    assert result.exit_code == 2


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


def test_html_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:
        if IN_CI:
            pytest.fail("CI=true but chromium is missing (apt-get install -y chromium)")
        pytest.skip("chromium not installed (apt-get install -y chromium)")
    fp = copy.deepcopy(gpu_fingerprint(other_jobs=1))
    base = run("base", argv=K3, fingerprint=fp)
    ev = run("fail", argv=[*K3, "--enable-prefix-caching"], fingerprint=fp, failed=True)
    page = tmp_path / "report.html"
    page.write_text(render_report(ev, baseline=base, fmt="html"), encoding="utf-8")
    shot = tmp_path / "shot.png"
    profile = tmp_path / "profile"
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", f"--user-data-dir={profile}", "--window-size=1280,2400",
         f"--screenshot={shot}", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert shot.exists(), proc.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000  # a rendered page, not a blank one


def test_unwritable_output_is_one_line_exit_4(tmp_path: Path) -> None:
    path = write(run("a"), tmp_path / "a.tar")
    target = tmp_path / "no-such-dir" / "r.md"
    result = CliRunner().invoke(main, ["report", str(path), "-o", str(target)])
    assert result.exit_code == 4
    assert "cannot write the report" in result.output
