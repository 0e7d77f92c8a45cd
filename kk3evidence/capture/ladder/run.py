"""``ladder``: run a plan one step at a time and stop at the first step that changes the outcome.

Each step runs through capture (one bundle per server start) with the step's request; its
outcome — did the API get ready, the first failure (stage/category) of the start or of the
step's own requests, the request statuses — is compared with the last stable step. The first
step whose outcome differs stops the ladder: "step k (variable X: A → B) changes the outcome
from … to …", with its bundle and the last stable baseline to revert to (the guide: when the
error changes, go back to the last stable baseline before fixing anything).

Consecutive steps with the same command (request-only steps) share one server: the first
step's request is sent by capture (so it is in the bundle), later steps' requests are sent by
the ladder on the same server and recorded under ``DIR/step-NN/requests/``. This saves one
engine start per request-only step (25-45 s on the CPU build; minutes for Kimi-K3).

The state lives in ``DIR/ladder-state.json``; running the same plan into the same DIR again
skips the steps already done whose bundle still validates.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, Required, TypedDict

from kk3evidence.analysis.engine import analyze
from kk3evidence.analysis.progress import MilestoneWatcher
from kk3evidence.bundle.archive import validate
from kk3evidence.bundle.schema import load_toml
from kk3evidence.capture import identity
from kk3evidence.capture.ladder.fit import Fit, count_tokens, fit_prompt
from kk3evidence.errors import InputError, Kk3Error, UsageError
from kk3evidence.handoff import prompts
from kk3evidence.handoff.diff import diff
from kk3evidence.handoff.minimize import PLAN_SCHEMA, PlanStep, RequestSpec, step_variables
from kk3evidence.model import (
    FORMAT_IDS,
    JSONObject,
    JSONValue,
    json_int,
    json_list,
    json_object,
    json_str,
)

if TYPE_CHECKING:
    from kk3evidence.capture.http import ApiTarget
    from kk3evidence.capture.run import CaptureOptions, CaptureResult

__all__ = [
    "LADDER_STATE_SCHEMA",
    "LadderEvents",
    "LadderResult",
    "NoProgress",
    "Outcome",
    "Plan",
    "StepRecord",
    "load_plan",
    "request_body",
    "run_ladder",
]

LADDER_STATE_SCHEMA = FORMAT_IDS["ladder-state"]
STATE_FILE = "ladder-state.json"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    },
}


# --------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    steps: tuple[PlanStep, ...]
    meta: Mapping[str, Any]
    sha256: str
    source: str

    def step(self, i: int) -> PlanStep:
        return self.steps[i]


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan (TOML); :class:`InputError` (exit 4) says what is wrong where."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise InputError(f"{p}: cannot read the plan ({exc.strerror})") from None
    return parse_plan(data, str(p))


def parse_plan(data: bytes | str, source: str = "plan") -> Plan:
    raw = data.encode("utf-8") if isinstance(data, str) else data
    # (a plan is written by 'kk3evidence minimize'; the schema says what a hand-written one needs)
    doc: dict[str, Any] = load_toml(
        raw, source, error=InputError, schema="ladder-plan", schema_id=PLAN_SCHEMA
    )
    defaults = RequestSpec.from_json((doc.get("plan") or {}).get("request") or {})
    steps: list[PlanStep] = []
    for i, s in enumerate(doc["step"]):
        if s["id"] != i:
            raise InputError(f"{source}: $.step[{i}].id is {s['id']}, expected {i} (in order)")
        steps.append(
            PlanStep(
                id=i,
                variable=s["variable"],
                from_=s.get("from", ""),
                to=s.get("to", ""),
                argv=tuple(s["argv"]),
                request=RequestSpec.from_json(s.get("request") or {}, defaults),
                why=s.get("why", ""),
                env=dict(s.get("env") or {}),
                kind=s.get("kind", "argv" if i else "baseline"),
            )
        )
    _one_variable_each(steps, source)
    return Plan(tuple(steps), dict(doc.get("plan") or {}), hashlib.sha256(raw).hexdigest(), source)


def _one_variable_each(steps: Sequence[PlanStep], source: str) -> None:
    """Refuse a step that changes more than one variable against the step before it (the
    seed's rule; a hand-edited plan is checked like a generated one, --dry-run included)."""
    for prev, step in itertools.pairwise(steps):
        changed = step_variables(prev, step)
        if len(changed) > 1:
            raise InputError(
                f"{source}: $.step[{step.id}] ({step.variable}) changes {len(changed)} variables "
                f"against step {prev.id}: {', '.join(changed)}; split it into one step per "
                "variable")


#: plan variables whose bundle must carry capture's prefix-cache probe and its four checks
PREFIX_VARIABLES = frozenset({"prefix-caching", "prefix-probe"})

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_env_refs(text: str, env: Mapping[str, str], where: str) -> str:
    """``${NAME}`` -> the value of NAME (secrets stay out of the plan file)."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in env:
            raise UsageError(f"{where} uses ${{{name}}}: set {name} in the environment first")
        return env[name]

    return _ENV_REF.sub(sub, text)


# --------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------


long_prompt = prompts.long_prompt  # the one generator (handoff.prompts); kept as a name here


def request_body(spec: RequestSpec, model: str | None) -> JSONObject:
    content = long_prompt(spec.input_tokens) if spec.input_tokens else spec.prompt
    body: dict[str, Any] = {
        "model": spec.model or model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": spec.max_tokens,
        "temperature": spec.temperature,
    }
    if spec.tools:
        body["tools"] = [WEATHER_TOOL]
        body["tool_choice"] = "auto"
    return body


def _status_class(status: int | None, error: str | None) -> str:
    if status is None:
        return "no answer"
    if 200 <= status < 300:
        return "HTTP 2xx"
    return f"HTTP {status}"


# --------------------------------------------------------------------------------------------
# Outcomes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a step led to. Two outcomes are the same when ``key()`` is equal."""

    ready: bool
    failure_stage: str | None = None
    failure_category: str | None = None
    failure_rule: str | None = None
    failure_text: str | None = None
    requests: tuple[str, ...] = ()  # sorted distinct classes: "HTTP 2xx", "HTTP 400", ...
    exit_status: int | None = None

    def key(self) -> tuple[bool, str | None, str | None, tuple[str, ...]]:
        return (self.ready, self.failure_stage, self.failure_category, self.requests)

    @property
    def healthy(self) -> bool:
        return self.ready and self.failure_stage is None and self.requests == ("HTTP 2xx",)

    def describe(self) -> str:
        if not self.ready:
            where = (
                f"fails at {self.failure_stage} ({self.failure_category}, rule {self.failure_rule})"
                if self.failure_stage
                else "never gets ready (no failure line recognised)"
            )
            return f"start {where}"
        parts = ["ready"]
        if self.requests:
            parts.append("requests " + " + ".join(self.requests))
        if self.failure_stage:
            parts.append(
                f"failure at {self.failure_stage} ({self.failure_category}, "
                f"rule {self.failure_rule})"
            )
        return ", ".join(parts)

    def to_json(self) -> JSONObject:
        return {
            "ready": self.ready,
            "failure": None
            if self.failure_stage is None
            else {
                "stage": self.failure_stage,
                "category": self.failure_category,
                "rule": self.failure_rule,
                "text": self.failure_text,
            },
            "requests": list(self.requests),
            "exit_status": self.exit_status,
            "summary": self.describe(),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, JSONValue]) -> Outcome:
        f = json_object(obj.get("failure")) or {}
        return cls(
            ready=bool(obj.get("ready")),
            failure_stage=json_str(f.get("stage")),
            failure_category=json_str(f.get("category")),
            failure_rule=json_str(f.get("rule")),
            failure_text=json_str(f.get("text")),
            requests=tuple(str(r) for r in json_list(obj.get("requests"))),
            exit_status=json_int(obj.get("exit_status")),
        )


class StepRun(TypedDict, total=False):
    """What the runner hands back for one step that ran, before it becomes a StepRecord."""

    outcome: Required[Outcome]
    bundle: Path | None  # set for every step of the group once capture has sealed it
    requests_dir: str | None
    summaries: tuple[str, ...]
    shares_server_with: int | None
    interrupted: bool


@dataclass(frozen=True, slots=True)
class StepRecord:
    id: int
    variable: str
    outcome: Outcome
    bundle: str | None  # relative to the ladder folder
    shares_server_with: int | None  # the step whose server (and bundle) this step reused
    requests_dir: str | None
    started_at: str
    seconds: float
    request_summaries: tuple[str, ...] = ()

    def to_json(self) -> JSONObject:
        return {
            "id": self.id,
            "variable": self.variable,
            "status": "done",
            "outcome": self.outcome.to_json(),
            "bundle": self.bundle,
            "shares_server_with": self.shares_server_with,
            "requests_dir": self.requests_dir,
            "started_at": self.started_at,
            "seconds": round(self.seconds, 3),
            "request_summaries": list(self.request_summaries),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, JSONValue]) -> StepRecord:
        o: Mapping[str, Any] = obj  # ladder.json as this module wrote it; values as stored
        return cls(
            id=int(o["id"]),
            variable=str(o["variable"]),
            outcome=Outcome.from_json(o["outcome"]),
            bundle=o.get("bundle"),
            shares_server_with=o.get("shares_server_with"),
            requests_dir=o.get("requests_dir"),
            started_at=str(o.get("started_at", "")),
            seconds=float(o.get("seconds", 0.0)),
            request_summaries=tuple(o.get("request_summaries") or ()),
        )


@dataclass(frozen=True, slots=True)
class LadderResult:
    records: tuple[StepRecord, ...]
    verdict: str  # "stable" | "changed" | "baseline-fails"
    changed: int | None  # the step that changed the outcome
    last_stable: int | None
    message: str
    skipped: tuple[int, ...] = ()  # steps resumed from the state file
    diff_summary: str | None = None  # kk3evidence diff between the two bundles, when separate

    @property
    def exit_code(self) -> int:
        return 0 if self.verdict == "stable" else 3

    def to_json(self) -> JSONObject:
        return {
            "schema": FORMAT_IDS["ladder-result"],
            "verdict": self.verdict,
            "changed_step": self.changed,
            "last_stable_step": self.last_stable,
            "message": self.message,
            "resumed_steps": list(self.skipped),
            "bundle_diff": self.diff_summary,
            "steps": [r.to_json() for r in self.records],
        }


# --------------------------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------------------------

class LadderEvents(Protocol):
    """What the ladder reports while it runs; the CLI draws it (cli/_ladder.py), tests ignore it.

    ``begin`` when a server starts for a group of steps, ``set_stage`` as its start-up or the
    steps move on, ``say`` for one-line events, ``end`` when the server is gone."""

    def begin(self, prefix: str) -> None: ...

    def set_stage(self, stage: str) -> None: ...

    def say(self, text: str) -> None: ...

    def end(self) -> None: ...

    def server_output(self, data: bytes) -> None:
        """The server's raw output, with ``verbose`` only (the CLI passes it on to stderr)."""


class NoProgress:
    """:class:`LadderEvents` that shows nothing (library use, tests, ``--quiet``)."""

    def begin(self, prefix: str) -> None:
        pass

    def set_stage(self, stage: str) -> None:
        pass

    def say(self, text: str) -> None:
        pass

    def end(self) -> None:
        pass

    def server_output(self, data: bytes) -> None:
        pass


# --------------------------------------------------------------------------------------------
# Running one server (one capture) for a group of steps
# --------------------------------------------------------------------------------------------


class _Tee:
    """Receives the server's raw output: keeps the lines (for per-step windows), writes a
    console copy, and feeds the progress display."""

    def __init__(
        self,
        console: Any,
        progress: LadderEvents,
        passthrough: Callable[[bytes], None] | None = None,
    ) -> None:
        self.console = console
        self.progress = progress
        self.passthrough = passthrough
        self.lock = threading.Lock()
        self.lines: list[bytes] = []
        self._partial = b""
        # the analysis milestone rules (rules/milestones.toml), as capture's watchdog uses them
        self._milestones = MilestoneWatcher()

    def __call__(self, data: bytes) -> None:
        with self.lock:
            with contextlib.suppress(OSError, ValueError):
                self.console.write(data)
                self.console.flush()
            chunk = self._partial + data
            parts = chunk.split(b"\n")
            self._partial = parts.pop()
            self.lines.extend(parts)
            seen = self._milestones.feed(data, time.monotonic())
        if self.passthrough is not None:
            with contextlib.suppress(OSError, ValueError):
                self.passthrough(data)
        for m in seen:
            if m.marks != "shutdown":  # a requested shutdown is not a stage
                self.progress.set_stage(m.stage)

    def mark(self) -> int:
        with self.lock:
            return len(self.lines)

    def window(self, start: int, end: int | None = None) -> list[bytes]:
        with self.lock:
            return list(self.lines[start:end])


def _window_failure(lines: Sequence[bytes]) -> dict[str, Any] | None:
    """The first causal failure among ``lines``."""
    if not lines:
        return None
    try:
        result = analyze([ln + b"\n" for ln in lines], label="ladder-step-window")
    except InputError:
        return None
    ff = result.first_failure
    if ff is None:
        return None
    return {"stage": ff.stage, "category": ff.category, "rule": ff.rule, "text": ff.text}


_REQ_LINE = re.compile(r"^request (?P<name>\S+): (?:HTTP (?P<status>\d+)|no answer)")


@dataclass
class _GroupRun:
    """Shared state of one server start between the capture (main thread) and the driver."""

    steps: list[PlanStep]
    argv: list[str]
    env: dict[str, str]
    bundle: Path
    staging: Path
    tee: _Tee
    capture_requests: int  # how many requests capture itself sends (the first step's)
    request_file: Path | None = None  # the first step's request, for capture --request
    seen_requests: list[tuple[str, int | None]] = field(default_factory=list)
    requests_done: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    stop_requested: bool = False
    records: list[tuple[PlanStep, StepRun]] = field(default_factory=list)
    ready: bool = False
    served_model: str | None = None
    user_interrupted: bool = False


@dataclass(frozen=True, slots=True)
class _Api:
    """The step server's API once it answers: where, what to send, what to record."""

    target: ApiTarget
    headers: Mapping[str, str]
    shown: Mapping[str, str]
    served_model: str | None


class CaptureRunner:
    """Runs a group of steps that share one command through :func:`capture.run_capture`."""

    def __init__(
        self,
        out_dir: Path,
        progress: LadderEvents,
        *,
        ready_timeout: float = 1800.0,
        request_timeout: float = 600.0,
        verbose: bool = False,
    ) -> None:
        self.out_dir = out_dir
        self.progress = progress
        self.ready_timeout = ready_timeout
        self.request_timeout = request_timeout
        self.verbose = verbose

    def run_group(
        self,
        steps: list[PlanStep],
        argv: list[str],
        env: dict[str, str],
        on_step: Callable[[PlanStep, StepRun], bool],
        total: int,
    ) -> list[tuple[PlanStep, StepRun]]:
        """Start the steps' server through capture, drive their requests from a thread, and
        return one raw record per step that ran."""
        from kk3evidence.capture import run as capture

        group, console = self._new_group(steps, argv, env)
        opts = self._capture_options(group, total)
        ids = ", ".join(str(s.id) for s in steps)
        self.progress.begin(f"step {ids}/{total - 1} {steps[0].variable}")
        driver = threading.Thread(
            target=self._drive, args=(group, on_step), name="kk3-ladder-driver", daemon=True
        )
        driver.start()
        try:
            result = capture.run_capture(
                opts, out=group.tee, err=group.tee, say=self._capture_say(group)
            )
        finally:
            group.finished.set()
            group.requests_done.set()
            driver.join(self.request_timeout + 120)
            console.close()
            self.progress.end()
        return self._group_records(group, result, on_step)

    def _new_group(
        self, steps: list[PlanStep], argv: list[str], env: dict[str, str]
    ) -> tuple[_GroupRun, BinaryIO]:
        """A clean bundle path and staging folder, the console log and the first step's
        request file for capture; the caller closes the console log."""
        first = steps[0]
        tag = f"step-{first.id:02d}"
        bundle = self.out_dir / f"{tag}.tar"
        staging = self.out_dir / f".{tag}.staging"
        if staging.exists():  # an interrupted earlier attempt of ours: start that step again
            shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            bundle.unlink()
        console = (self.out_dir / f"{tag}.console.log").open("wb")
        tee = _Tee(console, self.progress, self.progress.server_output if self.verbose else None)
        capture_requests = first.request.repeat if first.request.concurrency == 1 else 0
        request_file: Path | None = None
        if capture_requests:
            request_file = self.out_dir / f"{tag}.request.json"
            request_file.write_text(
                json.dumps(request_body(first.request, None), ensure_ascii=False, indent=1),
                encoding="utf-8",
            )
        group = _GroupRun(
            steps=steps,
            argv=argv,
            env=env,
            bundle=bundle,
            staging=staging,
            tee=tee,
            capture_requests=capture_requests,
            request_file=request_file,
        )
        return group, console

    def _capture_options(self, group: _GroupRun, total: int) -> CaptureOptions:
        from kk3evidence.capture import run as capture

        steps, first = group.steps, group.steps[0]
        changes: list[str] = []
        change = f"{first.variable}={first.from_ or 'absent'}->{first.to or '?'}"
        with contextlib.suppress(Exception):
            capture.parse_change(change)
            changes.append(change)
        return capture.CaptureOptions(
            argv=tuple(group.argv),
            output=group.bundle,
            staging=group.staging,
            notes=(
                f"kk3evidence ladder step {first.id}/{total - 1}: {first.variable} "
                f"({first.from_} -> {first.to})",
                *(f"shared with ladder step {s.id} ({s.variable})" for s in steps[1:]),
            ),
            changes=tuple(changes),
            probe=True,
            # the prefix steps record the four prefix checks (probes/prefix_probe.json)
            prefix_probe=any(s.variable in PREFIX_VARIABLES for s in steps),
            ready_timeout=self.ready_timeout,
            request_file=group.request_file,
            repeat=max(1, group.capture_requests),
            stop_after_request=False,
            request_timeout=self.request_timeout,
            extra_env=group.env,
        )

    def _capture_say(self, group: _GroupRun) -> Callable[[str], None]:
        """capture's messages: its request lines tell the driver when the first step's
        requests are done; with ``verbose`` they are shown."""

        def say(text: str) -> None:
            m = _REQ_LINE.match(text)
            if m and m.group("name").startswith("fixed-"):
                status = int(m.group("status")) if m.group("status") else None
                group.seen_requests.append((m.group("name"), status))
                if len(group.seen_requests) >= group.capture_requests:
                    group.requests_done.set()
            if self.verbose:
                self.progress.say(text)

        return say

    def _group_records(
        self,
        group: _GroupRun,
        result: CaptureResult,
        on_step: Callable[[PlanStep, StepRun], bool],
    ) -> list[tuple[PlanStep, StepRun]]:
        """The driver's records, or one for the first step when the server never got ready."""
        first = group.steps[0]
        launch: dict[str, Any] = {}
        if result.bundle is not None:
            with contextlib.suppress(Exception):
                from kk3evidence.bundle.archive import open_bundle

                with open_bundle(result.bundle) as b:
                    launch = dict(b.launch or {})
        if launch.get("interrupted_by") and not group.stop_requested:
            group.user_interrupted = True
        if not group.ready:
            # The start failed (or never got ready): one record for the first step.
            ff = result.first_failure or {}
            group.records = [
                (
                    first,
                    {
                        "outcome": Outcome(
                            ready=False,
                            failure_stage=ff.get("stage"),
                            failure_category=ff.get("category"),
                            failure_rule=ff.get("rule"),
                            failure_text=ff.get("text"),
                            requests=(),
                            exit_status=result.exit_status,
                        ),
                        "bundle": result.bundle,
                        "requests_dir": None,
                        "summaries": (),
                    },
                )
            ]
            if not group.user_interrupted:
                on_step(first, group.records[0][1])
        for _, rec in group.records:
            rec["bundle"] = result.bundle
            rec["interrupted"] = group.user_interrupted
        return group.records

    # -- the driver thread: readiness, each step's requests, then stopping the server --------
    def _drive(self, group: _GroupRun, on_step: Callable[[PlanStep, StepRun], bool]) -> None:
        api = self._wait_ready(group)
        if api is None:
            return
        group.ready = True
        group.served_model = api.served_model
        for idx, step in enumerate(group.steps):
            if group.finished.is_set():
                break
            record = self._run_step(group, idx, step, api)
            group.records.append((step, record))
            if not on_step(step, record):
                break
        # capture reads /metrics right after its own requests: let it finish before stopping
        after = group.staging / "metrics" / "after.prom"
        deadline = time.monotonic() + 20.0
        while group.capture_requests and not after.exists() and time.monotonic() < deadline:
            if group.finished.wait(0.2):
                break
        self._stop_server(group)

    def _wait_ready(self, group: _GroupRun) -> _Api | None:
        """Poll the step's server until its API answers; None if it never does."""
        from kk3evidence.capture import http as probe

        target = probe.api_target(group.argv, group.env)
        headers = {"Content-Type": "application/json"}
        if target.api_key:
            headers["Authorization"] = f"Bearer {target.api_key}"
        shown = {
            k: ("Bearer <redacted>" if k == "Authorization" else v) for k, v in headers.items()
        }
        started = time.monotonic()
        with probe.make_client() as client:
            rd = probe.wait_ready(
                client,
                target,
                started_mono=started,
                timeout=self.ready_timeout,
                alive=lambda: not group.finished.is_set(),
                stop=threading.Event(),
                headers={k: v for k, v in headers.items() if k == "Authorization"},
                # never a stale server on the step's port: only the step's own command counts
                verify=identity.verifier(target.host, target.port,
                                         lambda: _launched_pid(group.staging),
                                         identity.expected_models(_serve_of(group.argv))),
            )
        if not rd.ready:
            return None
        return _Api(target, headers, shown, rd.served_model)

    def _run_step(self, group: _GroupRun, idx: int, step: PlanStep, api: _Api) -> StepRun:
        """One step's requests on the running server and the outcome of its log window."""
        self.progress.set_stage(f"requests of step {step.id} ({step.request.describe()})")
        start_line = group.tee.mark()
        summaries: list[str] = []
        classes: list[str] = []
        requests_dir: str | None = None
        if idx == 0 and group.capture_requests:
            group.requests_done.wait(self.request_timeout * group.capture_requests + 60)
            for name, status in group.seen_requests:
                classes.append(_status_class(status, None))
                summaries.append(f"{name}: {'HTTP ' + str(status) if status else 'no answer'}")
            if len(group.seen_requests) < group.capture_requests:
                classes.append("no answer")
        else:
            recs = self._send(step, api.target, api.headers, api.shown, api.served_model)
            self._save_metrics(step, api.target, api.headers)
            requests_dir = f"step-{step.id:02d}/requests"
            for r in recs:
                classes.append(_status_class(r.get("status"), r.get("error")))
                summaries.append(
                    f"{r['name']}: "
                    + (f"HTTP {r['status']}" if r.get("status") else "no answer")
                    + (f" ({r['error']})" if r.get("error") else "")
                )
        # The server logs a request's outcome right after answering it; give those lines a
        # moment to arrive before the step's log window is analysed.
        group.finished.wait(0.5)
        ff = _window_failure(group.tee.window(start_line))
        return {
            "outcome": Outcome(
                ready=True,
                failure_stage=ff["stage"] if ff else None,
                failure_category=ff["category"] if ff else None,
                failure_rule=ff["rule"] if ff else None,
                failure_text=ff["text"] if ff else None,
                requests=tuple(sorted(set(classes))),
            ),
            "requests_dir": requests_dir,
            "summaries": tuple(summaries),
            "shares_server_with": group.steps[0].id if idx else None,
        }

    def _save_metrics(self, step: PlanStep, target: Any, headers: Mapping[str, str]) -> None:
        """``/metrics`` after a step that ran on a reused server (prefix-cache counters etc.)."""
        from kk3evidence.capture import http as probe

        auth = {k: v for k, v in headers.items() if k == "Authorization"}
        with probe.make_client() as client:
            text, _err = probe.fetch_metrics(client, target, auth)
        if text is not None:
            folder = self.out_dir / f"step-{step.id:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "metrics-after.prom").write_text(text, encoding="utf-8")

    def _send(
        self,
        step: PlanStep,
        target: Any,
        headers: Mapping[str, str],
        shown: Mapping[str, str],
        served: str | None,
    ) -> list[dict[str, Any]]:
        import httpx

        from kk3evidence.capture import http as probe

        spec = step.request
        body = request_body(spec, served)
        fitted = None
        if spec.input_tokens:
            body, fitted = self._fit(step, target, headers, served)
        url = target.base_url + "/v1/chat/completions"
        folder = self.out_dir / f"step-{step.id:02d}" / "requests"
        folder.mkdir(parents=True, exist_ok=True)
        kind = "concurrency" if spec.concurrency > 1 else "custom"
        records: list[dict[str, Any]] = []
        limits = httpx.Limits(max_connections=max(10, spec.concurrency))
        with httpx.Client(timeout=self.request_timeout, trust_env=False, limits=limits) as client:
            for rep in range(1, spec.repeat + 1):

                def one(n: int, rep: int = rep) -> dict[str, Any]:
                    return probe.send_request(
                        client,
                        name=f"step{step.id:02d}-r{rep}-{n:04d}",
                        kind=kind,
                        url=url,
                        body=body,
                        headers=headers,
                        shown_headers=shown,
                        timeout=self.request_timeout,
                    )

                if spec.concurrency == 1:
                    records.append(one(1))
                else:
                    with ThreadPoolExecutor(max_workers=min(spec.concurrency, 512)) as pool:
                        records.extend(pool.map(one, range(1, spec.concurrency + 1)))
        if fitted is not None:
            (folder.parent / "fit.json").write_text(json.dumps(fitted.to_json()), encoding="utf-8")
            self.progress.say(f"step {step.id}: {fitted.note}")
        for rec in records:
            slim = dict(rec)
            if isinstance(slim.get("request_body"), dict) and spec.input_tokens:
                # the long prompt is regenerated from the plan; keep the record small
                slim["request_body"] = {**slim["request_body"], "messages": "<long prompt>"}
            (folder / f"{rec['name']}.json").write_text(
                json.dumps(slim, ensure_ascii=False, indent=1), encoding="utf-8"
            )
        return records

    def _fit(self, step: PlanStep, target: Any, headers: Mapping[str, str],
             served: str | None) -> tuple[dict[str, Any], Fit]:
        """The step's long prompt, counted with the server's /tokenize and trimmed to fit."""
        import httpx

        spec = step.request
        with httpx.Client(timeout=30.0, trust_env=False) as client:
            return fit_prompt(
                spec.input_tokens,
                lambda n: request_body(replace(spec, input_tokens=n), served),
                lambda body: count_tokens(client, target.base_url, headers, body),
                max_tokens=spec.max_tokens, context=None, variable=step.variable)

    def _stop_server(self, group: _GroupRun) -> None:
        if group.finished.is_set():
            return
        group.stop_requested = True
        self.progress.set_stage("stopping the server")
        pid: int | None = None
        with contextlib.suppress(OSError, ValueError):
            launch = json.loads((group.staging / "launch.json").read_text(encoding="utf-8"))
            pid = launch.get("pid")
        if not isinstance(pid, int):
            return
        for sig, wait in ((signal.SIGINT, 60.0), (signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                return
            if group.finished.wait(wait):
                return


# --------------------------------------------------------------------------------------------
# The ladder
# --------------------------------------------------------------------------------------------


def _prefix_checks(out: Path, bundle_rel: str | None) -> tuple[str, ...]:
    """The four prefix checks capture's probe recorded in a prefix step's bundle."""
    if bundle_rel is None:
        return ()
    from kk3evidence.bundle.archive import open_bundle
    from kk3evidence.errors import BundleError

    try:
        with open_bundle(out / bundle_rel) as b:
            if not b.has("probes/prefix_probe.json"):
                return ("prefix checks: not recorded (the probe did not run)",)
            probe = json.loads(b.read_bytes("probes/prefix_probe.json"))
    except (BundleError, InputError, OSError, ValueError):
        return ()
    return tuple(f"prefix check {c.get('id')}: {c.get('status')}"
                 for c in probe.get("checks") or [] if isinstance(c, dict))


def _launched_pid(staging: Path) -> int | None:
    """The pid capture recorded for the step's command (launch.json in its staging folder)."""
    with contextlib.suppress(OSError, ValueError):
        pid = json.loads((staging / "launch.json").read_text(encoding="utf-8")).get("pid")
        return pid if isinstance(pid, int) and pid > 0 else None
    return None


def _serve_of(argv: Sequence[str]) -> Any:
    from kk3evidence import vllm_args

    try:
        return vllm_args.parse_serve_argv(list(argv))
    except InputError:
        return None


def _state_path(out_dir: Path) -> Path:
    return out_dir / STATE_FILE


def _load_state(out_dir: Path, plan: Plan) -> dict[str, Any]:
    path = _state_path(out_dir)
    if not path.exists():
        return {"schema": LADDER_STATE_SCHEMA, "plan_sha256": plan.sha256, "steps": {}}
    try:
        state: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(
            f"{path}: unreadable ladder state ({exc}); remove it to start over"
        ) from None
    if state.get("schema") != LADDER_STATE_SCHEMA:
        raise InputError(f"{path}: not a {LADDER_STATE_SCHEMA} file; remove it to start over")
    if state.get("plan_sha256") != plan.sha256:
        raise UsageError(
            f"{out_dir} holds a ladder of another plan (the plan changed since); "
            "use another -o DIR, or --fresh to start this one over"
        )
    return state


def _save_state(out_dir: Path, state: Mapping[str, Any]) -> None:
    path = _state_path(out_dir)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=1, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)


def _bundle_ok(out_dir: Path, rel: str | None) -> bool:
    if rel is None:
        return False
    path = out_dir / rel
    if not path.is_file():
        return False
    return not validate(path)


def _expand(step: PlanStep, env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    where = f"step {step.id}"
    argv = [expand_env_refs(a, env, where) for a in step.argv]
    senv = {k: expand_env_refs(v, env, where) for k, v in step.env.items()}
    return argv, senv


def _rel(out_dir: Path, p: Path | str | None) -> str | None:
    if p is None:
        return None
    path = Path(p)
    try:
        return str(path.relative_to(out_dir))
    except ValueError:
        return str(path)


def describe_change(step: PlanStep, before: Outcome, after: Outcome) -> str:
    return (
        f"step {step.id} (variable {step.variable}: {step.from_ or 'absent'} → {step.to}) "
        f"changes the outcome from {before.describe()} to {after.describe()}"
    )


class _Judge:
    """Compares each step's outcome with the last stable step's; keeps the verdict."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.baseline: StepRecord | None = None
        self.last_stable: StepRecord | None = None
        self.verdict: str | None = None
        self.message = ""

    def __call__(self, rec: StepRecord) -> str | None:
        """None when the ladder goes on; else the verdict."""
        self.verdict = self._judge(rec)
        return self.verdict

    def _judge(self, rec: StepRecord) -> str | None:
        step = self.plan.steps[rec.id]
        if self.baseline is None:
            self.baseline = rec
            if not rec.outcome.healthy:
                self.message = (
                    f"the baseline (step {rec.id}, the minimal command with the fixed request) "
                    f"does not work: {rec.outcome.describe()}; fix the start before restoring "
                    "features (kk3evidence analyze on its bundle shows the first failure)"
                )
                return "baseline-fails"
            self.last_stable = rec
            return None
        assert self.last_stable is not None
        if rec.outcome.key() != self.last_stable.outcome.key():
            self.message = describe_change(step, self.last_stable.outcome, rec.outcome)
            return "changed"
        self.last_stable = rec
        return None


@dataclass(frozen=True, slots=True)
class _Ladder:
    """One ladder run's fixed context, passed to its steps."""

    plan: Plan
    out: Path
    env: Mapping[str, str]
    state: dict[str, Any]
    done: dict[str, Any]  # state["steps"]: the finished steps by id
    progress: LadderEvents
    runner: CaptureRunner
    reuse_server: bool


def run_ladder(
    plan: Plan,
    out_dir: str | Path,
    *,
    progress: LadderEvents | None = None,
    runner: CaptureRunner | None = None,
    fresh: bool = False,
    reuse_server: bool = True,
    ready_timeout: float = 1800.0,
    request_timeout: float = 600.0,
    verbose: bool = False,
    environ: Mapping[str, str] | None = None,
) -> LadderResult:
    """Run ``plan`` into ``out_dir`` (resuming what is done there); see the module docstring."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env_src = dict(os.environ if environ is None else environ)
    for name in plan.meta.get("env_required") or ():
        if name not in env_src:
            raise UsageError(f"the plan needs ${{{name}}}: set {name} in the environment first")
    if fresh and _state_path(out).exists():
        _state_path(out).unlink()
    state = _load_state(out, plan)
    state["plan"] = plan.source
    progress = progress or NoProgress()
    runner = runner or CaptureRunner(
        out, progress, ready_timeout=ready_timeout, request_timeout=request_timeout, verbose=verbose
    )
    done: dict[str, Any] = state.setdefault("steps", {})
    lad = _Ladder(plan, out, env_src, state, done, progress, runner, reuse_server)
    judge = _Judge(plan)
    records: list[StepRecord] = []
    skipped: list[int] = []
    n = len(plan.steps)
    i = 0
    while i < n and judge.verdict is None:
        prev = done.get(str(i))
        if prev is not None and _bundle_ok(out, prev.get("bundle")):
            rec = StepRecord.from_json(prev)
            records.append(rec)
            skipped.append(i)
            progress.say(
                f"step {i}/{n - 1} {rec.variable}: done earlier ({rec.outcome.describe()})"
            )
            judge(rec)
            i += 1
            continue
        i = _run_steps_from(lad, judge, i, records)
    return _conclude(lad, judge, records, skipped)


def _run_steps_from(lad: _Ladder, judge: _Judge, i: int, records: list[StepRecord]) -> int:
    """Run step ``i`` and the request-only steps after it on one server; returns the next step."""
    plan, n = lad.plan, len(lad.plan.steps)
    first = plan.steps[i]
    argv, senv = _expand(first, lad.env)
    group = [first]
    j = i + 1
    while lad.reuse_server and j < n:
        nxt = plan.steps[j]
        if str(j) in lad.done or _expand(nxt, lad.env) != (argv, senv):
            break
        group.append(nxt)
        j += 1
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    t0 = time.monotonic()
    new_records: list[StepRecord] = []

    def on_step(step: PlanStep, raw: StepRun) -> bool:
        rec = StepRecord(
            id=step.id,
            variable=step.variable,
            outcome=raw["outcome"],
            bundle=None,
            shares_server_with=raw.get("shares_server_with"),
            requests_dir=raw.get("requests_dir"),
            started_at=started_at,
            seconds=time.monotonic() - t0,
            request_summaries=tuple(raw.get("summaries") or ()),
        )
        new_records.append(rec)
        lad.progress.say(f"step {step.id}/{n - 1} {step.variable}: {rec.outcome.describe()}")
        return judge(rec) is None

    raw_records = lad.runner.run_group(group, argv, senv, on_step, n)
    _keep_records(lad, raw_records, new_records, records)
    if not new_records:
        raise InputError(f"step {i} produced no result; see {lad.out}/step-{i:02d}.console.log")
    return new_records[-1].id + 1


def _keep_records(
    lad: _Ladder,
    raw_records: Sequence[tuple[PlanStep, StepRun]],
    new_records: Sequence[StepRecord],
    records: list[StepRecord],
) -> None:
    """The group's records with their bundle, into ``records`` and (unless interrupted) the
    state file; an interrupted group raises KeyboardInterrupt once the state is saved."""
    out = lad.out
    interrupted = any(r.get("interrupted") for _, r in raw_records)
    bundle_rel = _rel(out, raw_records[0][1].get("bundle")) if raw_records else None
    for rec in new_records:
        final = replace(
            rec,
            bundle=bundle_rel,
            request_summaries=rec.request_summaries + (
                _prefix_checks(out, bundle_rel) if rec.variable in PREFIX_VARIABLES
                and rec.shares_server_with is None else ()),
        )
        records.append(final)
        if not interrupted and bundle_rel is not None:
            lad.done[str(rec.id)] = final.to_json()
    _save_state(out, lad.state)
    if interrupted:
        raise KeyboardInterrupt


def _conclude(
    lad: _Ladder, judge: _Judge, records: list[StepRecord], skipped: list[int]
) -> LadderResult:
    """The verdict (stable when no step changed anything), saved in the state file."""
    n, out, last_stable = len(lad.plan.steps), lad.out, judge.last_stable
    verdict, message = judge.verdict, judge.message
    if verdict is None:
        verdict = "stable"
        outcome = records[0].outcome.describe()
        message = (
            f"all {n} steps keep the outcome of the baseline ({outcome})"
            if n > 1
            else f"the baseline works ({outcome}); the plan has no further step"
        )
    diff_summary: str | None = None
    if verdict == "changed" and last_stable is not None:
        stable_bundle = next((r.bundle for r in records if r.id == last_stable.id), None)
        diff_summary = _bundle_diff(out, stable_bundle, records[-1].bundle)
    lad.state["result"] = {
        "verdict": verdict,
        "message": message,
        "changed_step": records[-1].id if verdict == "changed" else None,
        "last_stable_step": last_stable.id if last_stable else None,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    _save_state(out, lad.state)
    return LadderResult(
        records=tuple(records),
        verdict=verdict,
        changed=records[-1].id if verdict in ("changed", "baseline-fails") else None,
        last_stable=last_stable.id if last_stable else None,
        message=message,
        skipped=tuple(skipped),
        diff_summary=diff_summary,
    )


def _bundle_diff(out: Path, a: str | None, b: str | None) -> str | None:
    """``kk3evidence diff``'s one-line verdict between two step bundles (None if not possible)."""
    if not a or not b or a == b:
        return None
    try:
        return diff(out / a, out / b).summary()
    except Kk3Error as exc:
        return f"diff not possible: {exc.message}"
