"""Pre-flight: what can be known before a ``vllm serve`` launch, judged in well under a second.

Pure: the host facts come in as :class:`HostFacts` (gathered by
:mod:`kk3evidence.capture.preflight_host`); every check ends ``pass``, ``fail``, ``warn`` or
``unknown`` with its evidence and, for facts, their source and date (``data/preflight.toml``,
``rules/compat/*.toml``). Unknown stays unknown: without NVML the GPU checks say so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from kk3evidence.handoff.preflight import flag_checks as _flags
from kk3evidence.handoff.preflight import host_checks as _host
from kk3evidence.handoff.preflight import model_checks as _model
from kk3evidence.handoff.preflight.facts import (
    Fact,
    FileFact,
    GpuDevice,
    GpuFacts,
    HostFacts,
    ModelFacts,
    PortFacts,
    VllmFacts,
    load_facts,
)
from kk3evidence.handoff.preflight.model_checks import Ctx
from kk3evidence.handoff.preflight.recipe import compat_checks, disagreement_checks
from kk3evidence.handoff.preflight.result import SCHEMA, Check, PreflightResult, Status
from kk3evidence.vllm_args import ArgTable, parse_serve_argv

__all__ = [
    "SCHEMA",
    "Check",
    "Fact",
    "FileFact",
    "GpuDevice",
    "GpuFacts",
    "HostFacts",
    "ModelFacts",
    "PortFacts",
    "PreflightResult",
    "Status",
    "VllmFacts",
    "judge",
    "load_facts",
]

_CHECKS: tuple[Callable[[Ctx], Check | None], ...] = (
    _model.check_location, _model.check_config, _model.check_architecture,
    _model.check_remote_code, _model.check_weights, _model.check_tokenizer, _model.check_size,
    _model.check_context, _model.check_heads, _host.check_weights_fit, _host.check_kv_cache,
    _host.check_host_ram, _host.check_cpu_head_size,
    _flags.check_unknown, _flags.check_choices, _flags.check_parsers,
    _host.check_world_size, _host.check_multi_node,
    _host.check_vllm_install, _host.check_port, _host.check_shm, _host.check_nofile,
    _host.check_disk, _host.check_gpu_jobs,
)


# checks that need the model's files; without them they are listed as unknown, not dropped
_NEED_MODEL = (("model.architecture", "model"), ("model.remote-code", "model"),
               ("model.weights", "model"), ("model.tokenizer", "model"), ("model.size", "model"),
               ("memory.context-length", "memory"), ("memory.heads-divisible", "memory"),
               ("memory.weights-fit", "memory"), ("memory.kv-cache", "memory"))


def _not_checked(ctx: Ctx, done: set[str]) -> list[Check]:
    why = ("needs the model's files, which could not be read before launch "
           "(see model.location / model.config)")
    need = list(_NEED_MODEL)
    if ctx.facts.vllm.cpu_build:
        need.append(("memory.head-size", "memory"))
    return [Check(id_, area, "unknown", why, (f"model: {ctx.facts.model.how}",))
            for id_, area in need if id_ not in done]


def judge(
    argv: Sequence[str],
    facts: HostFacts,
    *,
    recipe: str | None = None,
    table: ArgTable | None = None,
    started: float | None = None,
) -> PreflightResult:
    """Run every check of ``argv`` (a ``vllm serve`` command) against ``facts``.

    ``table`` is the argument table of the installed vLLM (default: the shipped one nearest to
    ``facts.vllm.version``). Raises :class:`~kk3evidence.errors.InputError` when ``argv`` is
    not a vLLM serve command, :class:`~kk3evidence.errors.UsageError` for an unknown recipe.
    """
    t0 = time.monotonic() if started is None else started
    if table is None:
        from kk3evidence.vllm_args import load_arg_table

        table = load_arg_table(facts.vllm.version)
    cmd = parse_serve_argv(argv, table)
    ctx = Ctx(cmd, facts)
    checks = [c for c in (fn(ctx) for fn in _CHECKS) if c is not None]
    checks += _not_checked(ctx, {c.id for c in checks})
    more, chosen, auto = compat_checks(ctx, argv, recipe)
    checks += more
    checks += disagreement_checks(ctx, chosen)
    host = {
        "collected_at": facts.collected_at,
        "vllm": facts.vllm.version,
        "vllm_build": "cpu" if facts.vllm.cpu_build else "gpu" if facts.vllm.version else None,
        "argument_table": table.source,
        "gpus": facts.gpus.source,
        "gpu_count": len(facts.gpus.devices) if facts.gpus.source == "nvml" else None,
        "model_path": facts.model.path,
    }
    return PreflightResult(tuple(argv), chosen, auto, facts.collected_at,
                           time.monotonic() - t0, tuple(checks), host)
