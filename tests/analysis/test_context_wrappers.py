"""Ray's wrapped remote failures and GPU-less processes (2026-12-02, label rule 8).

Real lines from the corpus cases named. Ray's `RayTaskError(X)` line states a remote failure
first; the remote `X: …` line at the end of its frames classifies it. `No CUDA runtime is found`
from a process that runs without a GPU on purpose (a Ray driver, a benchmark client) yields to a
later failure that has nothing to do with the device, and stays the cause of one that does.
An RL trainer's loop (`fit`, `generate_sequences`) is serving: the rollout engines are up.
"""

from __future__ import annotations

from first_failure import first_failure as _first

# b20-file-searchr1-bm25-gigpo-lora-checkpoint-save-iostream-error (paths shortened)
_RAY = (
    "Traceback (most recent call last):\n"
    '  File "/r/verl/trainer/main_ppo.py", line 51, in run_ppo\n'
    "    ray.get(runner.run.remote(config))\n"
    '  File "/v/ray/_private/worker.py", line 1026, in get_objects\n'
    "    raise value.as_instanceof_cause()\n"
    "ray.exceptions.RayTaskError(RuntimeError): ray::TaskRunner.run() (pid=7621, "
    "ip=172.17.0.3, actor_id=df2010fef836efba6427b04501000000)\n"
    '  File "/r/verl/trainer/ppo/ray_trainer.py", line 1280, in fit\n'
    "    self._save_checkpoint()\n"
    '  File "/v/torch/serialization.py", line 1313, in _save\n'
    "    zip_file.write_record(name, storage, num_bytes)\n"
    "RuntimeError: basic_ios::clear: iostream error\n"
)
_NO_CUDA = (
    "(TaskRunner pid=7621) W0706 17:30:19.740000 7621 torch/utils/cpp_extension.py:140] "
    "No CUDA runtime is found, using CUDA_HOME='/usr/local/cuda'\n"
)



def test_the_ray_wrapper_line_is_first_and_the_remote_exception_classifies_it() -> None:
    ff = _first(_RAY)
    assert ff is not None and ff.line_no == 6
    assert ff.rule == "EXC001"  # the remote RuntimeError's fallback, not the wrapper's CSQ021
    assert ff.stage == "serving"  # raised inside the trainer's loop (`in fit`)


def test_a_worker_printing_the_exception_first_stays_first() -> None:
    early = (
        "(WorkerDict pid=8035) Traceback (most recent call last):\n"
        '(WorkerDict pid=8035)   File "/v/torch/serialization.py", line 1313, in _save\n'
        "(WorkerDict pid=8035)     zip_file.write_record(name, storage, num_bytes)\n"
        "(WorkerDict pid=8035) RuntimeError: basic_ios::clear: iostream error\n"
    )
    ff = _first(early + _RAY)
    assert ff is not None and ff.line_no == 4


def test_a_wrapper_without_its_remote_exception_in_the_log_is_still_the_answer() -> None:
    ff = _first("".join(_RAY.splitlines(keepends=True)[:8]))
    assert ff is not None and (ff.line_no, ff.rule) == (6, "CSQ021")


def test_no_cuda_runtime_in_a_gpu_less_driver_yields_to_an_unrelated_failure() -> None:
    ff = _first(_NO_CUDA + _RAY)
    assert ff is not None and ff.line_no == 7


def test_no_cuda_runtime_stays_the_cause_of_a_failure_about_the_device() -> None:
    # b18-file-llminference: vLLM's platform detection then finds no device
    ff = _first(
        "W0428 01:32:20.020000 2163909 venv/lib/python3.10/site-packages/torch/utils/"
        "cpp_extension.py:118] No CUDA runtime is found, using CUDA_HOME='/usr/local/cuda'\n"
        "Traceback (most recent call last):\n"
        '  File "/v/vllm/config.py", line 1, in __init__\n'
        "RuntimeError: Device string must not be empty\n"
    )
    assert ff is not None and (ff.line_no, ff.rule) == (1, "CUDA020")


def test_no_cuda_runtime_alone_in_a_log_that_never_became_ready_is_the_answer() -> None:
    ff = _first(_NO_CUDA)
    assert ff is not None and ff.rule == "CUDA020"


def test_a_ray_wrapper_alone_takes_the_stage_its_remote_class_points_at() -> None:
    # b21-agentlightningpr144: the remote ModuleNotFoundError is not in the log
    ff = _first(
        "ray.exceptions.RayTaskError(ModuleNotFoundError): ray::WorkerDict.actor_rollout_init_"
        "model() (pid=10928, ip=10.1.1.104, actor_id=3b846a02a80aa8b92c91fcfb01000000)\n"
        '  File "/usr/lib/python3.12/concurrent/futures/_base.py", line 449, in result\n'
        "    return self.__get_result()\n"
    )
    assert ff is not None and (ff.line_no, ff.rule, ff.stage) == (1, "CSQ021", "container_init")


def test_ray_killing_workers_for_host_memory_with_no_stage_in_view_is_serving() -> None:
    # b13-1160: the memory monitor fires while a job runs
    ff = _first(
        "(raylet) [2025-04-02 15:02:00,117 E 135782 135782] (raylet) node_manager.cc:3069: 1 "
        "Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed due to "
        "other reasons at node (ID: 351e40, IP: 10.0.0.1) over the last time period.\n"
    )
    assert ff is not None and (ff.rule, ff.stage, ff.category) == ("OOM014", "serving", "oom")
