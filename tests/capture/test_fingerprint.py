"""Fingerprint probes: NVML (injected), container detection, the Python side, time-boxing."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kk3evidence.capture import fingerprint as fp

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"


class FakeNvml:
    """pynvml's function names over a description of GPUs (the only faked component)."""

    class NVMLError_NotSupported(Exception):
        pass

    def __init__(
        self, gpus: list[dict[str, Any]], driver: str = "580.65.06", cuda: int = 13000
    ) -> None:
        self.gpus = gpus
        self.driver = driver
        self.cuda = cuda
        self.shutdown_called = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shutdown_called = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return self.cuda

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "13.580.65.06"

    def nvmlSystemGetProcessName(self, pid: int) -> bytes:
        return b"/usr/bin/python3"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.gpus[h]["name"].encode()  # old pynvml returns bytes

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return str(self.gpus[h]["uuid"])

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=self.gpus[h]["bus"])

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(total=self.gpus[h]["total"], used=self.gpus[h]["used"])

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return (9, 0)

    def nvmlDeviceGetMigMode(self, h: int) -> tuple[int, int]:
        if self.gpus[h].get("mig") is None:
            raise self.NVMLError_NotSupported("Not Supported")
        return (self.gpus[h]["mig"], 0)

    def nvmlDeviceGetEccMode(self, h: int) -> tuple[int, int]:
        return (1, 1)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self.gpus[h]["procs"]]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: int) -> list[Any]:
        return []


def _two_gpus() -> FakeNvml:
    return FakeNvml(
        [
            {
                "name": "NVIDIA H200",
                "uuid": "GPU-aaaa",
                "bus": b"00000000:18:00.0",
                "total": 150 * 2**30,
                "used": 40 * 2**30,
                "mig": 0,
                "procs": [(999999, 40 * 2**30)],
            },
            {
                "name": "NVIDIA H200",
                "uuid": "GPU-bbbb",
                "bus": "00000000:2A:00.0",
                "total": 150 * 2**30,
                "used": 2**20,
                "mig": None,
                "procs": [],
            },
        ]
    )


def test_gpus_from_nvml_have_every_field() -> None:
    nvml = _two_gpus()
    g = fp.collect_gpus(nvml)
    assert g["source"] == "nvml"
    assert g["driver_version"] == "580.65.06"
    assert g["cuda_driver_version"] == "13.0"
    assert g["nvml_version"] == "13.580.65.06"
    d0, d1 = g["devices"]
    assert d0 == {
        "index": 0,
        "name": "NVIDIA H200",
        "uuid": "GPU-aaaa",
        "pci_bus_id": "00000000:18:00.0",
        "memory_total_bytes": 150 * 2**30,
        "memory_used_bytes": 40 * 2**30,
        "compute_capability": "9.0",
        "mig_mode": "disabled",
        "ecc_mode": "enabled",
        "processes": [{"pid": 999999, "name": "/usr/bin/python3", "used_memory_bytes": 40 * 2**30}],
    }
    assert d1["mig_mode"] is None  # not supported: unknown, and said so
    assert any("gpu1.mig" in e for e in g["field_errors"])
    assert nvml.shutdown_called


def test_no_nvidia_driver_is_source_none_with_the_reason() -> None:
    class NoDriver(FakeNvml):
        class NVMLError_DriverNotLoaded(Exception):
            pass

        def nvmlInit(self) -> None:
            raise self.NVMLError_DriverNotLoaded("Driver Not Loaded")

    g = fp.collect_gpus(NoDriver([]))
    assert g["source"] == "none"
    assert "Driver Not Loaded" in g["error"]
    assert g["devices"] == []


def test_an_unexpected_nvml_failure_is_source_error() -> None:
    class Broken(FakeNvml):
        def nvmlInit(self) -> None:
            raise RuntimeError("GPU is lost")

    g = fp.collect_gpus(Broken([]))
    assert g["source"] == "error" and "GPU is lost" in g["error"]


def test_a_hanging_probe_is_time_boxed_and_recorded() -> None:
    release = threading.Event()

    class Hanging(FakeNvml):
        def nvmlInit(self) -> None:
            release.wait(30)

    fingerprint = fp.Fingerprint()
    try:
        fp.collect_base(fingerprint, {}, nvml=Hanging([]), timeout=0.2)
    finally:
        release.set()
    rec = {p.name: p for p in fingerprint.probes}["gpus"]
    assert not rec.ok and rec.truncated and "timed out after 0.2 s" in (rec.error or "")
    assert fingerprint.gpus["source"] == "error"
    assert fingerprint.host["hostname"]  # the other probes still ran


def test_run_probe_turns_an_exception_into_a_record() -> None:
    def boom() -> None:
        raise OSError("no /proc here")

    value, rec = fp.run_probe("x", boom, 5)
    assert value is None and not rec.ok and rec.error == "OSError: no /proc here"


def test_podman_containerenv_gives_image_and_id(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".containerenv").write_text(
        'engine="podman-4.9.3"\nname="vllm"\nid="abc"\n'
        'image="docker.io/vllm/vllm-openai:kimi-k3"\nimageid="sha256:1234"\nrootless=0\n'
    )
    c = fp.collect_container({}, root=str(tmp_path))
    assert c["runtime"] == "podman" and c["runtime_source"] == "/run/.containerenv"
    assert c["image_ref"] == "docker.io/vllm/vllm-openai:kimi-k3"
    assert c["image_ref_source"] == "/run/.containerenv"
    assert c["image_id"] == "sha256:1234"


def test_options_win_over_detection_and_env_is_the_last_resort(tmp_path: Path) -> None:
    (tmp_path / ".dockerenv").write_text("")
    env = {
        "KK3_IMAGE": "from-env:1",
        "KK3_IMAGE_ID": "sha256:env",
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
    }
    c = fp.collect_container(env, image="opt:2", root=str(tmp_path))
    assert c["runtime"] == "docker" and c["runtime_source"] == "/.dockerenv"
    assert c["image_ref"] == "opt:2" and c["image_ref_source"] == "option --image"
    assert c["image_id"] == "sha256:env"
    assert c["image_id_source"] == "environment variable KK3_IMAGE_ID"
    assert c["orchestrator"] == "kubernetes"


def test_cgroup_reveals_kubernetes(tmp_path: Path) -> None:
    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc" / "1" / "cgroup").write_text("0::/kubepods/burstable/pod123/abc\n")
    c = fp.collect_container({}, root=str(tmp_path))
    assert c["runtime"] == "kubernetes" and c["runtime_source"] == "/proc/1/cgroup"


def test_no_container_says_how_it_looked(tmp_path: Path) -> None:
    c = fp.collect_container({}, root=str(tmp_path))
    assert c["runtime"] == "none" and "no container marker" in c["runtime_source"]
    assert c["image_ref"] is None and c["image_ref_source"] is None


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_interpreter_from_a_console_script_shebang(tmp_path: Path) -> None:
    _script(tmp_path / "vllm", f"#!{sys.executable}\nimport sys\n")
    interp, how = fp.find_interpreter(["vllm", "serve", "m"], {"PATH": str(tmp_path)})
    assert interp == sys.executable and how.startswith("shebang of")


def test_interpreter_from_env_shebang_and_pip_trampoline(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    _script(bindir / "a", "#!/usr/bin/env python3\n")
    long_py = str(bindir / "python3")
    _script(bindir / "b", f"#!/bin/sh\n'''exec' {long_py} \"$0\" \"$@\"\n' '''\n")
    env = {"PATH": str(bindir)}
    assert fp.find_interpreter(["a"], env)[0] == str(bindir / "python3")
    assert fp.find_interpreter(["b"], env) == (long_py, f"exec line of {bindir / 'b'}")
    assert fp.find_interpreter(["env", "X=1", "a"], env)[0] == str(bindir / "python3")


def test_interpreter_not_found_says_why(tmp_path: Path) -> None:
    _script(tmp_path / "tool", "#!/bin/bash\necho hi\n")
    assert fp.find_interpreter(["tool"], {"PATH": str(tmp_path)}) == (
        None,
        "tool runs /bin/bash, not Python",
    )
    assert fp.find_interpreter(["nope"], {"PATH": str(tmp_path)})[1] == "nope not found on PATH"
    assert fp.find_interpreter([sys.executable, "-m", "vllm"], {})[0] == sys.executable


def test_python_side_probe_runs_in_a_subprocess() -> None:
    py, rec = fp.collect_python([sys.executable, "-c", "pass"], dict(os.environ), timeout=60)
    assert rec.ok, rec
    assert py["interpreter"] == sys.executable
    assert py["python_version"] == ".".join(map(str, sys.version_info[:3]))
    # This venv has neither torch nor vllm: their absence is recorded, not raised.
    if py["torch_version"] is None:
        assert "torch" in py["errors"]


def test_python_probe_timeout_is_recorded(tmp_path: Path) -> None:
    slow = _script(tmp_path / "python3", f"#!/bin/sh\nexec {shutil.which('sleep')} 30\n")
    py, rec = fp.collect_python([str(slow)], {"PATH": str(tmp_path)}, timeout=0.5)
    assert not rec.ok and "timed out" in (rec.error or "")
    assert py["interpreter"] == str(slow) and py["torch_version"] is None


def test_selected_env_keeps_the_variables_that_matter() -> None:
    env = {
        "CUDA_VISIBLE_DEVICES": "0",
        "NCCL_P2P_DISABLE": "1",
        "VLLM_USE_V1": "1",
        "HF_HOME": "/h",
        "OMP_NUM_THREADS": "4",
        "LD_LIBRARY_PATH": "/x",
        "HOME": "/root",
        "TERM": "xterm",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }
    assert set(fp.select_env(env)) == set(env) - {"HOME", "TERM"}


def test_fingerprint_json_has_the_architecture_shape() -> None:
    f = fp.collect(
        [sys.executable, "-c", "pass"], {"PATH": os.environ["PATH"]}, nvml=_two_gpus(), timeout=10
    )
    data = f.to_json()
    assert data["schema"] == "kk3evidence/fingerprint/v1"
    assert set(data) == {
        "schema",
        "collected_at",
        "host",
        "gpus",
        "container",
        "python",
        "env",
        "libraries",
        "probes",
    }
    assert set(data["host"]) == {"hostname", "kernel", "os", "arch", "cpu_count", "mem_total_bytes"}
    assert set(data["python"]) >= {
        "interpreter",
        "python_version",
        "vllm_version",
        "torch_version",
        "torch_cuda",
        "cuda_device_count",
        "nccl_version",
        "source",
    }
    json.dumps(data)  # plain JSON


def test_fingerprint_command_prints_json_and_a_summary() -> None:
    from click.testing import CliRunner

    from kk3evidence.cli import main

    as_json = CliRunner().invoke(main, ["fingerprint", "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.output)["schema"] == "kk3evidence/fingerprint/v1"
    human = CliRunner().invoke(main, ["fingerprint"])
    assert human.exit_code == 0 and human.output.startswith("host: ")


def test_gpu_fixture_from_a_real_machine_is_a_valid_fingerprint() -> None:
    path = FIXTURE / "fingerprint.json"
    if not path.exists():
        pytest.skip("no GPU fixture recorded yet")
    from kk3evidence.bundle import schema

    data = json.loads(path.read_text())
    assert list(schema.iter_schema_problems("fingerprint", data, "fingerprint.json")) == []
    assert data["gpus"]["source"] == "nvml"
    dev = data["gpus"]["devices"][0]
    assert dev["name"].startswith("NVIDIA") and dev["memory_total_bytes"] > 0
    assert data["gpus"]["driver_version"] and data["gpus"]["cuda_driver_version"]


def test_gpu_capture_fixture_shows_loaded_cuda_libraries_and_other_jobs() -> None:
    """The bundle captured on an H200 machine (docs/gpu-verification.md)."""
    from kk3evidence.bundle.archive import open_bundle, validate

    path = FIXTURE / "gpu-capture.tar"
    if not path.exists():
        pytest.skip("no GPU capture recorded yet")
    assert validate(path) == []
    with open_bundle(path) as b:
        fpj, notes = b.fingerprint, b.notes
    assert fpj is not None and notes is not None
    libs = {lib["name"]: lib for lib in fpj["libraries"]}
    assert {"libcuda", "libcudart", "libnccl", "libcublas", "libtorch_cuda"} <= set(libs)
    assert libs["libcuda"]["version"] == fpj["gpus"]["driver_version"]
    assert libs["libnccl"]["version"] == fpj["python"]["nccl_version"]
    assert len(libs["libnccl"]["pids"]) >= 2  # the spawned worker processes were scanned too
    assert fpj["python"]["torch_cuda"] == fpj["gpus"]["cuda_driver_version"]
    others = notes["cluster"]["gpu_processes"]
    assert others and others[0]["used_memory_bytes"] > 0


@pytest.mark.parametrize(
    ("name", "stage", "category"),
    [("gpu-oom.tar", None, "oom"), ("gpu-novisible.tar", "device_discovery", "cuda_init")],
)
def test_gpu_failure_captures_are_valid_and_analyze_to_their_cause(
    name: str, stage: str | None, category: str
) -> None:
    from kk3evidence.analysis.engine import analyze
    from kk3evidence.bundle.archive import open_bundle, validate

    path = FIXTURE / name
    if not path.exists():
        pytest.skip(f"{name} not recorded")
    assert validate(path) == []
    with open_bundle(path) as b:
        fpj, launch = b.fingerprint, b.launch
    assert fpj is not None and launch is not None
    assert fpj["gpus"]["source"] == "nvml" and launch["exit_code"] == 1
    ff = analyze(str(path)).first_failure
    assert ff is not None and ff.category == category
    if stage is not None:
        assert ff.stage == stage
