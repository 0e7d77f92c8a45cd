"""diff / check / report / compare on bundles captured from real vLLM CPU runs.

Six real captures (each a real ``vllm serve`` start, ~30-120 s on 2 cores), made once per
session through the real ``kk3evidence capture --stop-after-request`` and shared by every test:

* ``A``  baseline: the RECIPE's tiny-model command
* ``A2`` the same configuration again (different pid, port, timestamps)
* ``B``  one flag changed: ``--max-num-seqs 8``
* ``C``  two flags changed: ``--max-num-seqs 8 --seed 7``, plus ``--enable-prefix-caching``,
  which the V1 engine had on anyway (both logs say ``enable_prefix_caching=True``): not a change
* ``F``, ``F2`` one flag changed so that the start fails: ``--max-model-len 1000000``

Each start holds a vLLM slot (``tests/vllm_slots.py``). Under pytest-xdist the captures are
shared by the workers too: each is made once, under a file lock, in the session's common
temporary folder.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import FAST_START, VllmCpu, free_port, vllm_lock

pytestmark = [pytest.mark.vllm, pytest.mark.slow]



def _kk3(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kk3evidence", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="session")
def vllm_paths(vllm_cpu: VllmCpu) -> tuple[Path, Path]:
    return vllm_cpu.vllm, vllm_cpu.model


@pytest.fixture(scope="session")
def captured(tmp_path_factory: pytest.TempPathFactory,
             vllm_paths: tuple[Path, Path]) -> Callable[[str], Path]:
    """Capture a named run on first use; later uses (any worker's) get the same bundle."""
    vllm, model = vllm_paths
    base = tmp_path_factory.getbasetemp()
    # xdist: each worker's base folder is popen-gwN inside the session's own folder
    out_dir = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "real-captures"
    out_dir.mkdir(exist_ok=True)
    extra = {
        "A": [],
        "A2": [],
        "B": ["--max-num-seqs", "8"],
        "C": ["--max-num-seqs", "8", "--seed", "7", "--enable-prefix-caching"],
        # fails in config validation within seconds (max_position_embeddings is 2048)
        "F": ["--max-model-len", "1000000"],
        "F2": ["--max-model-len", "1000000"],
    }
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name in made:
            return made[name]
        out = out_dir / f"{name}.tar"
        with (out_dir / f"{name}.lock").open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)  # another worker may be capturing it now
            if not out.exists():
                _capture(name, out)
        made[name] = out
        return out

    def _capture(name: str, out: Path) -> None:
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   VLLM_CPU_KVCACHE_SPACE="1", PYTHONUNBUFFERED="1")
        args = extra[name]
        max_len = [] if "--max-model-len" in args else ["--max-model-len", "512"]
        cmd = [str(vllm), "serve", str(model), "--served-model-name", "tiny",
               "--host", "127.0.0.1", "--port", str(free_port()), *max_len,
               "--dtype", "float32", *FAST_START, *args]
        with vllm_lock():
            proc = subprocess.run(
                [sys.executable, "-m", "kk3evidence", "capture", "-o",
                 str(out), "--stop-after-request", "--ready-timeout", "400", "--", *cmd],
                capture_output=True, text=True, env=env, timeout=900,
            )
        assert out.exists(), f"capture of {name} wrote no bundle: {proc.stderr[-3000:]}"

    return get


def test_same_configuration_twice_changes_no_variable(captured: Callable[[str], Path]) -> None:
    proc = _kk3("diff", "--json", str(captured("A")), str(captured("A2")))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["verdict"] == "none", doc["changes"]
    ignored = {i["what"] for i in doc["ignored"]}
    assert "--port" in ignored and "launch pid" in ignored


def test_one_flag_changed_names_it_and_exits_0(captured: Callable[[str], Path]) -> None:
    proc = _kk3("diff", str(captured("A")), str(captured("B")))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Verdict: exactly one variable changed: --max-num-seqs" in proc.stdout


def test_two_flags_changed_exit_5_naming_both(captured: Callable[[str], Path]) -> None:
    proc = _kk3("diff", "--json", str(captured("A")), str(captured("C")))
    assert proc.returncode == 5, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert sorted(doc["variables"]) == ["--max-num-seqs", "--seed"]
    # vLLM 0.32's V1 engine enables prefix caching by default: the flag changed nothing
    assert any("enable_prefix_caching=True in both runs" in e for e in doc["equivalences"])


def test_check_on_a_real_cpu_capture_names_the_cpu_build(
        captured: Callable[[str], Path]) -> None:
    # torch ...+cpu and no NVML prove the run is outside every CUDA boundary (issue 10)
    proc = _kk3("check", "--json", str(captured("A")))
    assert proc.returncode == 6, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["cpu_build"] is True
    assert "unknown" not in {r["status"] for r in doc["results"]}
    human = _kk3("check", str(captured("A")))
    assert "CPU build:" in human.stdout and "????" not in human.stdout
    k3 = _kk3("check", str(captured("A")), "--recipe", "kimi-k3")
    # a CPU venv run is no Kimi-K3 deployment: the flag rule fails, and so do the CUDA rules
    # (CPU build) and the version rule (0.32.0+cpu)
    assert k3.returncode == 6
    assert "K3-005" in k3.stdout and "--trust-remote-code is missing" in k3.stdout
    assert "is a CPU build" in k3.stdout  # K3-003: vLLM 0.32.0+cpu


def test_report_against_baseline_on_real_captures(captured: Callable[[str], Path],
                                                  tmp_path: Path) -> None:
    proc = _kk3("report", str(captured("B")), "--baseline", str(captured("A")))
    assert proc.returncode == 0, proc.stderr
    md = proc.stdout
    assert "exactly one variable changed: `--max-num-seqs`" in md
    assert "HTTP 200" in md
    assert "0.32.0" in md  # the real vLLM version from the fingerprint
    html_out = tmp_path / "r.html"
    proc = _kk3("report", str(captured("C")), "--baseline", str(captured("A")), "--format",
                "html", "-o", str(html_out))
    assert proc.returncode == 0, proc.stderr
    page = html_out.read_text(encoding="utf-8")
    assert "<svg" in page and "2 variables changed" in page


def test_compare_groups_the_repeated_configuration(captured: Callable[[str], Path]) -> None:
    proc = _kk3("compare", "--json", str(captured("A")), str(captured("A2")),
                str(captured("B")))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    configs = [r["config"] for r in doc["runs"]]
    assert configs[0] == configs[1] != configs[2]
    repeated = next(g for g in doc["groups"] if len(g["runs"]) == 2)
    assert repeated["stability"] == "stable"
    assert repeated["signatures"] == {"ok": 2}
    assert doc["decision"]["action"] == "keep_fixing_here"


def test_failing_run_one_flag_away_from_baseline(captured: Callable[[str], Path]) -> None:
    proc = _kk3("diff", "--json", str(captured("A")), str(captured("F")))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["variables"] == ["--max-model-len"]
    outcome = {c["variable"]: c for c in doc["outcome"]}
    assert outcome["outcome:first_failure"]["a"] is None
    assert outcome["outcome:first_failure"]["b"].endswith("/config")


def test_report_of_a_real_failure_marks_the_first_causal_line(
        captured: Callable[[str], Path]) -> None:
    proc = _kk3("report", str(captured("F")), "--baseline", str(captured("A")))
    assert proc.returncode == 0, proc.stderr
    md = proc.stdout
    assert "category **config**" in md
    marked = [ln for ln in md.splitlines() if ln.startswith(">>")]
    assert len(marked) == 1 and "ValidationError" in marked[0]
    assert "exactly one variable changed: `--max-model-len`" in md
    assert "No request was sent" in md
    ko = _kk3("report", str(captured("F")), "--lang", "ko", "--format", "github")
    assert ko.returncode == 0 and "### 🐛 Describe the bug" in ko.stdout
    assert "서버는" in ko.stdout


def test_compare_sees_a_stable_real_failure(captured: Callable[[str], Path]) -> None:
    proc = _kk3("compare", "--json", str(captured("F")), str(captured("F2")))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    (group,) = doc["groups"]
    assert group["stability"] == "stable"
    (sig,) = group["signatures"]
    assert sig.split("/")[1] == "config"
    assert doc["decision"]["action"] == "keep_fixing_here"
    reasons = doc["decision"]["reasons"]
    # a CPU build is outside the official boundaries (issue 10): said first, with the repeats
    assert "outside the official compatibility boundaries" in reasons[0]
    assert any("repeats at the same stage" in r for r in reasons)
    assert any("GPU occupancy unknown" in r for r in reasons)  # no NVML on this machine
