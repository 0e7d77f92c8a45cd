"""Pre-flight checks of the model files and of what the model's config implies for memory."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from kk3evidence.handoff.preflight.facts import Fact, FileFact, HostFacts, load_facts
from kk3evidence.handoff.preflight.result import Check, Status
from kk3evidence.vllm_args import ServeCommand

GiB = 1 << 30
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tiktoken.model", "vocab.json",
                    "vocab.txt", "spiece.model", "sentencepiece.bpe.model")
_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
                "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "int8": 1}
# rope types whose factor vLLM multiplies into the derived maximum length
_SCALING_TYPES = ("linear", "dynamic", "yarn", "longrope", "su", "deepseek_yarn")


@dataclass(frozen=True, slots=True)
class Ctx:
    """What every check reads: the parsed command, the host facts, the shipped facts."""

    cmd: ServeCommand
    facts: HostFacts

    def fact(self, key: str) -> Fact:
        return load_facts()[key]

    def check(self, id_: str, area: str, status: Status, summary: str,  # noqa: PLR0917
              evidence: list[str], fact: str | None = None,
              next_step: str | None = None) -> Check:
        f = self.fact(fact) if fact else None
        return Check(id_, area, status, summary, tuple(evidence),
                     next_step if status in ("fail", "warn") else None,
                     f.source if f else None, f.source_date if f else None)

    @property
    def config(self) -> Mapping[str, object] | None:
        return self.facts.model.config

    @property
    def text_config(self) -> Mapping[str, object]:
        """The language-model part of the config (``text_config`` of multimodal models)."""
        cfg = self.config or {}
        inner = cfg.get("text_config")
        if isinstance(inner, Mapping):
            return {**cfg, **inner}
        return cfg


def cfg_int(cfg: Mapping[str, object], *keys: str) -> int | None:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return int(v)
    return None


def _where(ctx: Ctx) -> str:
    return ctx.facts.model.path or str(ctx.facts.model.given)


def check_location(ctx: Ctx) -> Check:
    m = ctx.facts.model
    ev = [f"command model: {m.given}", f"lookup: {m.how}"]
    offline = [k for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
               if ctx.facts.env.get(k, "").lower() in ("1", "true", "yes", "on")]
    if m.path:
        return ctx.check("model.location", "model", "pass", f"model files at {m.path}", ev)
    if m.given is None:
        return ctx.check("model.location", "model", "fail", "the command names no model", ev,
                         next_step="Give the model: vllm serve MODEL ...")
    if offline or not m.remote:
        ev += [f"env {k}: {ctx.facts.env.get(k)}" for k in offline]
        return ctx.check("model.location", "model", "fail",
                         f"{m.given} is not a local folder and not in the Hugging Face cache"
                         + (" (offline)" if offline else ""), ev, "hf-cache",
                         "Download the model first (huggingface-cli download ...) or give the "
                         "local folder; check HF_HOME / HF_HUB_CACHE and --download-dir.")
    return ctx.check("model.location", "model", "unknown",
                     f"{m.given} is not cached here; vLLM would download it at start, so its "
                     "files cannot be checked before launch", ev, "hf-cache")


def check_config(ctx: Ctx) -> Check | None:
    m = ctx.facts.model
    if m.path is None:
        return None
    if m.config_error:
        return ctx.check("model.config", "model", "fail", m.config_error,
                         [f"file: {m.path}/config.json"],
                         next_step="Restore config.json from the model's source (it must be "
                                   "complete, valid JSON).")
    archs = (ctx.config or {}).get("architectures")
    return ctx.check("model.config", "model", "pass", "config.json is valid JSON",
                     [f"file: {m.path}/config.json", f"architectures: {archs}"])


def check_architecture(ctx: Ctx) -> Check | None:
    if ctx.config is None:
        return None
    raw = ctx.config.get("architectures")
    archs = [str(a) for a in raw] if isinstance(raw, list) else []
    known = ctx.facts.vllm.registry_archs
    ev = [f"config architectures: {archs or '(none)'}"]
    if known is None:
        ev.append(f"installed vLLM registry: not readable ({ctx.facts.vllm.how})")
        return ctx.check("model.architecture", "model", "unknown",
                         "cannot read the installed vLLM's model registry", ev)
    ev.append(f"installed vLLM {ctx.facts.vllm.version}: {len(known)} architectures in "
              "vllm/model_executor/models/registry.py")
    hit = [a for a in archs if a in known]
    if hit:
        return ctx.check("model.architecture", "model", "pass",
                         f"{hit[0]} is known to the installed vLLM", ev)
    return ctx.check("model.architecture", "model", "warn",
                     f"{', '.join(archs) or 'no architecture'} is not in the installed vLLM's "
                     "registry; vLLM will try its Transformers fallback", ev,
                     next_step="Use a vLLM release that supports this architecture, or check "
                               "that the Transformers backend can run it.")


def _auto_map_modules(auto_map: Mapping[str, object]) -> list[str]:
    mods: list[str] = []
    for ref in auto_map.values():
        for r in list(ref) if isinstance(ref, (list, tuple)) else [ref]:
            if isinstance(r, str) and "." in r:
                mods.append(r.rsplit(".", 1)[0])
    return sorted(set(mods))


def check_remote_code(ctx: Ctx) -> Check | None:
    if ctx.config is None:
        return None
    auto_map = ctx.config.get("auto_map")
    trust = ctx.cmd.trust_remote_code
    ev = [f"config auto_map: {auto_map if auto_map else '(none)'}",
          f"--trust-remote-code: {'given' if trust else 'not given'}"]
    if not isinstance(auto_map, Mapping) or not auto_map:
        return ctx.check("model.remote-code", "model", "pass",
                         "no auto_map: the model needs no code of its own", ev, "remote-code")
    if not trust:
        return ctx.check("model.remote-code", "model", "fail",
                         "config.json has auto_map (model code) but --trust-remote-code is "
                         "not given", ev, "remote-code", "Add --trust-remote-code.")
    names = {f.name for f in ctx.facts.model.files}
    missing, external = [], []
    for mod in _auto_map_modules(auto_map):
        if "--" in mod:
            external.append(mod)
        elif f"{mod.replace('.', '/')}.py" not in names:
            missing.append(f"{mod}.py")
    ev.append(f"module files present: {sorted(n for n in names if n.endswith('.py')) or 'none'}")
    if missing:
        return ctx.check("model.remote-code", "model", "fail",
                         f"auto_map names {', '.join(missing)}, missing from {_where(ctx)}",
                         ev, "remote-code",
                         "Copy the model's *.py files next to config.json (download the whole "
                         "repository, not only the weights).")
    if external:
        return ctx.check("model.remote-code", "model", "unknown",
                         f"auto_map points to other repositories ({', '.join(external)})",
                         ev, "remote-code")
    return ctx.check("model.remote-code", "model", "pass",
                     "auto_map modules are present and --trust-remote-code is given", ev,
                     "remote-code")


def weight_files(files: tuple[FileFact, ...]) -> list[FileFact]:
    st = [f for f in files if f.name.endswith(".safetensors")]
    if st:
        return st
    return [f for f in files if f.name.endswith(_WEIGHT_SUFFIXES)
            and not f.name.startswith(("training_args", "optimizer"))]


def check_weights(ctx: Ctx) -> Check | None:
    m = ctx.facts.model
    if m.path is None:
        return None
    load_format = str(ctx.cmd.flags.get("load-format") or "auto")
    if load_format == "dummy":
        return ctx.check("model.weights", "model", "pass",
                         "--load-format dummy: no weights are read", [], "weights")
    weights = weight_files(m.files)
    ev = [f"folder: {m.path}", f"weight files: {len(weights)}"]
    if not weights:
        return ctx.check("model.weights", "model", "fail",
                         f"no weight files (*.safetensors, *.bin, *.pt) in {m.path}", ev,
                         "weights", "Download the weights into the model folder (or fix the "
                                    "path / HF cache snapshot).")
    problems: list[str] = []
    if m.index_error:
        problems.append(m.index_error)
    if m.index_shards is not None:
        present = {f.name for f in weights}
        gone = [s for s in m.index_shards if s not in present]
        ev.append(f"index names {len(m.index_shards)} shards, {len(gone)} missing")
        if gone:
            problems.append(f"{len(gone)} shard(s) named by the index are missing "
                            f"(first: {gone[0]})")
    for f in weights:
        if f.lfs_pointer:
            problems.append(f"{f.name} is a git-LFS pointer ({f.size} bytes), not the weights")
        elif f.header_problem:
            problems.append(f"{f.name}: {f.header_problem}")
    if problems:
        return ctx.check("model.weights", "model", "fail", problems[0], ev + problems[1:6],
                         "weights", "Download the weights again (git lfs pull, or "
                                    "huggingface-cli download) and compare sizes.")
    return ctx.check("model.weights", "model", "pass",
                     f"{len(weights)} weight file(s), sizes match their headers", ev, "weights")


def check_tokenizer(ctx: Ctx) -> Check | None:
    m = ctx.facts.model
    if m.path is None:
        return None
    if ctx.cmd.flags.get("skip-tokenizer-init") is True:
        return ctx.check("model.tokenizer", "model", "pass",
                         "--skip-tokenizer-init: no tokenizer is loaded", [])
    tok = ctx.cmd.flags.get("tokenizer")
    if isinstance(tok, str) and tok not in (m.given, m.path):
        return ctx.check("model.tokenizer", "model", "unknown",
                         f"--tokenizer {tok}: a separate tokenizer, not checked", [])
    names = {f.name for f in m.files}
    found = [n for n in _TOKENIZER_FILES if n in names] + sorted(
        n for n in names if n.endswith(".tiktoken"))
    ev = [f"tokenizer files: {found or 'none'}",
          f"tokenizer_config.json: {'present' if 'tokenizer_config.json' in names else 'absent'}"]
    if found:
        return ctx.check("model.tokenizer", "model", "pass", f"tokenizer {found[0]} present", ev)
    return ctx.check("model.tokenizer", "model", "warn",
                     f"no tokenizer file ({', '.join(_TOKENIZER_FILES[:3])}, ...) in {m.path}",
                     ev, next_step="Copy the tokenizer files, pass --tokenizer, or "
                                   "--skip-tokenizer-init.")


def checkpoint_bytes(ctx: Ctx) -> int | None:
    if ctx.facts.model.path is None:
        return None
    return sum(f.size for f in weight_files(ctx.facts.model.files) if not f.lfs_pointer)


def check_size(ctx: Ctx) -> Check | None:
    total = checkpoint_bytes(ctx)
    if total is None:
        return None
    n = len(weight_files(ctx.facts.model.files))
    return ctx.check("model.size", "model", "pass",
                     f"checkpoint: {total / GiB:.2f} GiB in {n} file(s)",
                     [f"bytes: {total}"])


# --- what the config implies -----------------------------------------------------------------


def derived_max_len(ctx: Ctx) -> tuple[int | None, list[str]]:
    cfg = ctx.text_config
    keys = [str(k) for k in ctx.fact("max-model-len").items("keys")]
    found = [(k, cfg_int(cfg, k)) for k in keys if cfg_int(cfg, k) is not None]
    if not found:
        return None, ["config: none of " + ", ".join(keys)]
    key, value = min(found, key=lambda kv: kv[1] or 0)
    ev = [f"config {key}: {value}"]
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if isinstance(rope, Mapping):
        kind = str(rope.get("rope_type") or rope.get("type") or "default")
        factor = rope.get("factor")
        ev.append(f"config rope: type {kind}, factor {factor}")
        if kind in _SCALING_TYPES and isinstance(factor, (int, float)) and value is not None:
            value = int(value * float(factor))
    return value, ev


def check_context(ctx: Ctx) -> Check | None:
    if ctx.config is None:
        return None
    want = ctx.cmd.flags.get("max-model-len")
    limit, ev = derived_max_len(ctx)
    ev.insert(0, f"--max-model-len: {want if want is not None else '(not given: derived)'}")
    if not isinstance(want, int) or isinstance(want, bool) or want < 0:
        return ctx.check("memory.context-length", "memory", "pass",
                         "--max-model-len not given (or -1): vLLM derives it from the config",
                         ev, "max-model-len")
    if limit is None:
        return ctx.check("memory.context-length", "memory", "unknown",
                         "the config states no maximum length", ev, "max-model-len")
    if want <= limit:
        return ctx.check("memory.context-length", "memory", "pass",
                         f"--max-model-len {want} <= the model's {limit}", ev, "max-model-len")
    allow = ctx.facts.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "")
    if allow.lower() in ("1", "true"):
        return ctx.check("memory.context-length", "memory", "warn",
                         f"--max-model-len {want} > the model's {limit}, allowed by "
                         "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (outputs may be wrong)",
                         ev, "max-model-len", "Use a length the model was trained for.")
    return ctx.check("memory.context-length", "memory", "fail",
                     f"--max-model-len {want} > the model's maximum {limit}", ev,
                     "max-model-len", f"Use --max-model-len {limit} or less.")


def heads(ctx: Ctx) -> tuple[int | None, int | None, int | None]:
    cfg = ctx.text_config
    n_heads = cfg_int(cfg, "num_attention_heads", "n_head", "num_heads")
    kv = cfg_int(cfg, "num_key_value_heads", "n_head_kv", "num_kv_heads") or n_heads
    hidden = cfg_int(cfg, "hidden_size", "d_model", "n_embd")
    head_dim = cfg_int(cfg, "head_dim")
    if head_dim is None and hidden and n_heads:
        head_dim = hidden // n_heads
    return n_heads, kv, head_dim


def check_heads(ctx: Ctx) -> Check | None:
    if ctx.config is None:
        return None
    tp, pp = ctx.cmd.tensor_parallel_size, ctx.cmd.pipeline_parallel_size
    n_heads, kv, _ = heads(ctx)
    layers = cfg_int(ctx.text_config, "num_hidden_layers", "n_layer", "num_layers")
    ev = [f"--tensor-parallel-size: {tp}", f"--pipeline-parallel-size: {pp}",
          f"config num_attention_heads: {n_heads}", f"config num_key_value_heads: {kv}",
          f"config num_hidden_layers: {layers}"]
    problems = []
    if n_heads is not None and n_heads % tp:
        problems.append(f"{n_heads} attention heads are not divisible by tensor parallel {tp}")
    if kv is not None and (kv % tp if kv >= tp else tp % kv):
        problems.append(f"{kv} KV heads can be neither split nor replicated evenly over {tp}")
    if layers is not None and pp > layers:
        problems.append(f"pipeline parallel {pp} > {layers} layers")
    if problems:
        divisors = [d for d in range(1, (n_heads or 1) + 1) if n_heads and n_heads % d == 0]
        return ctx.check("memory.heads-divisible", "memory", "fail", problems[0], ev,
                         "heads-divisible",
                         f"Use a tensor parallel size that divides {n_heads} "
                         f"({', '.join(map(str, divisors[:8]))}).")
    if n_heads is None:
        return ctx.check("memory.heads-divisible", "memory", "unknown",
                         "the config states no head count", ev, "heads-divisible")
    return ctx.check("memory.heads-divisible", "memory", "pass",
                     f"{n_heads} heads / {kv} KV heads fit tensor parallel {tp}", ev,
                     "heads-divisible")


def dtype_bytes(ctx: Ctx, flag: str) -> int | None:
    v = str(ctx.cmd.flags.get(flag) or "auto")
    if v == "auto":
        v = str(ctx.text_config.get("torch_dtype") or ctx.text_config.get("dtype") or "bfloat16")
    return _DTYPE_BYTES.get(v)


def kv_bytes_per_token(ctx: Ctx) -> tuple[int | None, str]:
    """KV-cache bytes one token takes on one rank (rough: full attention in every layer)."""
    cfg = ctx.text_config
    tp, pp = ctx.cmd.tensor_parallel_size, ctx.cmd.pipeline_parallel_size
    layers = cfg_int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    size = dtype_bytes(ctx, "kv-cache-dtype")
    if layers is None or size is None:
        return None, "config lacks num_hidden_layers or the KV dtype is unknown"
    per_rank_layers = math.ceil(layers / pp)
    lora = cfg_int(cfg, "kv_lora_rank")
    if lora is not None:  # MLA: one latent vector per token and layer, not split by TP
        rope = cfg_int(cfg, "qk_rope_head_dim") or 0
        per = per_rank_layers * (lora + rope) * size
        return per, f"MLA: {per_rank_layers} layers x ({lora}+{rope}) x {size} B"
    _, kv, head_dim = heads(ctx)
    if kv is None or head_dim is None:
        return None, "config lacks KV heads or head_dim"
    kv_rank = max(1, kv // tp)
    per = 2 * per_rank_layers * kv_rank * head_dim * size
    return per, f"2 x {per_rank_layers} layers x {kv_rank} KV heads x {head_dim} x {size} B"
