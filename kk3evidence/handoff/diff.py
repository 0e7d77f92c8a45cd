"""Did exactly one variable change between two runs? (the seed's one-variable-per-round rule)

``diff(a, b)`` compares two bundles on five fronts: the environment fingerprint, the launch
command at flag level, the environment variables, the fixed request, and the outcome. The
verdict counts *variables* — things an operator changed — never outcome differences (those are
what the change did) and never noise (pids, timestamps, GPU memory in use, random ports,
container hostnames, probe timings). Differences that follow from another change (a new image
brings a new vLLM and PyTorch; a new driver brings a new NVML/CUDA-driver version) are listed
but attributed to that change instead of being counted twice.

A flag whose value equals what the engine reported it runs with on both sides (``engine_config``,
e.g. ``--enable-prefix-caching`` on vLLM's V1 engine where prefix caching is on by default) is
not a change: it is listed as an equivalence.

Pure: works on :class:`kk3evidence.handoff.evidence.Evidence` (typed records), so it runs
anywhere.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast
from urllib.parse import urlsplit

from kk3evidence.analysis.engine_config import EngineConfig
from kk3evidence.errors import EXIT_OK, EXIT_SEVERAL_CHANGED, InputError
from kk3evidence.handoff import evidence as _evidence
from kk3evidence.handoff.evidence import Evidence
from kk3evidence.handoff.records import Fingerprint, Library, Request
from kk3evidence.model import FORMAT_IDS, JSONObject
from kk3evidence.vllm_args import ServeCommand

__all__ = ["Change", "DiffResult", "diff", "diff_evidence"]

Group = Literal["fingerprint", "command", "env", "request", "outcome"]
Verdict = Literal["none", "one", "several"]



@dataclass(frozen=True, slots=True)
class Change:
    """One difference between run A and run B.

    ``variable`` is a stable key (``argv:--max-num-seqs``, ``env:VLLM_CPU_KVCACHE_SPACE``,
    ``fingerprint:gpus.driver_version``, ``request:max_tokens``, ``outcome:first_failure``).
    ``explained_by`` names the counted variable this difference follows from, if any.
    """

    variable: str
    group: Group
    a: Any
    b: Any
    label: str
    explained_by: str | None = None
    detail: str | None = None

    @property
    def counted(self) -> bool:
        return self.group != "outcome" and self.explained_by is None

    def to_json(self) -> JSONObject:
        return {
            "variable": self.variable,
            "group": self.group,
            "label": self.label,
            "a": self.a,
            "b": self.b,
            "counted": self.counted,
            "explained_by": self.explained_by,
            "detail": self.detail,
        }

    def describe(self) -> str:
        text = f"{self.label}: {_show(self.a)} -> {_show(self.b)}"
        if self.detail:
            text += f" ({self.detail})"
        if self.explained_by:
            text += f" [follows from {self.explained_by}]"
        return text


@dataclass(frozen=True, slots=True)
class Ignored:
    """A difference treated as noise, kept so a reader can see nothing was hidden."""

    what: str
    a: Any
    b: Any
    why: str

    def to_json(self) -> JSONObject:
        return {"what": self.what, "a": self.a, "b": self.b, "why": self.why}


@dataclass(frozen=True, slots=True)
class DiffResult:
    a: str
    b: str
    changes: tuple[Change, ...]
    ignored: tuple[Ignored, ...]
    equivalences: tuple[str, ...]  # spellings that differ but mean the same (flag forms, defaults)

    @property
    def variables(self) -> tuple[Change, ...]:
        """The counted variables (what the verdict is about)."""
        return tuple(c for c in self.changes if c.counted)

    @property
    def outcome(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.group == "outcome")

    @property
    def verdict(self) -> Verdict:
        n = len(self.variables)
        return "none" if n == 0 else "one" if n == 1 else "several"

    @property
    def exit_code(self) -> int:
        return EXIT_SEVERAL_CHANGED if self.verdict == "several" else EXIT_OK

    def summary(self) -> str:
        names = [c.label for c in self.variables]
        if not names:
            return "no variable changed"
        if len(names) == 1:
            return f"exactly one variable changed: {names[0]}"
        return f"{len(names)} variables changed: {', '.join(names)}"

    def to_json(self) -> JSONObject:
        return {
            "schema": FORMAT_IDS["diff"],
            "a": self.a,
            "b": self.b,
            "verdict": self.verdict,
            "summary": self.summary(),
            "variables": [c.label for c in self.variables],
            "changes": [c.to_json() for c in self.changes],
            "outcome": [c.to_json() for c in self.outcome],
            "ignored": [i.to_json() for i in self.ignored],
            "equivalences": list(self.equivalences),
        }


def _show(value: Any) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str):
        return value if value else '""'
    return json.dumps(value, ensure_ascii=False, sort_keys=True)




# --- fingerprint -------------------------------------------------------------------------

# (stable key in fingerprint.json terms, label, explained by which counted variable when it
# changed, the field)
_FP_FIELDS: tuple[tuple[str, str, str | None, Callable[[Fingerprint], object]], ...] = (
    ("host.kernel", "kernel", None, lambda f: f.host.kernel),
    ("host.os", "OS", None, lambda f: f.host.os),
    ("host.arch", "CPU architecture", None, lambda f: f.host.arch),
    ("host.cpu_count", "CPU count", None, lambda f: f.host.cpu_count),
    ("host.mem_total_bytes", "host memory", None, lambda f: f.host.mem_total_bytes),
    ("gpus.driver_version", "NVIDIA driver", None, lambda f: f.gpus.driver_version),
    ("gpus.cuda_driver_version", "CUDA driver version (NVML)", "gpus.driver_version",
     lambda f: f.gpus.cuda_driver_version),
    ("gpus.nvml_version", "NVML version", "gpus.driver_version",
     lambda f: f.gpus.nvml_version),
    ("python.interpreter", "Python interpreter", "image", lambda f: f.python.interpreter),
    ("python.python_version", "Python version", "image", lambda f: f.python.python_version),
    ("python.vllm_version", "vLLM version", "image", lambda f: f.python.vllm_version),
    ("python.torch_version", "PyTorch version", "image", lambda f: f.python.torch_version),
    ("python.torch_cuda", "torch.version.cuda", "image", lambda f: f.python.torch_cuda),
    ("python.nccl_version", "NCCL version", "image", lambda f: f.python.nccl_version),
    ("python.cuda_device_count", "visible GPU count (torch)", "gpus",
     lambda f: f.python.cuda_device_count),
)


def _gpu_identity(fp: Fingerprint) -> list[dict[str, Any]] | None:
    if fp.gpus.source is None:  # no GPU section at all (0.1 bundle, probe missing)
        return None
    return [{"name": d.name, "uuid": d.uuid, "pci_bus_id": d.pci_bus_id,
             "memory_total_bytes": d.memory_total_bytes,
             "compute_capability": d.compute_capability, "mig_mode": d.mig_mode,
             "ecc_mode": d.ecc_mode} for d in fp.gpus.devices]


def _libraries(fp: Fingerprint) -> dict[str, Library]:
    return {lib.name: lib for lib in fp.libraries if lib.name}


def _is_driver_library(name: str) -> bool:
    return name.startswith(("libcuda.so", "libnvidia", "libnvidia-ml"))


_ONE_SIDED = "recorded on one side only: cannot tell whether it changed"


@dataclass(frozen=True, slots=True)
class _Causes:
    """What changed underneath the other fingerprint fields (they are explained by it)."""

    image_changed: bool
    image_label: str
    driver_changed: bool
    gpus_changed: bool
    cvd_changed: bool


def _diff_fingerprint(a: Evidence, b: Evidence, out: list[Change], ign: list[Ignored]) -> None:
    fa, fb = a.fingerprint, b.fingerprint
    image_changed, image_label = _diff_image(fa, fb, out, ign)
    causes = _Causes(
        image_changed=image_changed,
        image_label=image_label,
        driver_changed=fa.gpus.driver_version != fb.gpus.driver_version,
        gpus_changed=_diff_gpus(fa, fb, out, ign),
        cvd_changed=fa.env.get("CUDA_VISIBLE_DEVICES") != fb.env.get("CUDA_VISIBLE_DEVICES"),
    )
    _diff_fp_fields(fa, fb, causes, out, ign)
    _diff_libraries(fa, fb, causes, out, ign)
    _fingerprint_noise(fa, fb, ign)


def _diff_image(fa: Fingerprint, fb: Fingerprint, out: list[Change],
                ign: list[Ignored]) -> tuple[bool, str]:
    """The container runtime and image; returns (image changed, the label that explains)."""
    # The container runtime is always known: None means no container was detected.
    rt_a, rt_b = fa.container.runtime, fb.container.runtime
    runtime_changed = rt_a != rt_b
    if runtime_changed:
        out.append(Change("fingerprint:container.runtime", "fingerprint", rt_a, rt_b,
                          "container runtime"))
    image_changed = runtime_changed
    image_label = "container runtime"
    ref_a, ref_b = fa.container.image_ref, fb.container.image_ref
    id_a, id_b = fa.container.image_id, fb.container.image_id
    # The image: compare by id when both sides know it (a tag can move); a renamed tag with the
    # same id is not a change.
    if id_a and id_b:
        if id_a != id_b:
            image_changed = True
            image_label = "image id"
            out.append(Change("fingerprint:container.image_id", "fingerprint", id_a, id_b,
                              "image id",
                              detail=None if ref_a != ref_b else f"same tag {ref_a} moved"))
        if ref_a != ref_b:
            if id_a == id_b:
                ign.append(Ignored("image reference", ref_a, ref_b,
                                   "same image id under another name"))
            else:
                out.append(Change("fingerprint:container.image_ref", "fingerprint", ref_a, ref_b,
                                  "image reference", explained_by="image id"))
    elif ref_a and ref_b and ref_a != ref_b:
        image_changed = True
        image_label = "image reference"
        out.append(Change("fingerprint:container.image_ref", "fingerprint", ref_a, ref_b,
                          "image reference",
                          detail="image id unknown on at least one side"))
    else:
        for what, va, vb in (("image reference", ref_a, ref_b), ("image id", id_a, id_b)):
            if va == vb:
                continue
            if runtime_changed:
                out.append(Change(f"fingerprint:container.{what.replace(' ', '_')}",
                                  "fingerprint", va, vb, what,
                                  explained_by="container runtime"))
            else:
                ign.append(Ignored(what, va, vb, _ONE_SIDED))
    return image_changed, image_label


def _diff_gpus(fa: Fingerprint, fb: Fingerprint, out: list[Change],
               ign: list[Ignored]) -> bool:
    """The GPU set (by identity); True when it changed on two known sides."""
    gpus_a, gpus_b = _gpu_identity(fa), _gpu_identity(fb)
    gpus_changed = gpus_a != gpus_b and gpus_a is not None and gpus_b is not None
    if gpus_changed:
        out.append(Change("fingerprint:gpus.devices", "fingerprint",
                          _gpu_summary(gpus_a), _gpu_summary(gpus_b), "GPUs"))
    elif gpus_a != gpus_b:
        ign.append(Ignored("GPUs", _gpu_summary(gpus_a), _gpu_summary(gpus_b), _ONE_SIDED))
    return gpus_changed


def _diff_fp_fields(fa: Fingerprint, fb: Fingerprint, causes: _Causes, out: list[Change],
                    ign: list[Ignored]) -> None:
    for path, label, cause, get in _FP_FIELDS:
        va = cast(Any, get(fa))
        vb = cast(Any, get(fb))
        if va == vb:
            continue
        explained: str | None = None
        if cause == "image" and causes.image_changed:
            explained = causes.image_label
        elif cause == "gpus.driver_version" and causes.driver_changed:
            explained = "NVIDIA driver"
        elif cause == "gpus" and (causes.gpus_changed or causes.cvd_changed):
            explained = "GPUs" if causes.gpus_changed else "env CUDA_VISIBLE_DEVICES"
        elif (va is None) != (vb is None):
            if causes.gpus_changed and path.startswith("gpus."):
                explained = "GPUs"  # GPUs on one side only: their driver comes with them
            else:
                # Not collected on one side (a probe failed or timed out): unknown, not a change.
                ign.append(Ignored(label, va, vb, _ONE_SIDED))
                continue
        out.append(Change(f"fingerprint:{path}", "fingerprint", va, vb, label,
                          explained_by=explained))


def _diff_libraries(fa: Fingerprint, fb: Fingerprint, causes: _Causes, out: list[Change],
                    ign: list[Ignored]) -> None:
    libs_a, libs_b = _libraries(fa), _libraries(fb)
    if bool(libs_a) != bool(libs_b):
        ign.append(Ignored("loaded libraries", len(libs_a), len(libs_b),
                           "library scan empty on one side: cannot tell whether they changed"))
        libs_a, libs_b = {}, {}
    for name in sorted(set(libs_a) | set(libs_b)):
        la, lb = libs_a.get(name), libs_b.get(name)
        if (la and (la.version, la.path)) == (lb and (lb.version, lb.path)):
            continue
        explained = None
        if _is_driver_library(name) and causes.driver_changed:
            explained = "NVIDIA driver"
        elif causes.image_changed:
            explained = causes.image_label
        out.append(Change(f"fingerprint:library:{name}", "fingerprint", _lib_show(la),
                          _lib_show(lb), f"loaded library {name}", explained_by=explained))


def _fingerprint_noise(fa: Fingerprint, fb: Fingerprint, ign: list[Ignored]) -> None:
    """Noise: recorded so a reader sees it was looked at."""
    for path, va, vb, why in (
        ("collected_at", fa.raw.get("collected_at"), fb.raw.get("collected_at"), "timestamp"),
        ("host.hostname", fa.host.hostname, fb.host.hostname,
         "container and pod hostnames are random; host identity is judged by kernel, driver "
         "and GPU UUIDs"),
    ):
        if va != vb:
            ign.append(Ignored(f"fingerprint {path}", va, vb, why))
    mem_a, mem_b = _gpu_dynamic(fa), _gpu_dynamic(fb)
    if mem_a != mem_b:
        ign.append(Ignored("GPU memory in use and GPU processes", mem_a, mem_b,
                           "changes from moment to moment; see notes.cluster for other jobs"))


def _gpu_dynamic(fp: Fingerprint) -> list[Any] | None:
    if fp.gpus.source is None:
        return None
    return [{"used": d.memory_used_bytes, "processes": len(d.processes)}
            for d in fp.gpus.devices]


def _gpu_summary(gpus: list[dict[str, Any]] | None) -> str | None:
    if gpus is None:
        return None
    if not gpus:
        return "none"
    parts = []
    for g in gpus:
        uuid = str(g.get("uuid") or "?")
        parts.append(f"{g.get('name') or '?'} {uuid[:12]}")
    return f"{len(gpus)}x [" + ", ".join(parts) + "]"


def _lib_show(lib: Library | None) -> str | None:
    if lib is None:
        return None
    return f"{lib.version or '?'} at {lib.path or '?'}"


# --- command line --------------------------------------------------------------------------

# Flags whose value is noise: a port chosen at random does not change what the server does
# (a port clash shows up as an outcome: category "port").
_NOISE_FLAGS = frozenset({"port"})


def serve_command(argv: Sequence[str]) -> ServeCommand | None:
    """The argv as a :class:`kk3evidence.vllm_args.ServeCommand`, or None when it is not a
    ``vllm serve`` command (then it is compared token by token)."""
    from kk3evidence import vllm_args

    if not argv or not vllm_args.is_vllm_serve(argv):
        return None
    try:
        return vllm_args.parse_serve_argv(list(argv))
    except InputError:
        return None


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def _diff_command(a: Evidence, b: Evidence, out: list[Change], ign: list[Ignored],
                  eq: list[str]) -> None:
    from kk3evidence import vllm_args

    ca, cb = serve_command(a.argv), serve_command(b.argv)
    if ca is None or cb is None:
        if a.argv != b.argv:
            out.append(Change("argv", "command", " ".join(a.argv) or None,
                              " ".join(b.argv) or None, "launch command",
                              detail="not a vllm serve command on at least one side; compared "
                                     "token by token"))
        return
    if ca.program != cb.program:
        eq.append(f"launcher written '{' '.join(ca.program)}' in A and "
                  f"'{' '.join(cb.program)}' in B (the vLLM build is compared in the fingerprint)")
    changes = vllm_args.flag_diff(ca, cb)
    changed = {c.name for c in changes}
    ea, eb = a.engine_config, b.engine_config
    for c in changes:
        same = _same_effective(c.name, ea, eb)
        if same is not None:
            eq.append(f"--{c.name} given differently, but the engine reported "
                      f"{same} in both runs: not a change")
            continue
        if c.name == "model":
            out.append(Change("argv:model", "command", c.a, c.b, "model"))
            continue
        va = None if c.a_default else _plain(c.a)
        vb = None if c.b_default else _plain(c.b)
        if c.name in _NOISE_FLAGS:
            ign.append(Ignored(f"--{c.name}", va, vb,
                               "ports are chosen per run; a clash shows in the outcome"))
            continue
        detail = None
        if c.a_default or c.b_default:
            default = c.a if c.a_default else c.b
            detail = ("unset side uses vLLM's default"
                      + (f" {vllm_args.format_value(default)}" if default is not None
                         else " (decided at start-up)")
                      + (f"; {c.note}" if c.note else ""))
        out.append(Change(f"argv:--{c.name}", "command", va, vb, f"--{c.name}", detail=detail))
    for name in sorted(set(ca.flags) ^ set(cb.flags)):
        if name not in changed:
            side = "A" if name in ca.flags else "B"
            value = (ca.flags if side == "A" else cb.flags)[name]
            shown = vllm_args.format_value(value)
            eq.append(f"--{name} {shown} given in {side} only: that is vLLM's "
                      "default, so both runs use the same value")
    real = [c for c in changes if c.name not in _NOISE_FLAGS]
    if not real and _spelling(a.argv) != _spelling(b.argv):
        eq.append("flags written differently (--x=1 vs --x 1, aliases, order): same meaning to "
                  "vLLM")
    for name in sorted(set(ca.env) | set(cb.env)):
        va, vb = ca.env.get(name), cb.env.get(name)
        if va != vb:
            out.append(Change(f"env:{name}", "env", va, vb, f"env {name}",
                              detail="set on the command line"))


# Flags whose effective value vLLM reports at start (engine_config); unset flags take a
# default decided at start-up, so argv alone cannot tell whether the value changed.
_EFFECTIVE: dict[str, Callable[[EngineConfig], object]] = {
    "enable-prefix-caching": lambda e: e.enable_prefix_caching,
    "no-enable-prefix-caching": lambda e: e.enable_prefix_caching,
    "enable-chunked-prefill": lambda e: e.enable_chunked_prefill,
    "max-model-len": lambda e: e.max_model_len,
    "tensor-parallel-size": lambda e: e.tensor_parallel_size,
}


def _same_effective(name: str, ea: EngineConfig | None, eb: EngineConfig | None) -> str | None:
    """``"enable_prefix_caching=True"`` when both engines reported the same value for the
    flag's setting, else None (unknown on a side, or really different)."""
    get = _EFFECTIVE.get(name)
    if get is None or ea is None or eb is None:
        return None
    va, vb = get(ea), get(eb)
    if va is None or va != vb:
        return None
    return f"{name.removeprefix('no-').replace('-', '_')}={va}"


def _spelling(argv: Sequence[str]) -> list[str]:
    return [str(t) for t in argv if str(t).startswith("-")]


# --- environment ---------------------------------------------------------------------------


def _diff_env(a: Evidence, b: Evidence, out: list[Change], ign: list[Ignored]) -> None:
    ea, eb = a.fingerprint.env, b.fingerprint.env
    for name in sorted(set(ea) | set(eb)):
        va, vb = ea.get(name), eb.get(name)
        # Redacted values compare by placeholder: the same secret gets the same placeholder.
        if va == vb:
            continue
        out.append(Change(f"env:{name}", "env", va, vb, f"env {name}"))


# --- request -------------------------------------------------------------------------------


def _main_request(ev: Evidence) -> Request | None:
    fixed = [r for r in ev.requests if r.kind == "fixed"]
    pool = fixed or list(ev.requests)
    return pool[0] if pool else None


def _input_of(body: Mapping[str, Any]) -> Any:
    if "messages" in body:
        return body.get("messages")
    return body.get("prompt")


def _input_length(body: Mapping[str, Any]) -> int | None:
    inp = _input_of(body)
    if inp is None:
        return None
    if isinstance(inp, str):
        return len(inp)
    total = 0
    if isinstance(inp, list):
        for m in inp:
            content = m.get("content") if isinstance(m, Mapping) else m
            total += len(content) if isinstance(content, str) else len(json.dumps(content))
    return total


def _concurrency(ev: Evidence) -> int | None:
    if not ev.requests:
        return None
    levels = [r.concurrency for r in ev.requests if r.concurrency is not None]
    if levels:
        return max(levels)
    conc = [r for r in ev.requests if r.kind == "concurrency"]
    return len(conc) if conc else 1


def request_signature(ev: Evidence) -> JSONObject:
    """The request variables of a run: endpoint, input, input length, output cap, concurrency."""
    req = _main_request(ev)
    if req is None:
        return {}
    body = req.body
    url = req.url or ""
    sig: dict[str, Any] = {
        "endpoint": f"{req.method or 'POST'} {urlsplit(url).path or url}",
        "input": _input_of(body),
        "input_length": _input_length(body),
        "max_tokens": body.get("max_tokens", body.get("max_completion_tokens")),
        "temperature": body.get("temperature"),
        "concurrency": _concurrency(ev),
        # capture's own probes (--prefix-probe) are measurements, not the operator's request
        "requests": sorted(f"{r.kind}:{r.name}" for r in ev.requests
                           if r.kind != "prefix_probe"),
    }
    known = {"model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature"}
    for k in sorted(body):
        if k not in known:
            sig[f"body.{k}"] = body[k]
    return sig


_REQUEST_LABELS = {
    "endpoint": "request endpoint",
    "input": "request input",
    "max_tokens": "request output cap (max_tokens)",
    "temperature": "request temperature",
    "concurrency": "request concurrency",
    "requests": "requests sent",
}


_LADDER_SHARED = re.compile(r"^shared with ladder step (\d+) \(([^)]*)\)")


def _ladder_request_steps(ev: Evidence) -> list[str]:
    """Request-only ladder steps that ran on this bundle's (reused) server, from its notes."""
    return [f"{m.group(1)} ({m.group(2)})" for n in ev.notes.notes
            if (m := _LADDER_SHARED.match(n))]


def _diff_request(a: Evidence, b: Evidence, out: list[Change], ign: list[Ignored]) -> None:
    sa, sb = request_signature(a), request_signature(b)
    # A ladder step after request-only steps on A's reused server starts from their request:
    # that difference was those steps' variable, not this one's.
    shared = _ladder_request_steps(a)
    reused = (f"ladder request step(s) {', '.join(shared)} on A's server" if shared else None)
    if bool(sa) != bool(sb):
        # A server that never became ready sends nothing: that is the outcome, not a change
        # of the request (the outcome group shows it).
        side = "A" if not sa else "B"
        ign.append(Ignored("requests", "none" if not sa else "sent", "none" if not sb else "sent",
                           f"no request was sent in {side} (the server was not ready); the "
                           "request cannot be compared"))
        return
    for key in sorted(set(sa) | set(sb), key=lambda k: (k.startswith("body."), k)):
        if key == "input_length":
            continue
        va, vb = sa.get(key), sb.get(key)
        if va == vb:
            continue
        detail = None
        if key == "input":
            la, lb = sa.get("input_length"), sb.get("input_length")
            detail = f"input length {la} -> {lb} characters"
            va, vb = _short(va), _short(vb)
        label = _REQUEST_LABELS.get(key, f"request {key}")
        out.append(Change(f"request:{key}", "request", va, vb, label, detail=detail,
                          explained_by=reused))


def _short(v: Any, n: int = 60) -> Any:
    if v is None:
        return None
    s = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
    return s if len(s) <= n else s[: n - 1] + "…"


# --- outcome -------------------------------------------------------------------------------


def outcome_of(ev: Evidence) -> JSONObject:
    ff = ev.first_failure
    req = _main_request(ev)
    return {
        "first_failure": None if ff is None else f"{ff.get('stage')}/{ff.get('category')}",
        "first_failure_rule": None if ff is None else ff.get("rule"),
        "last_stage_reached": ev.last_stage_reached,
        "exit_code": ev.launch.exit_code,
        "request_status": None if req is None else req.status,
    }


_OUTCOME_LABELS = {
    "first_failure": "first failure (stage/category)",
    "first_failure_rule": "first failure rule",
    "last_stage_reached": "last stage reached",
    "exit_code": "exit code",
    "request_status": "fixed request HTTP status",
}


def _diff_outcome(a: Evidence, b: Evidence, out: list[Change], ign: list[Ignored]) -> None:
    oa, ob = outcome_of(a), outcome_of(b)
    for key, label in _OUTCOME_LABELS.items():
        if oa[key] != ob[key]:
            out.append(Change(f"outcome:{key}", "outcome", oa[key], ob[key], label))
    la, lb = a.launch, b.launch
    for key, va, vb, why in (
        ("pid", la.pid, lb.pid, "process ids differ every run"),
        ("started_at", la.started_at, lb.started_at, "timestamp"),
        ("ended_at", la.ended_at, lb.ended_at, "timestamp"),
        ("ready_seconds", la.ready_seconds, lb.ready_seconds,
         "timing varies run to run; speed is not a variable"),
    ):
        if va != vb:
            ign.append(Ignored(f"launch {key}", va, vb, why))
    pa, pb = la.api_port, lb.api_port
    if pa != pb and not any(i.what == "--port" for i in ign):
        ign.append(Ignored("API port", pa, pb, "ports are chosen per run"))


# --- entry points --------------------------------------------------------------------------


def diff_evidence(a: Evidence, b: Evidence) -> DiffResult:
    """Compare two already-loaded runs."""
    changes: list[Change] = []
    ignored: list[Ignored] = []
    eq: list[str] = []
    _diff_fingerprint(a, b, changes, ignored)
    _diff_command(a, b, changes, ignored, eq)
    _diff_env(a, b, changes, ignored)
    _diff_request(a, b, changes, ignored)
    _diff_outcome(a, b, changes, ignored)
    return DiffResult(a.source, b.source, tuple(changes), tuple(ignored), tuple(eq))


def diff(a: Evidence | str | Path, b: Evidence | str | Path) -> DiffResult:
    """Compare two bundles (paths or loaded :class:`Evidence`).

    Raises :class:`kk3evidence.errors.BundleError` when a bundle is unreadable or invalid.
    """
    return diff_evidence(_evidence.coerce(a), _evidence.coerce(b))
