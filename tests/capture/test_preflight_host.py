"""preflight's host probes on real files, sockets and processes; capture --preflight."""

from __future__ import annotations

import json
import os
import socket
import struct
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from progs.helpers import PY, base_env, free_port, run_capture

from kk3evidence.bundle.archive import open_bundle, validate
from kk3evidence.capture.preflight_host import probe_model, probe_port, run_preflight


def write_safetensors(path: Path, data_bytes: int, *, cut: int = 0) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [data_bytes // 4],
                               "data_offsets": [0, data_bytes]}}).encode()
    blob = struct.pack("<Q", len(header)) + header + b"\0" * data_bytes
    path.write_bytes(blob[: len(blob) - cut])


def model_dir(tmp_path: Path, **config: object) -> Path:
    m = tmp_path / "model"
    m.mkdir()
    (m / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **config}))
    (m / "tokenizer.json").write_text("{}")
    return m


def test_truncated_safetensors_is_found_from_its_header(tmp_path: Path) -> None:
    m = model_dir(tmp_path)
    write_safetensors(m / "model.safetensors", 4096, cut=100)
    facts = probe_model(str(m), {}, None, None)
    (st,) = [f for f in facts.files if f.name == "model.safetensors"]
    assert st.header_problem and "truncated" in st.header_problem


def test_whole_safetensors_and_lfs_pointer(tmp_path: Path) -> None:
    m = model_dir(tmp_path)
    write_safetensors(m / "a.safetensors", 4096)
    (m / "b.safetensors").write_text(
        "version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 123\n")
    files = {f.name: f for f in probe_model(str(m), {}, None, None).files}
    assert files["a.safetensors"].header_problem is None
    assert files["b.safetensors"].lfs_pointer


def test_hf_cache_snapshot_is_resolved_and_offline_miss_is_not_remote(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    snap = hub / "models--org--name" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (hub / "models--org--name" / "refs").mkdir()
    (hub / "models--org--name" / "refs" / "main").write_text("abc123")
    found = probe_model("org/name", {"HF_HUB_CACHE": str(hub)}, None, None)
    assert found.path == str(snap) and "abc123" in found.how
    missing = probe_model("org/other", {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"},
                          None, None)
    assert missing.path is None and not missing.remote


def test_a_listening_port_is_taken_and_its_holder_named() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        facts = probe_port("127.0.0.1", port)
    assert facts.free is False
    assert any(f"pid {os.getpid()} " in h for h in facts.holders)
    assert probe_port("127.0.0.1", port).free is True


def fake_vllm(tmp_path: Path) -> Path:
    """A `vllm` program that prints one line and exits 1 (no real server)."""
    script = tmp_path / "bin" / "vllm"
    script.parent.mkdir()
    script.write_text(f"#!{PY}\nimport sys\nprint('fake vllm', sys.argv[1:])\nsys.exit(1)\n")
    script.chmod(0o755)
    return script


def test_run_preflight_on_a_missing_model_fails(tmp_path: Path) -> None:
    vllm = fake_vllm(tmp_path)
    result = run_preflight([str(vllm), "serve", str(tmp_path / "nope"), "--port",
                            str(free_port())], env={"PATH": os.environ.get("PATH", "")})
    assert result.exit_code == 6
    assert "model.location" in {c.id for c in result.failed}


def test_capture_preflight_stores_a_valid_redacted_preflight_json(tmp_path: Path) -> None:
    vllm = fake_vllm(tmp_path)
    m = model_dir(tmp_path, num_attention_heads=4, num_hidden_layers=2,
                  max_position_embeddings=2048, hidden_size=128)
    write_safetensors(m / "model.safetensors", 4096)
    secret = "sk-preflightsecret0123456789abcdef"
    bundle = tmp_path / "run.tar"
    ran = run_capture(bundle, [str(vllm), "serve", str(m), "--port", str(free_port()),
                               "--api-key", secret, "--max-model-len", "99999"],
                      ["--preflight", "--no-probe"])
    assert ran.returncode == 1  # the command's own status: preflight never changes it
    assert b"preflight: " in ran.stderr and b"memory.context-length" in ran.stderr
    assert validate(bundle) == []
    with open_bundle(bundle) as b:
        doc = b.preflight
        raw = b"".join(b.read_bytes(n) for n in b.names())
    assert doc is not None and doc["schema"] == "kk3evidence/preflight/v1"
    assert "memory.context-length" in {c["id"] for c in doc["checks"] if c["status"] == "fail"}
    assert secret.encode() not in raw


def test_capture_without_preflight_writes_no_preflight_member(tmp_path: Path) -> None:
    bundle = tmp_path / "run.tar"
    ran = run_capture(bundle, [PY, "-c", "print('x')"], env=base_env())
    assert ran.returncode == 0
    with open_bundle(bundle) as b:
        assert "preflight.json" not in b.names()


def test_nvml_facts_flow_into_the_gpu_memory_checks(tmp_path: Path) -> None:
    """The probe path with NVML (injected, pynvml's names): budgets, other jobs, visibility."""
    from capture.test_fingerprint import FakeNvml

    gib = 1 << 30
    nvml = FakeNvml([
        {"name": "NVIDIA H200", "uuid": "GPU-a", "bus": "0:18", "total": 141 * gib,
         "used": 100 * gib, "mig": None, "procs": [(4242, 100 * gib)]},
        {"name": "NVIDIA H200", "uuid": "GPU-b", "bus": "0:2A", "total": 141 * gib,
         "used": 0, "mig": None, "procs": []},
    ])
    vllm = fake_vllm(tmp_path)
    m = model_dir(tmp_path, num_attention_heads=8, num_hidden_layers=2,
                  max_position_embeddings=2048, hidden_size=256)
    write_safetensors(m / "model.safetensors", 64 << 20)
    env = {"PATH": os.environ.get("PATH", "")}
    argv = [str(vllm), "serve", str(m), "--port", str(free_port())]
    result = run_preflight([*argv, "-tp", "2"], env=env, nvml=nvml)
    by_id = {c.id: c for c in result.checks}
    assert by_id["flags.world-size"].status == "pass"
    assert by_id["host.gpu-jobs"].status == "warn"
    assert any("pid 4242" in e for e in by_id["host.gpu-jobs"].evidence)
    assert by_id["memory.weights-fit"].status == "pass"  # 32 MiB per rank in ~27 GiB
    hidden = run_preflight([*argv, "-tp", "2"], env={**env, "CUDA_VISIBLE_DEVICES": "1"},
                           nvml=nvml)
    assert "flags.world-size" in {c.id for c in hidden.failed}


TMP_OK = HealthCheck.function_scoped_fixture  # each example rewrites the same files


@settings(max_examples=60, deadline=None, suppress_health_check=[TMP_OK])
@given(blob=st.binary(max_size=2048), config=st.binary(max_size=512))
def test_any_bytes_as_weights_or_config_never_crash_the_probe(tmp_path: Path, blob: bytes,
                                                              config: bytes) -> None:
    m = tmp_path / "m"
    m.mkdir(exist_ok=True)
    (m / "config.json").write_bytes(config)
    (m / "model.safetensors").write_bytes(blob)
    facts = probe_model(str(m), {}, None, None)
    (st_file,) = [f for f in facts.files if f.name == "model.safetensors"]
    assert st_file.size == len(blob)
    # a Git LFS pointer, a consistent header or a stated problem; a bad config is a stated
    # error (Hypothesis draws the LFS pointer text from the probe's own constants)
    assert (
        st_file.lfs_pointer
        or st_file.header_problem is not None
        or st_file.expected_size == len(blob)
    )
    assert (facts.config is None) == (facts.config_error is not None)


@given(header_len=st.integers(min_value=3, max_value=(1 << 64) - 1))  # 2 + "{}" is valid
@settings(max_examples=40, deadline=None, suppress_health_check=[TMP_OK])
def test_a_huge_declared_header_is_a_problem_not_a_read(tmp_path: Path, header_len: int) -> None:
    p = tmp_path / "m2"
    p.mkdir(exist_ok=True)
    (p / "w.safetensors").write_bytes(struct.pack("<Q", header_len) + b"{}")
    (f,) = probe_model(str(p), {}, None, None).files
    assert f.header_problem is not None
