"""Context the analyzer reads around a line (added after blind set 19, corpus/HELDOUT19.md).

Each test feeds real lines (quoted from the corpus case named) through the whole analyzer:
a platform plugin that makes a missing CUDA library expected, an import failing before
anything started, FastChat's logging envelope, Ray's colour codes without their ESC byte, the
executor's cleanup error after a failed start-up, progress lines that say requests are served.
"""

from __future__ import annotations

from first_failure import first_failure as _first

from kk3evidence.analysis.engine import analyze
from kk3evidence.analysis.envelope import decode_line
from kk3evidence.analysis.grammar import parse_line

# b19-file-vllmbenchtest-kunlun-p800-minimax-m25-bench-serve-clean (a healthy benchmark)
_KUNLUN = (
    "INFO 04-08 14:01:28 [__init__.py:220] No platform detected, vLLM is running on "
    "UnspecifiedPlatform\n"
    "INFO 04-08 14:01:31 [__init__.py:207] Platform plugin kunlun is activated\n"
    "WARNING 04-08 14:01:31 [_custom_ops.py:20] Failed to import from vllm._C with "
    "ImportError('libcudart.so.12: cannot open shared object file: No such file or directory')\n"
    "ERROR 04-08 14:01:34 [fa_utils.py:57] Cannot use FA version 2 is not supported due to FA2 "
    "is unavaible due to: libcudart.so.12: cannot open shared object file: No such file or "
    "directory\n"
)



def test_a_cuda_library_missing_after_a_platform_plugin_took_over_is_no_failure() -> None:
    assert _first(_KUNLUN) is None


def test_the_same_cuda_library_missing_without_a_platform_plugin_is_the_failure() -> None:
    text = "".join(ln + "\n" for ln in _KUNLUN.splitlines() if "Platform plugin" not in ln)
    ff = _first(text)
    assert ff is not None and ff.rule == "CTR009" and ff.line_no == 2
    assert ff.category == "cuda_init"


def test_an_import_failing_before_anything_started_is_a_broken_install() -> None:
    # b19-ascend5497-v0130rc1-openeuler-from-vllm-import-llm-importerror
    ff = _first(
        b"Traceback (most recent call last):\n"
        b'  File "/home/lyc/vllm/fuck.py", line 1, in <module>\n'
        b"    from vllm import LLM, SamplingParams\n"
        b"ImportError: cannot import name 'LLM' from 'vllm' (unknown location)\n"
    )
    assert ff is not None and ff.line_no == 4 and ff.basis == "fallback"
    assert (ff.stage, ff.category) == ("container_init", "other")


def test_an_import_failing_while_weights_load_keeps_the_stage_in_progress() -> None:
    ff = _first(
        b"INFO 01-01 00:00:00 [loader.py:1] Starting to load model /m\n"
        b"Traceback (most recent call last):\n"
        b'  File "/x/loader.py", line 3, in load\n'
        b"ModuleNotFoundError: No module named 'frobnicator'\n"
    )
    assert ff is not None and ff.line_no == 4 and ff.stage == "weights_access"


def test_fastchat_pipe_envelope_exposes_the_traceback() -> None:
    # b19-fastchat3704-vllm082-v1-worker-asyncllm-no-attribute-engine: FastChat re-logs every
    # stderr line at ERROR; the traceback inside is parsed and its exception line is the cause.
    prefix = "2025-03-24 22:04:27 | ERROR | stderr | "
    body = [
        "Traceback (most recent call last):",
        '  File "/p/haicluster/llama/FastChat/fastchat/serve/vllm_worker.py", line 291, '
        "in <module>",
        "    worker = VLLMWorker(",
        "             ^^^^^^^^^^^",
        '  File "/p/haicluster/llama/FastChat/fastchat/serve/vllm_worker.py", line 57, in __init__',
        "    self.tokenizer = llm_engine.engine.tokenizer",
        "                     ^^^^^^^^^^^^^^^^^",
        "AttributeError: 'AsyncLLM' object has no attribute 'engine'",
    ]
    a = analyze("".join(prefix + b + "\n" for b in body).encode())
    assert a.first_failure is not None and a.first_failure.line_no == 8
    line = parse_line(8, prefix + body[-1])
    assert line.level is None and line.timestamp == "2025-03-24 22:04:27"  # the stream's level
    other = parse_line(
        1, "2023-11-10 17:45:27 | ERROR | asyncio | Future exception was never retrieved"
    )
    assert (other.body, other.level) == ("Future exception was never retrieved", "ERROR")


def test_ray_colour_codes_without_their_escape_byte_are_dropped() -> None:
    # b19-openr1-245: `RayTaskError(ValueError): [36mray::…()[39m (pid=…)` as pasted
    text = (
        "RayTaskError(ValueError): [36mray::run_inference_one_model()[39m "
        "(pid=51424, ip=10.141.17.198)"
    )
    assert decode_line(text) == (
        "RayTaskError(ValueError): ray::run_inference_one_model() (pid=51424, ip=10.141.17.198)"
    )
    assert decode_line("took [5min] to load [0m") == "took [5min] to load "  # [5m: no colour
    ff = _first(
        text + "\n"
        '  File "/opt/conda/lib/python3.10/site-packages/lighteval/models/vllm/vllm_model.py",'
        " line 339, in run_inference_one_model\n"
        "    llm = LLM(**model_args)\n"
    )
    assert ff is not None and ff.line_no == 1 and ff.rule == "CSQ021"


def test_the_executor_cleanup_error_after_a_failed_start_is_a_consequence() -> None:
    # b19-hunyuana13b22: the start-up's own statement comes first; the finaliser's
    # AttributeError on the half-built executor only follows from it
    ff = _first(
        b"Exception: WorkerProc initialization failed due to an exception in a background "
        b"process. See stack trace for root cause.\n"
        b"Traceback (most recent call last):\n"
        b'  File "/usr/lib/python3.12/weakref.py", line 666, in _exitfunc\n'
        b"    f()\n"
        b'  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/executor/'
        b'multiproc_executor.py", line 228, in shutdown\n'
        b"    for w in self.workers:\n"
        b"AttributeError: 'MultiprocExecutor' object has no attribute 'workers'\n"
    )
    assert ff is not None and ff.line_no == 1


def test_an_error_after_offline_generation_is_a_serving_failure() -> None:
    ff = _first(
        "INFO 06-14 03:09:10 [llm.py:1] Supported tasks: ['generate']\n"
        "Processed prompts: 100%|██████| 4/4 [00:00<00:00, 19.25it/s, est. speed input: "
        "125.19 toks/s, output: 308.14 toks/s]\n"
        "Traceback (most recent call last):\n"
        '  File "/w/run.py", line 9, in <module>\n'
        "FileNotFoundError: [Errno 2] No such file or directory: 'reports/r.json'\n"
    )
    assert ff is not None and ff.line_no == 5 and ff.stage == "serving"


def test_a_v0_prompt_over_the_limit_is_a_serving_config_failure() -> None:
    ff = _first(
        b"INFO 02-13 07:19:11 async_llm_engine.py:211] Added request "
        b"chatcmpl-59c408fd038b4931bcaa80f61817574b.\n"
        b"WARNING 02-13 07:19:11 scheduler.py:949] Input prompt (32889 tokens) is too long and "
        b"exceeds limit of 2048\n"
    )
    assert ff is not None and ff.rule == "CFG026"
    assert (ff.line_no, ff.stage, ff.category) == (2, "serving", "config")
