"""Pre-flight checks of memory budgets, flags and the host (pure: judge :class:`HostFacts`)."""

from __future__ import annotations

from kk3evidence.handoff.preflight.facts import GpuDevice
from kk3evidence.handoff.preflight.model_checks import (
    Ctx,
    GiB,
    checkpoint_bytes,
    heads,
    kv_bytes_per_token,
)
from kk3evidence.handoff.preflight.result import Check, Status

MiB = 1 << 20
_MULTI_NODE = ("nnodes", "node-rank", "master-addr", "headless", "data-parallel-address",
               "data-parallel-size-local", "data-parallel-start-rank")


def _f(ctx: Ctx, name: str, default: int) -> int:
    v = ctx.cmd.flags.get(name)
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def local_world(ctx: Ctx) -> tuple[int, str]:
    tp, pp = ctx.cmd.tensor_parallel_size, ctx.cmd.pipeline_parallel_size
    dp_local = _f(ctx, "data-parallel-size-local", ctx.cmd.data_parallel_size)
    nnodes = _f(ctx, "nnodes", 1)
    world = tp * pp * dp_local
    text = f"tp {tp} x pp {pp} x local dp {dp_local} = {world}"
    if nnodes > 1 and "data-parallel-size-local" not in ctx.cmd.flags:
        world = max(1, world // nnodes)
        text += f", over {nnodes} nodes -> {world} per node"
    return world, text


def visible_devices(ctx: Ctx) -> tuple[list[GpuDevice] | None, list[str]]:
    g = ctx.facts.gpus
    ev = [f"GPUs: {g.source}" + (f" ({g.detail})" if g.detail else "")]
    if g.source != "nvml":
        return None, ev
    devices = list(g.devices)
    cvd = ctx.facts.env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        ev.append(f"env CUDA_VISIBLE_DEVICES: {cvd!r}")
        wanted = [x.strip() for x in cvd.split(",") if x.strip()]
        by_id = {str(d.index): d for d in devices}
        devices = [by_id[w] for w in wanted if w in by_id] if all(
            w.isdigit() for w in wanted) else devices[: len(wanted)]
    ev.append(f"visible GPUs: {len(devices)} of {len(g.devices)}")
    return devices, ev


def check_world_size(ctx: Ctx) -> Check:
    world, text = local_world(ctx)
    ev = [f"ranks on this node: {text}"]
    devices, dev_ev = visible_devices(ctx)
    ev += dev_ev
    if devices is not None:
        if world <= len(devices):
            return ctx.check("flags.world-size", "flags", "pass",
                             f"{world} rank(s) fit {len(devices)} visible GPU(s)", ev)
        return ctx.check("flags.world-size", "flags", "fail",
                         f"{world} ranks need {world} GPUs, {len(devices)} visible", ev,
                         next_step="Lower --tensor-parallel-size / --pipeline-parallel-size / "
                                   "--data-parallel-size, or fix CUDA_VISIBLE_DEVICES.")
    if ctx.facts.vllm.cpu_build:
        return _cpu_world_size(ctx, world, ev)
    if world == 1:
        return ctx.check("flags.world-size", "flags", "pass", "one rank: no parallel layout", ev)
    return ctx.check("flags.world-size", "flags", "unknown",
                     f"{world} ranks, but the GPU count is unknown (no NVML)", ev)


def _cpu_world_size(ctx: Ctx, world: int, ev: list[str]) -> Check:
    ev.append(f"installed vLLM {ctx.facts.vllm.version}: CPU build (one NUMA node per rank)")
    bind = ctx.facts.env.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
    nodes = ctx.facts.numa_nodes
    ev.append(f"env VLLM_CPU_OMP_THREADS_BIND: {bind}; allowed NUMA nodes: {nodes}")
    if bind not in ("", "auto") or world == 1:
        return ctx.check("flags.world-size", "flags", "pass",
                         f"{world} CPU rank(s)" + ("" if world == 1 else ", bound by hand"),
                         ev, "cpu-numa-binding")
    if nodes is None:
        return ctx.check("flags.world-size", "flags", "unknown",
                         "allowed NUMA nodes unknown", ev, "cpu-numa-binding")
    if world <= len(nodes):
        return ctx.check("flags.world-size", "flags", "pass",
                         f"{world} CPU ranks fit {len(nodes)} NUMA node(s)", ev,
                         "cpu-numa-binding")
    return ctx.check("flags.world-size", "flags", "fail",
                     f"{world} CPU ranks need {world} NUMA nodes, {len(nodes)} allowed", ev,
                     "cpu-numa-binding",
                     "Lower the parallel sizes to the NUMA nodes, or bind threads by hand "
                     "(VLLM_CPU_OMP_THREADS_BIND).")


def check_multi_node(ctx: Ctx) -> Check:
    given = {k: ctx.cmd.flags[k] for k in _MULTI_NODE if k in ctx.cmd.flags}
    ev = [f"--{k}: {v}" for k, v in given.items()] or ["no multi-node flags"]
    nnodes, rank = _f(ctx, "nnodes", 1), _f(ctx, "node-rank", 0)
    problems = []
    if nnodes > 1 and str(ctx.cmd.flags.get("master-addr") or "127.0.0.1") in (
            "127.0.0.1", "localhost"):
        problems.append(f"--nnodes {nnodes} without --master-addr (the default 127.0.0.1 "
                        "cannot be reached from the other nodes)")
    if rank >= max(nnodes, 1) and "node-rank" in given:
        problems.append(f"--node-rank {rank} is not below --nnodes {nnodes}")
    dp, dp_local = ctx.cmd.data_parallel_size, _f(ctx, "data-parallel-size-local", 0)
    if 0 < dp_local < dp and "data-parallel-address" not in given:
        problems.append(f"--data-parallel-size-local {dp_local} < --data-parallel-size {dp} "
                        "without --data-parallel-address")
    if ctx.cmd.flags.get("headless") is True and "data-parallel-address" not in given \
            and nnodes <= 1:
        problems.append("--headless without --data-parallel-address or --nnodes")
    if problems:
        return ctx.check("flags.multi-node", "flags", "fail", problems[0], ev + problems[1:],
                         next_step="Give every node the head's address and its own rank "
                                   "(--master-addr/--node-rank or --data-parallel-address/"
                                   "--data-parallel-start-rank).")
    return ctx.check("flags.multi-node", "flags", "pass",
                     "multi-node flags consistent" if given else "single node", ev)


# --- memory ------------------------------------------------------------------------------------


def check_weights_fit(ctx: Ctx) -> Check | None:
    total = checkpoint_bytes(ctx)
    if total is None:
        return None
    tp, pp = ctx.cmd.tensor_parallel_size, ctx.cmd.pipeline_parallel_size
    split = tp * pp * (ctx.cmd.data_parallel_size
                       if ctx.cmd.flags.get("enable-expert-parallel") is True else 1)
    per_rank = total // max(split, 1)
    util = ctx.cmd.gpu_memory_utilization or ctx.fact("gpu-memory").number(
        "default_utilization", 0.9)
    ev = [f"checkpoint: {total / GiB:.2f} GiB split over {split} rank(s) -> "
          f"{per_rank / GiB:.2f} GiB each", f"--gpu-memory-utilization: {util}"]
    devices, dev_ev = visible_devices(ctx)
    ev += dev_ev
    if devices is None:
        if ctx.facts.vllm.cpu_build and ctx.facts.mem_available_bytes is not None:
            avail = ctx.facts.mem_available_bytes
            ev.append(f"host MemAvailable: {avail / GiB:.2f} GiB (CPU build: weights in RAM)")
            status: Status = "pass" if total < avail else "fail"
            return ctx.check("memory.weights-fit", "memory", status,
                             f"{total / GiB:.2f} GiB of weights vs {avail / GiB:.2f} GiB free RAM",
                             ev, "gpu-memory", "Free host memory or use a smaller model.")
        return ctx.check("memory.weights-fit", "memory", "unknown",
                         "GPU memory unknown (no NVML here)", ev, "gpu-memory")
    budgets = [(d.total_bytes or 0) * util - (d.used_bytes or 0) for d in devices]
    if not budgets:
        return ctx.check("memory.weights-fit", "memory", "fail", "no visible GPU", ev,
                         "gpu-memory", "Check CUDA_VISIBLE_DEVICES.")
    low = min(budgets)
    ev.append(f"smallest budget: total x {util} - used by others = {low / GiB:.2f} GiB")
    if per_rank > low:
        return ctx.check("memory.weights-fit", "memory", "fail",
                         f"{per_rank / GiB:.2f} GiB of weights per GPU > {low / GiB:.2f} GiB "
                         "budget", ev, "gpu-memory",
                         "Use more GPUs (tensor/pipeline parallel), a quantized checkpoint, or "
                         "free the GPUs.")
    status = "warn" if per_rank > 0.9 * low else "pass"
    return ctx.check("memory.weights-fit", "memory", status,
                     f"{per_rank / GiB:.2f} GiB of weights per GPU in a {low / GiB:.2f} GiB "
                     "budget", ev, "gpu-memory", "Little room is left for the KV cache.")


def _kv_budget(ctx: Ctx) -> tuple[float | None, str, bool]:
    """KV-cache bytes per rank, where that number comes from, and whether it is exact."""
    explicit = ctx.cmd.flags.get("kv-cache-memory-bytes")
    if isinstance(explicit, int) and not isinstance(explicit, bool):
        return float(explicit), f"--kv-cache-memory-bytes {explicit}", True
    space = ctx.facts.env.get("VLLM_CPU_KVCACHE_SPACE", "")
    if ctx.facts.vllm.cpu_build and space.strip().isdigit() and int(space) > 0:
        return int(space) * float(GiB), f"env VLLM_CPU_KVCACHE_SPACE={space} (GiB)", True
    devices, _ = visible_devices(ctx)
    total = checkpoint_bytes(ctx)
    if devices and total is not None:
        util = ctx.cmd.gpu_memory_utilization or 0.9
        split = ctx.cmd.tensor_parallel_size * ctx.cmd.pipeline_parallel_size
        low = min((d.total_bytes or 0) * util - (d.used_bytes or 0) for d in devices)
        return low - total / split, "GPU budget after weights (rough: no activations)", False
    return None, "no KV budget known (CPU auto-sizing or no NVML)", False


def check_kv_cache(ctx: Ctx) -> Check | None:
    if ctx.config is None:
        return None
    per_token, how = kv_bytes_per_token(ctx)
    budget, where, exact = _kv_budget(ctx)
    want = ctx.cmd.flags.get("max-model-len")
    ev = [f"KV bytes per token per rank: {per_token} ({how})", f"budget: {where}"]
    if per_token is None or budget is None:
        return ctx.check("memory.kv-cache", "memory", "unknown",
                         "cannot size the KV cache before launch", ev, "kv-cache")
    tokens = int(budget // per_token) if budget > 0 else 0
    ev.append(f"capacity: about {tokens} tokens")
    if not isinstance(want, int) or isinstance(want, bool) or want <= 0:
        return ctx.check("memory.kv-cache", "memory", "pass" if tokens > 0 else "warn",
                         f"about {tokens} KV tokens (--max-model-len derived by vLLM)", ev,
                         "kv-cache", "Give more memory to the KV cache.")
    if tokens >= want:
        return ctx.check("memory.kv-cache", "memory", "pass",
                         f"about {tokens} KV tokens >= --max-model-len {want}", ev, "kv-cache")
    return ctx.check("memory.kv-cache", "memory", "fail" if exact else "warn",
                     f"KV cache holds about {tokens} tokens < --max-model-len {want}", ev,
                     "kv-cache", f"Lower --max-model-len to {tokens} or less, or give the KV "
                                 "cache more memory.")


def check_host_ram(ctx: Ctx) -> Check | None:
    """CPU build: the KV space asked for must fit the RAM that is free now."""
    space = ctx.facts.env.get("VLLM_CPU_KVCACHE_SPACE", "")
    if not ctx.facts.vllm.cpu_build or not space.strip().isdigit() or int(space) == 0:
        return None
    want = int(space) * GiB * local_world(ctx)[0]
    avail = ctx.facts.mem_available_bytes
    ev = [f"env VLLM_CPU_KVCACHE_SPACE: {space} GiB per rank",
          f"host MemAvailable: {avail if avail is None else f'{avail / GiB:.2f} GiB'}"]
    if avail is None:
        return ctx.check("memory.host-ram", "memory", "unknown", "free RAM unknown", ev,
                         "kv-cache")
    if want < avail:
        return ctx.check("memory.host-ram", "memory", "pass",
                         f"{want / GiB:.1f} GiB of KV space fits {avail / GiB:.2f} GiB free", ev,
                         "kv-cache")
    return ctx.check("memory.host-ram", "memory", "fail",
                     f"{want / GiB:.1f} GiB of KV space > {avail / GiB:.2f} GiB free RAM", ev,
                     "kv-cache", "Lower VLLM_CPU_KVCACHE_SPACE (GiB) below the free memory.")


def check_cpu_head_size(ctx: Ctx) -> Check | None:
    if not ctx.facts.vllm.cpu_build or ctx.config is None:
        return None
    _, _, head_dim = heads(ctx)
    sizes = [int(str(s)) for s in ctx.fact("cpu-head-sizes").items("sizes")]
    ev = [f"config head_dim: {head_dim}", f"CPU attention head sizes: {sizes}"]
    if head_dim is None:
        return ctx.check("memory.head-size", "memory", "unknown", "head_dim unknown", ev,
                         "cpu-head-sizes")
    if head_dim in sizes:
        return ctx.check("memory.head-size", "memory", "pass",
                         f"head_dim {head_dim} is supported by the CPU attention backend", ev,
                         "cpu-head-sizes")
    return ctx.check("memory.head-size", "memory", "fail",
                     f"head_dim {head_dim} is not supported by the CPU attention backend "
                     "(the server starts, then the first request fails)", ev, "cpu-head-sizes",
                     "Use a model whose head_dim is one of the supported sizes, or a GPU.")


def check_gpu_jobs(ctx: Ctx) -> Check:
    devices, ev = visible_devices(ctx)
    if devices is None:
        return ctx.check("host.gpu-jobs", "host", "unknown",
                         "cannot see other jobs on the GPUs (no NVML)", ev)
    busy = [(d.index, p) for d in devices for p in d.processes]
    for idx, (pid, name, used) in busy[:8]:
        ev.append(f"GPU {idx}: pid {pid} {name} "
                  f"{'' if used is None else f'{used / GiB:.1f} GiB'}")
    if busy:
        return ctx.check("host.gpu-jobs", "host", "warn",
                         f"{len(busy)} other process(es) on the visible GPUs", ev,
                         next_step="Wait for them or pick free GPUs (CUDA_VISIBLE_DEVICES); "
                                   "record them in notes.json.")
    return ctx.check("host.gpu-jobs", "host", "pass", "no other process on the visible GPUs", ev)


# --- host ------------------------------------------------------------------------------------


def check_vllm_install(ctx: Ctx) -> Check:
    v = ctx.facts.vllm
    ev = [f"interpreter: {v.interpreter or '(not found)'} ({v.how})",
          f"site-packages: {v.site_packages}", f"vllm distribution: {v.version}"]
    if v.interpreter is None:
        return ctx.check("host.vllm-install", "host", "fail",
                         f"cannot find the Python that runs the command ({v.how})", ev,
                         next_step="Put vLLM's environment on PATH or call its python -m "
                                   "vllm.entrypoints.openai.api_server.")
    if v.error:
        return ctx.check("host.vllm-install", "host", "unknown", v.error, ev)
    if v.version is None:
        others = sorted(k for k in v.dists if k.startswith("vllm"))
        ev.append(f"vllm-like distributions: {others or 'none'}")
        return ctx.check("host.vllm-install", "host", "fail",
                         "no 'vllm' distribution metadata in the server's environment; the "
                         "vllm CLI exits at once", ev, "vllm-dist",
                         "Install vLLM with pip (or add the 'vllm' dist-info the CLI asks for).")
    return ctx.check("host.vllm-install", "host", "pass", f"vLLM {v.version}", ev, "vllm-dist")


def check_port(ctx: Ctx) -> Check:
    p = ctx.facts.port
    ev = [f"bind {p.host}:{p.port}: {p.detail}"] + [f"held by {h}" for h in p.holders]
    if p.free is None:
        return ctx.check("host.port", "host", "unknown", f"port {p.port}: {p.detail}", ev)
    if p.free:
        return ctx.check("host.port", "host", "pass", f"port {p.port} is free", ev)
    who = p.holders[0] if p.holders else "another process (owner not visible)"
    return ctx.check("host.port", "host", "fail", f"port {p.port} is taken by {who}", ev,
                     next_step="Stop that process or use another --port.")


def check_shm(ctx: Ctx) -> Check:
    world, text = local_world(ctx)
    shm = ctx.facts.shm_bytes
    fact = ctx.fact("shm")
    ev = [f"/dev/shm: {shm if shm is None else f'{shm / MiB:.0f} MiB'}", f"ranks: {text}"]
    if shm is None:
        return ctx.check("host.shm", "host", "unknown", "/dev/shm size unknown", ev, "shm")
    if world <= 1:
        return ctx.check("host.shm", "host", "pass",
                         f"/dev/shm {shm / MiB:.0f} MiB (one rank: little is needed)", ev, "shm")
    fail_at = fact.number("fail_at_or_below_bytes", 0)
    warn_below = fact.number("warn_below_bytes", 0)
    nxt = "Run the container with --ipc=host or --shm-size 16g (or more)."
    if shm <= fail_at:
        return ctx.check("host.shm", "host", "fail",
                         f"/dev/shm is {shm / MiB:.0f} MiB (docker's default) with {world} ranks",
                         ev, "shm", nxt)
    status: Status = "warn" if shm < warn_below else "pass"
    return ctx.check("host.shm", "host", status, f"/dev/shm {shm / MiB:.0f} MiB for {world} ranks",
                     ev, "shm", nxt)


def check_nofile(ctx: Ctx) -> Check:
    need = int(ctx.fact("ulimit").number("min", 65535))
    lim = ctx.facts.nofile
    if lim is None:
        return ctx.check("host.nofile", "host", "unknown", "ulimit -n unknown", [], "ulimit")
    soft, hard = lim
    ev = [f"ulimit -n: soft {soft}, hard {hard}", f"vLLM raises the soft limit to {need}"]
    if soft >= need or hard >= need:
        return ctx.check("host.nofile", "host", "pass",
                         f"open-file limit can reach {need}", ev, "ulimit")
    return ctx.check("host.nofile", "host", "warn",
                     f"open-file limit {soft} (hard {hard}) < {need}: vLLM warns and may hit "
                     "'Too many open files' under load", ev, "ulimit",
                     f"Raise it (ulimit -n {need}, or docker --ulimit nofile={need}:{need}).")


def check_disk(ctx: Ctx) -> Check:
    free, where = ctx.facts.cache_free_bytes, ctx.facts.cache_dir
    ev = [f"cache folder: {where}", f"free: {free if free is None else f'{free / GiB:.1f} GiB'}"]
    if free is None:
        return ctx.check("host.disk", "host", "unknown", "free space of the cache folder unknown",
                         ev, "disk")
    need = ctx.fact("disk").number("warn_below_bytes", 0)
    if free >= need:
        return ctx.check("host.disk", "host", "pass", f"{free / GiB:.1f} GiB free for caches",
                         ev, "disk")
    return ctx.check("host.disk", "host", "warn", f"only {free / GiB:.1f} GiB free for caches",
                     ev, "disk", "Free space or point VLLM_CACHE_ROOT at a larger disk.")
