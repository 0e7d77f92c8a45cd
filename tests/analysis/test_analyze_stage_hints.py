"""Stage of context-dependent failures (rules/stage-hints.toml), quoted prefixes, bare lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from kk3evidence.analysis.engine import analyze
from kk3evidence.analysis.grammar import parse_line
from kk3evidence.analysis.rules import load_stage_hints, parse_stage_hints
from kk3evidence.errors import RuleError

CORPUS = Path(__file__).resolve().parents[2] / "corpus"
P = "(EngineCore pid=2) ERROR 05-05 07:35:19 [core.py:1136] "
OOM = P + (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 2 has a "
    "total capacity of 14.62 GiB of which 3 MiB is free."
)


def _tb(*funcs: str, exc: str = OOM) -> list[str]:
    lines = [P + "Traceback (most recent call last):"]
    for f in funcs:
        lines.append(P + f'  File "/v/vllm/x.py", line 1, in {f}')
        lines.append(P + "    x()")
    lines.append(exc)
    return lines


def _first(lines: list[str]) -> tuple[int, str, str]:
    ff = analyze([ln + "\n" for ln in lines]).first_failure
    assert ff is not None
    return ff.line_no, ff.stage, ff.category


def test_oom_inside_load_model_frames_is_a_weights_access_failure() -> None:
    lines = _tb("run_engine_core", "__init__", "load_model", "load_weights", "_apply")
    assert _first(lines) == (len(lines), "weights_access", "oom")


def test_oom_while_profiling_memory_is_an_engine_init_failure() -> None:
    lines = _tb("run_engine_core", "determine_available_memory", "profile_run", "_dummy_run")
    assert _first(lines)[1:] == ("engine_init", "oom")


def test_start_up_frame_beats_a_serving_frame_reused_during_warm_up() -> None:
    # V0's profile_run calls execute_model: the start-up frame decides.
    lines = _tb("run_engine_core", "profile_run", "execute_model", "forward")
    assert _first(lines)[1] == "engine_init"


def test_failure_in_the_busy_loop_is_a_serving_failure() -> None:
    lines = _tb("run_engine_core", "run_busy_loop", "step", "execute_model", "forward")
    assert _first(lines)[1] == "serving"


def test_illegal_memory_access_followed_by_engine_dead_error_is_serving() -> None:
    lines = [
        "(EngineCore pid=9) torch.AcceleratorError: CUDA error: an illegal memory access was "
        "encountered",
        "(APIServer pid=8) ERROR 06-15 16:27:50 [serving.py:471] vllm.v1.engine.exceptions."
        "EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the "
        "root cause.",
    ]
    assert _first(lines) == (1, "serving", "illegal_memory")


def test_worker_line_naming_load_model_gives_the_stage_of_a_bare_oom_line() -> None:
    lines = [
        "(VllmWorkerProcess pid=5) ERROR 03-02 19:49:43 [multiproc_worker_utils.py:242] "
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 2 has a "
        "total capacity of 14.62 GiB of which 3 MiB is free.",
        "(VllmWorkerProcess pid=7) ERROR 03-02 19:49:43 [multiproc_worker_utils.py:242] "
        "Exception in worker VllmWorkerProcess while processing method load_model.",
    ]
    assert _first(lines) == (1, "weights_access", "oom")


def test_fixed_stage_categories_ignore_frames() -> None:
    kv = P + (
        "ValueError: To serve at least one request with the model's max seq len (2048), "
        "(0.0 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(0.0 GiB). Based on the available memory"
    )
    lines = _tb("run_engine_core", "load_model", exc=kv)
    assert _first(lines)[1:] == ("engine_init", "kv_cache")


def test_no_hints_keeps_the_rule_stage() -> None:
    assert _first([OOM])[1] == "engine_init"


def test_shipped_stage_hints_are_valid_and_cover_the_start_up_stages() -> None:
    h = load_stage_hints()
    stages = {s for _, s in h.frame}
    assert {"weights_access", "engine_init", "comm_group", "serving"} <= stages
    assert "oom" in h.context_categories and h.window_after > 0


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('schema = "x"', "schema must be"),
        ('schema = "kk3evidence/stage-hints/v1"\nbogus = 1', "unknown key 'bogus'"),
        (
            'schema = "kk3evidence/stage-hints/v1"\n[[hint]]\nstage = "nowhere"\nframe = ["a"]',
            "stage 'nowhere'",
        ),
        ('schema = "kk3evidence/stage-hints/v1"\ncontext_categories = ["nope"]', "nope"),
        ('schema = "kk3evidence/stage-hints/v1"\nwindow_after = -1', "window_after"),
        ("schema = [", "not valid TOML"),
    ],
)
def test_bad_stage_hints_file_is_a_one_line_rule_error(text: str, needle: str) -> None:
    with pytest.raises(RuleError) as err:
        parse_stage_hints(text, "hints.toml")
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("prefix", [">   | ", '"  | ', "> ", "> > ", "  | "])
def test_quoted_and_ci_pipe_prefixes_are_stripped(prefix: str) -> None:
    ln = parse_line(1, prefix + "ERROR 01-01 00:00:00 [x.py:1] boom")
    assert ln.body == "boom" and ln.level == "ERROR"


def test_quoted_uvicorn_bind_error_is_found() -> None:
    lines = [
        ">   | [2024-09-05T00:38:34Z] INFO:     Waiting for application startup.",
        ">   | [2024-09-05T00:38:34Z] ERROR:    [Errno 98] error while attempting to bind on "
        "address ('0.0.0.0', 44319): [errno 98] address already in use",
    ]
    assert _first(lines) == (2, "api_ready", "port")


def test_bare_exception_line_without_traceback_reaches_the_fallback() -> None:
    lines = ["INFO 01-01 00:00:00 [x.py:1] starting", "AssertionError: unsupported head size 80"]
    ff = analyze([ln + "\n" for ln in lines]).first_failure
    assert ff is not None and ff.line_no == 2 and ff.rule == "EXC003"


def test_warning_level_exception_text_is_not_a_failure() -> None:
    lines = ["WARNING 01-01 00:00:00 [x.py:1] RuntimeError: retrying in 1 s"]
    assert analyze([ln + "\n" for ln in lines]).first_failure is None


def test_serving_frames_yield_to_an_unfinished_start_up_stage() -> None:
    # Weights are still loading (started, no "Loading weights took"): the busy-loop frames of
    # a truncated traceback do not make it a serving failure.
    start = "(Worker pid=3) INFO 11-30 01:48:03 [gpu_model_runner.py:68] Starting to load model /m"
    lines = [start, *_tb("run_busy_loop", "step", "execute_model", "forward")]
    assert _first(lines)[1] == "weights_access"


def _frames_tb(frames: list[tuple[str, str]], exc: str) -> list[str]:
    """An unprefixed traceback through ``(path, function)`` frames, ending in ``exc``."""
    lines = ["Traceback (most recent call last):"]
    for path, func in frames:
        lines += [f'  File "{path}", line 7, in {func}', "    call()"]
    return [*lines, exc]


SITE = "/usr/lib/python3.12/site-packages"


def test_an_exception_in_the_http_request_path_is_a_serving_failure() -> None:
    # Starlette's middleware and routing and FastAPI's endpoint runner only run per request.
    lines = _frames_tb(
        [
            (f"{SITE}/starlette/middleware/errors.py", "__call__"),
            (f"{SITE}/starlette/routing.py", "handle"),
            (f"{SITE}/fastapi/routing.py", "run_endpoint_function"),
            (f"{SITE}/vllm/entrypoints/openai/serving_chat.py", "render"),
        ],
        "TypeError: 'NoneType' object is not subscriptable",
    )
    assert _first(lines) == (len(lines), "serving", "other")


def test_an_openai_client_call_that_fails_is_a_serving_failure() -> None:
    lines = _frames_tb(
        [("<string>", "<module>"), (f"{SITE}/openai/resources/chat/completions.py", "create")],
        "openai.InternalServerError: Error code: 500",
    )
    assert _first(lines)[1] == "serving"


def test_a_kv_connector_step_call_is_a_serving_failure() -> None:
    lines = _frames_tb(
        [(f"{SITE}/vllm/distributed/kv_transfer/kv_connector/v1/x.py", "wait_for_save")],
        "AssertionError",
    )
    assert _first(lines)[1] == "serving"


def test_vllm_dump_after_a_failed_step_is_a_serving_hint() -> None:
    lines = [
        "ERROR 08-29 01:18:42 [dump_input.py:69] Dumping input data for V1 LLM engine (v0.10.1) "
        "with config: model='m'",
        "ERROR 08-29 01:18:42 [core.py:700] ValueError: bad batch",
    ]
    assert _first(lines) == (2, "serving", "other")


def test_a_failed_import_of_the_vllm_package_is_a_container_init_failure() -> None:
    lines = _frames_tb(
        [
            ("/venv/bin/vllm", "<module>"),
            (f"{SITE}/vllm/entrypoints/cli/__init__.py", "<module>"),
            (f"{SITE}/vllm/engine/arg_utils.py", "<module>"),
        ],
        "ImportError: /venv/vllm/_C.abi3.so: undefined symbol: _ZN3c104cuda9SetDeviceEi",
    )
    assert _first(lines)[1] == "container_init"


def test_an_exception_raised_while_the_model_loads_its_weights_is_a_weights_failure() -> None:
    lines = _frames_tb(
        [
            (f"{SITE}/vllm/model_executor/model_loader/default_loader.py", "load_model"),
            (f"{SITE}/vllm/model_executor/models/utils.py", "load_weights"),
        ],
        "KeyError: 'model.layers.0.mlp.experts.w2_weight_scale'",
    )
    assert _first(lines) == (len(lines), "weights_access", "weights")


def test_an_oom_while_loading_weights_keeps_its_own_category() -> None:
    lines = _frames_tb(
        [(f"{SITE}/vllm/model_executor/models/utils.py", "load_weights")],
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    )
    assert _first(lines)[1:] == ("weights_access", "oom")


@pytest.mark.parametrize(
    ("frame", "category"),
    [
        ((f"{SITE}/triton/runtime/autotuner.py", "run"), "compile"),
        ((f"{SITE}/torch/cuda/graphs.py", "capture_begin"), "compile"),
        ((f"{SITE}/torch/cuda/memory.py", "mem_get_info"), "cuda_init"),
    ],
)
def test_frames_of_the_failing_call_give_the_category(
    frame: tuple[str, str], category: str
) -> None:
    lines = _frames_tb([(f"{SITE}/vllm/x.py", "f"), frame], "RuntimeError: something failed")
    assert _first(lines)[2] == category


def test_the_asgi_lifespan_is_start_up_not_a_request() -> None:
    # uvicorn runs the app's start-up through Starlette's middleware and router too.
    lines = _frames_tb(
        [
            (f"{SITE}/starlette/middleware/errors.py", "__call__"),
            (f"{SITE}/starlette/routing.py", "lifespan"),
            (f"{SITE}/vllm/entrypoints/openai/api_server.py", "lifespan"),
        ],
        "RuntimeError: could not start the engine client",
    )
    assert _first(lines)[1] == "api_ready"


def test_a_triton_kernel_launch_while_serving_is_not_a_compile_failure() -> None:
    # Every Triton launch passes through triton/runtime/jit.py: only the autotuner, the build
    # and the cache say "compile".
    lines = _frames_tb(
        [
            (f"{SITE}/vllm/v1/engine/core.py", "step"),
            (f"{SITE}/vllm/v1/worker/gpu_model_runner.py", "execute_model"),
            (f"{SITE}/triton/runtime/jit.py", "run"),
        ],
        "ValueError: Pointer argument (at 0) cannot be accessed from Triton (cpu tensor?)",
    )
    assert _first(lines)[1:] == ("serving", "other")


def test_a_processor_loaded_after_the_weights_is_not_a_weights_access_failure() -> None:
    done = (
        "(Worker pid=3) INFO 11-30 01:48:03 [default_loader.py:501] Loading weights took 0.01 "
        "seconds"
    )
    lines = [
        done,
        *_frames_tb(
            [
                (f"{SITE}/vllm/v1/worker/gpu_model_runner.py", "profile_run"),
                (f"{SITE}/transformers/processing_utils.py", "from_pretrained"),
            ],
            "ImportError: Qwen2VLImageProcessor requires the Torchvision library",
        ),
    ]
    assert _first(lines)[1] == "engine_init"


IMA = P + "RuntimeError: CUDA error: an illegal memory access was encountered"


def test_an_illegal_memory_access_with_no_start_up_in_view_is_a_serving_failure() -> None:
    # 37 of the corpus's 49 illegal memory accesses struck while requests ran: a slice that
    # shows no start-up stage and no start-up frame is judged a serving failure.
    lines = _tb("run_engine_core", "forward", exc=IMA)  # no hinted frame either way
    assert _first(lines) == (len(lines), "serving", "illegal_memory")


def test_an_illegal_memory_access_during_start_up_keeps_the_start_up_stage() -> None:
    loading = P.replace("ERROR", "INFO") + "Starting to load model m"
    assert _first([loading, *_tb("run_engine_core", "forward", exc=IMA)])[1:] == (
        "weights_access",
        "illegal_memory",
    )
    capture = _tb("run_engine_core", "capture_model", "_dummy_run", exc=IMA)
    assert _first(capture) == (len(capture), "engine_init", "illegal_memory")


def test_a_lora_activation_frame_makes_a_fallback_a_serving_failure() -> None:
    lines = _tb("worker_busy_loop", "_apply_adapters", "add_adapter", exc=P + "ValueError: bad")
    assert _first(lines) == (len(lines), "serving", "other")


def test_a_failure_the_engine_calls_a_failed_start_is_no_serving_failure() -> None:
    # vLLM V1 logs `EngineCore failed to start.` and then the traceback it explains
    failed = P + "EngineCore failed to start."
    ima = _tb("run_engine_core", "forward", exc=IMA)
    assert _first([failed, *ima])[1:] == ("engine_init", "illegal_memory")
    # execute_model is serving code, but the engine says it never finished starting
    exc = _tb("run_engine_core", "execute_model", exc=P + "ValueError: bad shape")
    assert _first(exc)[1] == "serving"
    assert _first([failed, *exc])[1] == "engine_init"
    # a worker's failure, and the engine's summary below it
    below = "(EngineCore pid=2) ERROR 05-05 07:35:20 [core.py:1] WorkerProc initialization failed"
    assert _first([*ima, below])[1] == "engine_init"


def test_an_unready_hint_takes_lines_only() -> None:
    doc = 'schema = "kk3evidence/stage-hints/v1"\n[[hint]]\nstage = "unready"\nframe = ["x"]\n'
    with pytest.raises(RuleError, match="lines only"):
        parse_stage_hints(doc, "t.toml")


# --- the exception class as the category's last resort (`exception` category hints) ---------

# vllm-project/vllm-omni (corpus b13-omni…): vLLM refuses a value and no word names a family
_FPS = "ValueError: The length of fps (3) must be equal to the length of video_grid_thw (1)"


def test_a_value_error_no_family_word_names_is_a_config_failure() -> None:
    _, _stage, cat = _first(_tb("_call_hf_processor", exc=P + _FPS))
    assert cat == "config"


def test_frames_decide_before_the_exception_class() -> None:
    _, _stage, cat = _first(_tb("load_weights", exc=P + _FPS))
    assert cat == "weights"


def test_other_exception_classes_keep_other() -> None:
    exc = P + "AttributeError: 'NoneType' object has no attribute 'splitlines'"
    _, _stage, cat = _first(_tb("_call_hf_processor", exc=exc))
    assert cat == "other"


@pytest.mark.parametrize(
    ("body", "want"),
    [
        ("ValueError: x", "config"),
        ("pkg.mod.ValueError: x", "config"),
        ("ValueError('bad value')", "config"),
        ("ValueError", "config"),
        ("RuntimeError: Worker failed with error 'ValueError: x'", None),
        ("MyValueError: x", None),
        ("the ValueError branch was taken", None),
    ],
)
def test_exception_category_reads_the_first_raised_class(body: str, want: str | None) -> None:
    assert load_stage_hints().exception_category(body) == want


def test_exception_hints_must_name_an_exception_class() -> None:
    bad = '[[category_hint]]\ncategory = "config"\nexception = ["value error"]\n'
    with pytest.raises(RuleError, match="not a Python exception class name"):
        parse_stage_hints('schema = "kk3evidence/stage-hints/v1"\n' + bad)


def test_runc_create_failure_takes_the_family_of_the_nvidia_hook_line_below() -> None:
    """Docker prints the NVIDIA hook's stderr on the line after runc's (corpus b6-5635): the
    first line is the failure, the hook's words decide its family."""
    runc = (
        "docker: Error response from daemon: failed to create task for container: failed to "
        "create shim task: OCI runtime create failed: runc create failed: unable to start "
        "container process: error during container init: error running hook #0: error running "
        "hook: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'"
    )
    hooks = {
        "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.4, please "
        "update your driver to a newer version, or use an earlier cuda container: unknown.": (
            "driver_mismatch"
        ),
        "nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown.": (
            "cuda_init"
        ),
        "mkdir /sys/fs/cgroup/cpuset/docker/32ca: permission denied: unknown.": "other",
    }
    for hook, cat in hooks.items():
        ff = analyze([runc + "\n", hook + "\n"]).first_failure
        assert ff is not None and (ff.line_no, ff.rule, ff.stage, ff.category) == (
            1, "CTR015", "container_init", cat
        ), hook


def test_free_memory_check_is_an_engine_init_failure_while_the_device_stage_runs() -> None:
    """vLLM checks free memory against --gpu-memory-utilization as the worker initialises its
    device, before any start-up stage completes; every corpus log with it labels engine_init
    (OOM004 is a fixed-stage rule). A committed run log of set 17 (corpus b17-file-hyouin-…)."""
    case = next(CORPUS.glob("b17-file-hyouin-*"))
    ff = analyze(case / "output.log").first_failure
    assert ff is not None and (ff.rule, ff.stage, ff.category) == ("OOM004", "engine_init", "oom")


def test_a_cuda_oom_inside_inductor_autotuning_is_an_oom() -> None:
    line = (
        "(EngineCore pid=42887) ERROR 04-26 12:05:05 [core.py:1108] torch._inductor.exc."
        "InductorError: RuntimeError: Failed to run autotuning code block: CUDA out of memory. "
        "Tried to allocate 1.02 GiB. GPU 0 has a total capacity of 14.56 GiB of which 111.81 MiB "
        "is free."
    )
    ff = analyze([line + "\n"]).first_failure
    assert ff is not None and ff.category == "oom" and ff.rule.startswith("OOM")


def test_a_jit_build_failure_the_server_survives_is_no_cause() -> None:
    """FlashInfer's all-reduce build fails at WARNING and vLLM falls back; a later answered
    GET /v1/models shows the server up (MS054), so COMP010 (`when = "unready"`) drops out."""
    build = (
        "(Worker_TP0 pid=3438584) WARNING 04-20 00:18:19 [flashinfer_all_reduce.py:72] ninja: "
        "build stopped: subcommand failed.\n"
    )
    ready = (
        '(APIServer pid=3437395) INFO:     127.0.0.1:48416 - "GET /v1/models HTTP/1.1" 200 OK\n'
    )
    ff = analyze([build]).first_failure
    assert ff is not None and ff.rule == "COMP010"
    assert analyze([build, ready]).first_failure is None
