"""Plans that fit (issue 10): a step's long prompt is counted with the server's /tokenize and
trimmed so that input + max_tokens fits the context; a step changing two variables is refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from progs.helpers import PY, free_port, prog

from kk3evidence.capture.ladder.fit import fit_prompt
from kk3evidence.capture.ladder.run import NoProgress, load_plan, run_ladder
from kk3evidence.cli import main
from kk3evidence.errors import InputError


def _step(i: int, variable: str, argv: list[str], kind: str, **request: object) -> str:
    req = "".join(f"{k} = {json.dumps(v)}\n" for k, v in request.items())
    return (f"[[step]]\nid = {i}\nvariable = {json.dumps(variable)}\nkind = {json.dumps(kind)}\n"
            f'from = "a"\nto = "b"\nargv = {json.dumps(argv)}\n[step.request]\n{req}\n')


def _plan(path: Path, *steps: str) -> Path:
    path.write_text('schema = "kk3evidence/ladder-plan/v1"\n[plan]\ncreated = "t"\n\n'
                    + "".join(steps))
    return path


def test_fit_trims_words_until_input_and_output_fit() -> None:
    def counter(body: Mapping[str, Any]) -> tuple[int | None, int | None]:
        words = len(body["messages"][0]["content"].split())
        return words + 30, 512  # a template that adds 30 tokens, a 512-token server

    def make(n: int) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": " ".join(["w"] * n)}]}

    # planned to fit (370 words + 128 <= 512), but the template makes it 400 tokens
    _body, fit = fit_prompt(370, make, counter, max_tokens=128, context=None,
                            variable="input_tokens")
    assert fit.tokens is not None and fit.tokens + 128 <= 512
    assert fit.words < 370 and "trimmed" in fit.note
    # the context step sends the request as planned: the context is its variable
    _, same = fit_prompt(370, make, counter, max_tokens=128, context=None,
                         variable="context-length")
    assert same.words == 370
    # a hand-written step planned beyond the context (its point) is sent as planned
    _, beyond = fit_prompt(600, make, counter, max_tokens=16, context=None,
                           variable="input_tokens")
    assert beyond.words == 600 and "planned beyond" in beyond.note
    # no /tokenize: sent as planned, and said so
    _, blind = fit_prompt(50, make, lambda b: (None, None), max_tokens=128, context=None,
                          variable="input_tokens")
    assert "no /tokenize" in blind.note


def test_a_long_step_fits_a_small_context_on_a_real_server(tmp_path: Path) -> None:
    port = str(free_port())
    server = [PY, prog("fake_openai.py"), "--host", "127.0.0.1", "--port", port,
              "--max-model-len", "64", "--enforce-context"]
    plan = _plan(tmp_path / "plan.toml",
                 _step(0, "baseline", server, "baseline", max_tokens=4),
                 _step(1, "input_tokens", server, "request", max_tokens=4, input_tokens=55))
    out = tmp_path / "run"
    result = run_ladder(load_plan(plan), out, progress=NoProgress())
    assert [r.outcome.requests for r in result.records] == [("HTTP 2xx",), ("HTTP 2xx",)]
    fit = json.loads((out / "step-01" / "fit.json").read_text())
    # 55 words + 4 fit the 64-token context on paper; the template's 10 tokens do not
    assert fit["context"] == 64 and fit["tokens"] + 4 <= 64 and fit["words"] < 55


def test_a_step_changing_two_variables_is_refused_also_in_dry_run(tmp_path: Path) -> None:
    base = ["vllm", "serve", "m", "--max-model-len", "512"]
    plan = _plan(tmp_path / "plan.toml",
                 _step(0, "baseline", base, "baseline"),
                 _step(1, "prefix-caching", [*base, "--enable-prefix-caching",
                                             "--max-num-seqs", "8"], "argv"))
    with pytest.raises(InputError, match="changes 2 variables"):
        load_plan(plan)
    res = CliRunner().invoke(main, ["ladder", str(plan), "--dry-run"])
    assert res.exit_code == 4
    assert "split it into one step per variable" in res.output
    one_request = _plan(tmp_path / "req.toml",
                        _step(0, "baseline", base, "baseline"),
                        _step(1, "input_tokens", base, "request", input_tokens=100,
                              max_tokens=300))
    with pytest.raises(InputError, match="input, max_tokens"):
        load_plan(one_request)


def test_the_prefix_step_records_the_four_prefix_checks(tmp_path: Path) -> None:
    port = str(free_port())
    server = [PY, prog("fake_openai.py"), "--host", "127.0.0.1", "--port", port]
    plan = _plan(tmp_path / "plan.toml",
                 _step(0, "baseline", server, "baseline", max_tokens=4),
                 _step(1, "prefix-caching", [*server, "--enable-prefix-caching"], "argv",
                       max_tokens=4))
    out = tmp_path / "run"
    result = run_ladder(load_plan(plan), out, progress=NoProgress())
    prefix = result.records[1]
    checks = [s for s in prefix.request_summaries if s.startswith("prefix check ")]
    assert len(checks) == 4, prefix.request_summaries
    assert "prefix check second_request_hits_cache: pass" in checks
    assert not any(s.startswith("prefix check") for s in result.records[0].request_summaries)
