"""The Slurm and LeaderWorkerSet wrappers documented in docs/multi-node.md, run as written.

Neither Slurm nor Kubernetes runs here. The Slurm batch script is run by bash with stand-ins for
``scontrol`` and ``srun`` (which runs its command once per node with ``SLURM_NODEID`` set, as
srun does for ``--ntasks-per-node=1`` on two nodes); the LWS container args are run by ``sh``
with the variables the LWS webhook sets. A stand-in ``kk3evidence`` records the argv and the
environment it was given; the test then checks that every node joins the same group with its
own rank, from that argv and environment.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from kk3evidence.capture import group

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "multi-node.md").read_text(encoding="utf-8")

_FAKE_KK3 = """#!{python}
import json, os, sys
with open(os.environ["KK3_FAKE_OUT"], "a") as fh:
    fh.write(json.dumps({{"argv": sys.argv[1:], "env": dict(os.environ)}}) + "\\n")
"""
_FAKE_SRUN = """#!/bin/bash
shift  # --ntasks-per-node=1
for id in 0 1; do SLURM_NODEID=$id SLURM_PROCID=$id "$@"; done
"""
_FAKE_SCONTROL = """#!/bin/bash
printf 'gpu017\\ngpu018\\n'
"""


def _bin(tmp: Path) -> Path:
    b = tmp / "bin"
    b.mkdir()
    for name, text in (
        ("kk3evidence", _FAKE_KK3.format(python=sys.executable)),
        ("srun", _FAKE_SRUN),
        ("scontrol", _FAKE_SCONTROL),
    ):
        (b / name).write_text(text)
        (b / name).chmod(0o755)
    return b


def _block(lang: str, start: str) -> str:
    for m in re.finditer(rf"```{lang}\n(.*?)```", DOC, re.S):
        if m.group(1).lstrip().startswith(start):
            return m.group(1)
    raise AssertionError(f"no ```{lang} block starting {start!r} in docs/multi-node.md")


def _captures(out: Path) -> list[tuple[list[str], dict[str, str]]]:
    calls = [json.loads(line) for line in out.read_text().splitlines()]
    found = []
    for c in calls:
        argv = c["argv"]
        if argv[0] != "capture":
            continue
        group_opt = argv[argv.index("--group") + 1]
        found.append(([group_opt, *argv[argv.index("--") + 1 :]], c["env"]))
    return found


def _resolve(call: tuple[list[str], dict[str, str]]) -> group.GroupInfo:
    (requested, *cmd), env = call
    info = group.resolve(requested, cmd, env, clock={})
    assert info is not None
    return info


def test_slurm_batch_script_puts_both_nodes_in_the_job_group(tmp_path: Path) -> None:
    script = _block("bash", "#!/bin/bash")
    out = tmp_path / "calls.jsonl"
    env = {
        "PATH": f"{_bin(tmp_path)}:/usr/bin:/bin",
        "KK3_FAKE_OUT": str(out),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "gpu[017-018]",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NUM_NODES": "2",
    }
    r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, check=False)
    assert r.returncode == 0, r.stderr
    calls = _captures(out)
    assert len(calls) == 2
    infos = [_resolve(c) for c in calls]
    assert {i.group_id for i in infos} == {"slurm-4242"}
    assert [(i.node_rank, i.nnodes, i.role) for i in infos] == [(0, 2, "head"), (1, 2, "worker")]
    assert [i.detail["derived_id"] for i in infos] == ["vllm-gpu017-29500"] * 2
    assert "--headless" not in calls[0][0] and "--headless" in calls[1][0]
    # the analyze line of the script reads the job's bundles
    analyze = [json.loads(x)["argv"] for x in out.read_text().splitlines()][-1]
    assert analyze[:2] == ["analyze", "/shared/kk3/4242/node*.tar"]


def _lws_args(template: str) -> str:
    yaml = _block("yaml", "apiVersion: leaderworkerset")
    part = yaml.split(f"{template}:", 1)[1]
    m = re.search(r"args:\n\s*- (exec .*?)\n\s*volumeMounts", part, re.S)
    assert m is not None
    return " ".join(m.group(1).split())  # a YAML plain scalar folds its lines into spaces


def test_lws_leader_and_worker_templates_join_one_group(tmp_path: Path) -> None:
    out = tmp_path / "calls.jsonl"
    base = {
        "PATH": f"{_bin(tmp_path)}:/usr/bin:/bin",
        "KK3_FAKE_OUT": str(out),
        "LWS_LEADER_ADDRESS": "vllm-0.vllm.default",
        "LWS_GROUP_SIZE": "2",
    }
    pods = [
        ("leaderTemplate", {"LWS_WORKER_INDEX": "0", "HOSTNAME": "vllm-0"}),
        ("workerTemplate", {"LWS_WORKER_INDEX": "1", "HOSTNAME": "vllm-0-1"}),
    ]
    for template, env in pods:
        r = subprocess.run(
            ["sh", "-c", _lws_args(template)], env={**base, **env}, capture_output=True, check=False
        )
        assert r.returncode == 0, r.stderr
    calls = _captures(out)
    infos = [_resolve(c) for c in calls]
    assert {i.group_id for i in infos} == {"vllm-vllm-0.vllm.default-29500"}
    assert [(i.node_rank, i.nnodes, i.role) for i in infos] == [(0, 2, "head"), (1, 2, "worker")]
    outputs = [json.loads(x)["argv"] for x in out.read_text().splitlines()]
    assert [a[a.index("-o") + 1] for a in outputs] == [
        "/evidence/vllm-0.tar",
        "/evidence/vllm-0-1.tar",
    ]
    assert shlex.join(outputs[1]).endswith("--headless")
