"""Resource bounds at the command line (issue 16): `analyze -` on a stream that never ends
stops at --max-bytes and says so; report/diff/compare say what part of a log they analysed
and --full lifts the budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bundle_factory import write_bundle
from click.testing import CliRunner

from kk3evidence.analysis.budget import Budget
from kk3evidence.cli import main
from kk3evidence.handoff import evidence

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "corpus"

# An endless producer: a real failing start-up, then serving lines forever.
_PRODUCER = (
    "import sys\n"
    "out = sys.stdout.buffer\n"
    "out.write(open(sys.argv[1], 'rb').read())\n"
    "line = b'(APIServer pid=1) INFO 12-01 00:00:01 [loggers.py:1] Avg throughput: 0.0\\n'\n"
    "try:\n"
    "    while True:\n"
    "        out.write(line * 1000)\n"
    "except (BrokenPipeError, OSError):\n"
    "    sys.exit(0)\n"
)


def test_analyze_of_an_endless_stream_stops_at_max_bytes() -> None:
    failing = CORPUS / "realrun-fail-kv-cache-too-small" / "output.log"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    producer = subprocess.Popen(
        [sys.executable, "-c", _PRODUCER, str(failing)], stdout=subprocess.PIPE, env=env,
        stderr=subprocess.DEVNULL)
    assert producer.stdout is not None
    try:
        res = subprocess.run(
            [sys.executable, "-m", "kk3evidence", "analyze", "-", "--max-bytes", "2M", "--json"],
            stdin=producer.stdout, capture_output=True, env=env, check=False, timeout=300)
    finally:
        producer.stdout.close()
        producer.kill()
        producer.wait()
    # The analysis of what was read keeps its own exit status: a failure was found.
    assert res.returncode == 3, res.stderr.decode()[-800:]
    doc = json.loads(res.stdout)
    cov = doc["coverage"]
    assert cov["input_ended"] is False and cov["complete"] is False
    assert cov["bytes_analysed"] == cov["limit_bytes"] == 2 * 1024 * 1024
    assert doc["first_failure"]["category"] == "kv_cache"
    err = res.stderr.decode()
    assert "note:" in err and "--max-bytes 0" in err and "Traceback" not in err


def test_max_bytes_parses_sizes_and_refuses_nonsense(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(b"INFO hello\n" * 1000)
    runner = CliRunner()
    ok = runner.invoke(main, ["analyze", str(log), "--max-bytes", "1K", "--json"])
    assert json.loads(ok.stdout)["coverage"]["limit_bytes"] == 1024
    whole = runner.invoke(main, ["analyze", str(log), "--max-bytes", "0", "--json"])
    assert "coverage" not in json.loads(whole.stdout)
    bad = runner.invoke(main, ["analyze", str(log), "--max-bytes", "lots"])
    assert bad.exit_code == 2 and "not a size" in bad.output


@pytest.fixture
def big_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A bundle without analysis.json whose log is larger than a lowered consumer budget."""
    fail = (CORPUS / "realrun-fail-kv-cache-too-small" / "output.log").read_bytes()
    noise = b"(APIServer pid=1) INFO 12-01 00:00:01 [loggers.py:1] Avg throughput: 0.0\n"
    monkeypatch.setattr(evidence, "CONSUMER_BUDGET", Budget(len(fail) + 10, 4096, lift="--full"))
    return str(write_bundle(tmp_path / "big.tar.gz", log=fail + noise * 20_000))


def test_report_says_what_it_analysed_and_full_lifts_it(big_bundle: str) -> None:
    runner = CliRunner()
    res = runner.invoke(main, ["report", big_bundle])
    assert res.exit_code == 0, res.output[-500:]
    assert "Analysis coverage:" in res.stdout and "--full" in res.stdout
    assert "note:" in res.stderr
    full = runner.invoke(main, ["report", big_bundle, "--full"])
    assert full.exit_code == 0 and "Analysis coverage:" not in full.stdout
    assert "note:" not in full.stderr


def test_diff_and_compare_json_carry_the_coverage(big_bundle: str) -> None:
    runner = CliRunner()
    for args in (["diff", big_bundle, big_bundle, "--json"], ["check", big_bundle, "--json"],
                 ["compare", big_bundle, big_bundle, "--json"]):
        res = runner.invoke(main, args)
        assert res.exit_code in (0, 5, 6), (args, res.output[-500:])
        doc = json.loads(res.stdout)
        cov = doc["coverage"][big_bundle]
        assert cov["complete"] is False and cov["skipped_lines"][0] > 1
        assert "note:" in res.stderr
        res_full = runner.invoke(main, [*args, "--full"])
        assert "coverage" not in json.loads(res_full.stdout)


def test_max_bytes_on_a_bundle_stops_reading_its_log_cleanly(tmp_path: Path) -> None:
    log = b"INFO x\n" * 100_000 + b"RuntimeError: CUDA error: out of memory\n"
    bundle = write_bundle(tmp_path / "b.tar.gz", log=log)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run(
        [sys.executable, "-W", "error", "-m", "kk3evidence", "analyze", str(bundle),
         "--max-bytes", "10K", "--json"], capture_output=True, env=env, check=False)
    assert res.returncode == 0, res.stderr.decode()[-800:]  # the failure is past the cap
    assert json.loads(res.stdout)["coverage"]["bytes_analysed"] == 10 * 1024
    assert b"note:" in res.stderr and b"Traceback" not in res.stderr
    whole = subprocess.run(
        [sys.executable, "-m", "kk3evidence", "analyze", str(bundle), "--json"],
        capture_output=True, env=env, check=False)
    assert whole.returncode == 3 and "coverage" not in json.loads(whole.stdout)


def test_human_outputs_end_with_the_coverage(big_bundle: str) -> None:
    runner = CliRunner()
    for args in (["diff", big_bundle, big_bundle], ["compare", big_bundle],
                 ["check", big_bundle]):
        res = runner.invoke(main, args)
        assert res.exit_code in (0, 5, 6), (args, res.output[-500:])
        assert "Analysis coverage:" in res.stdout and "--full" in res.stdout, args
    csv = runner.invoke(main, ["compare", big_bundle, "--csv"])
    assert "Analysis coverage" not in csv.stdout and "note:" in csv.stderr
