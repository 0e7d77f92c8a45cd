"""``preflight`` on the command of every real start-up, with its scenario rebuilt in tmp_path.

Every failing start-up must be predicted by the check that corresponds to its real error, and no
clean start may get a ``fail``. Runs against the installed vLLM CPU build (no server is started).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from e2e.preflight_scenarios import EXPECTED, build

from kk3evidence.capture.preflight_host import run_preflight

GiB = 1 << 30
pytestmark = pytest.mark.vllm  # reads the installed vLLM CPU build; starts no server


def _host_cannot_reproduce(name: str, result_facts: dict[str, object]) -> str | None:
    """Scenarios that depend on this host's size (free RAM, NUMA nodes), as the real ones did."""
    if name == "fail_kvcache_space_exceeds_ram":
        avail = result_facts.get("mem_available_bytes")
        if isinstance(avail, int) and avail > 64 * GiB:
            return "this host has more than 64 GiB free: VLLM_CPU_KVCACHE_SPACE=64 fits here"
    if name == "fail_bad_arg_tp4":
        nodes = result_facts.get("numa_nodes")
        if isinstance(nodes, tuple) and len(nodes) >= 4:
            return "this host has 4 or more NUMA nodes: tensor parallel 4 fits here"
    return None


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preflight_predicts_the_real_outcome(name: str, vllm_cpu: Any, vllm_tools: SimpleNamespace,
                                             tmp_path: Path) -> None:
    from kk3evidence.capture import preflight_host

    with build(name, vllm_bin=vllm_cpu.vllm, model=vllm_cpu.model, tmp=tmp_path,
               port=vllm_tools.free_port()) as sc:
        facts = preflight_host.collect_facts(sc.argv, env=sc.env)
        why = _host_cannot_reproduce(name, {"mem_available_bytes": facts.mem_available_bytes,
                                            "numa_nodes": facts.numa_nodes})
        if why:
            pytest.skip(why)
        result = run_preflight(sc.argv, env=sc.env)
    failed = {c.id: c.summary for c in result.failed}
    if sc.expected_fail is None:
        assert failed == {}, f"false alarm on a clean start: {failed}"
        assert result.exit_code == 0
    else:
        assert sc.expected_fail in failed, f"{name} not predicted; failed: {failed}"
        assert result.exit_code == 6
    # unknown stays unknown: no NVML on a CPU host, so the GPU checks cannot pass
    gpu_jobs = next(c for c in result.checks if c.id == "host.gpu-jobs")
    if facts.gpus.source != "nvml":
        assert gpu_jobs.status == "unknown"


@pytest.mark.slow
def test_capture_preflight_predicts_what_the_real_start_then_does(capture_real: Any) -> None:
    """One real start (context too long: vLLM exits in seconds): the prediction stored in
    preflight.json and the real failure analysed from the log land in the same bundle."""
    from kk3evidence.bundle.archive import open_bundle

    ran = capture_real("ctx", "--max-model-len", "1000000", capture_opts=("--preflight",))
    assert ran.returncode != 0
    with open_bundle(ran.bundle) as b:
        pre, analysis = b.preflight, b.analysis
        log = b"".join(b.iter_log_lines())
    assert pre is not None and analysis is not None
    failed = {c["id"] for c in pre["checks"] if c["status"] == "fail"}
    assert failed == {"memory.context-length"}
    assert pre["seconds"] < 2
    assert analysis["first_failure"]["category"] == "config"
    assert b"User-specified max_model_len (1000000) is greater than" in log
