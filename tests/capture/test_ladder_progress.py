"""The ladder reports its progress through LadderEvents; its stage markers are the analysis
milestone rules (rules/milestones.toml), and the display itself lives in cli/_ladder.py."""

from __future__ import annotations

import ast
import io
from pathlib import Path

from kk3evidence.analysis.progress import MilestoneWatcher
from kk3evidence.capture.ladder import run as ladder
from kk3evidence.capture.ladder.run import NoProgress, _Tee
from kk3evidence.cli._ladder import Progress

REPO = Path(__file__).resolve().parents[2]
# a real start-up of vLLM 0.32.0 (CPU build) and one request; provenance in its README.md
BASELINE = REPO / "tests" / "data" / "realruns" / "ok_baseline" / "output.log"


class _Recorder(NoProgress):
    def __init__(self) -> None:
        self.stages: list[str] = []
        self.output: list[bytes] = []

    def set_stage(self, stage: str) -> None:
        if not self.stages or self.stages[-1] != stage:
            self.stages.append(stage)

    def server_output(self, data: bytes) -> None:
        self.output.append(data)


def _watcher_stages(data: bytes, size: int) -> list[str]:
    """The stages the milestone rules give for ``data`` fed in pieces of ``size`` bytes."""
    watcher = MilestoneWatcher()
    stages: list[str] = []
    for i in range(0, len(data), size):
        for m in watcher.feed(data[i : i + size], 0.0):
            if m.marks != "shutdown" and (not stages or stages[-1] != m.stage):
                stages.append(m.stage)
    return stages


def test_tee_reports_the_stages_of_the_milestone_rules() -> None:
    data = BASELINE.read_bytes()
    events = _Recorder()
    console = io.BytesIO()
    tee = _Tee(console, events, events.server_output)
    for i in range(0, len(data), 4096):  # in pipe-sized pieces, cut anywhere
        tee(data[i : i + 4096])
    assert console.getvalue() == data
    assert b"".join(events.output) == data
    assert events.stages == _watcher_stages(data, 4096)
    assert "weights_access" in events.stages
    assert events.stages.index("weights_access") < events.stages.index("api_ready")


def test_ladder_keeps_no_marker_table_of_its_own() -> None:
    assert not hasattr(ladder, "_STAGE_MARKERS")


def test_ladder_package_never_prints() -> None:
    """Only cli/ prints: no print() and no sys.stdout/sys.stderr under capture/ladder."""
    for path in (REPO / "kk3evidence" / "capture" / "ladder").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id != "print", f"{path.name}:{node.lineno}"
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                assert (node.value.id, node.attr) not in {("sys", "stdout"), ("sys", "stderr")}, (
                    f"{path.name}:{node.lineno}"
                )


def test_cli_progress_writes_one_line_per_event_off_a_terminal() -> None:
    stream = io.StringIO()
    shown = Progress(stream)
    shown.begin("step 1/3 prefix-caching")
    shown.set_stage("weights_access")
    shown.set_stage("weights_access")  # unchanged: no new line
    shown.say("step 1/3 prefix-caching: ready")
    shown.end()
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("kk3evidence ladder: step 1/3 prefix-caching · starting · ")
    assert lines[1].startswith("kk3evidence ladder: step 1/3 prefix-caching · weights_access · ")
    assert lines[2] == "kk3evidence ladder: step 1/3 prefix-caching: ready"
    assert len(lines) == 3


def test_cli_progress_disabled_shows_nothing() -> None:
    stream = io.StringIO()
    quiet = Progress(stream, enabled=False)
    quiet.begin("step 0/1 baseline")
    quiet.set_stage("api_ready")
    quiet.say("hello")
    quiet.end()
    assert stream.getvalue() == ""
