"""Build valid and hostile bundles for tests. Import it from any test module:

    from bundle_factory import write_bundle, RawMember, build_tar, valid_raw_members

``write_bundle`` goes through the real :class:`~kk3evidence.bundle.archive.BundleWriter`;
``build_tar`` writes tar bytes header by header (declared sizes, types, names, pax records
and end markers are all under the caller's control), so every hostile shape can be made.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kk3evidence.bundle.archive import BundleWriter
from kk3evidence.bundle.redact import Redactor

CREATED = datetime(2026, 11, 30, 1, 2, 3, tzinfo=UTC)
TOP = "kk3-test"
SAMPLE_LOG = (
    b"(APIServer pid=1) INFO 11-30 01:47:53 [api_utils.py:286] non-default args: {}\n"
    b"\x1b[32mINFO\x1b[0m colour\r\n"
    b"Loading weights: 50%|#####     |\rLoading weights: 100%|##########|\n"
    b"bad utf-8 \xff\xfe and NUL \x00 here\n"
    b"last line without newline"
)


def launch_doc(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": "kk3evidence/launch/v1",
        "argv": ["vllm", "serve", "/models/tiny", "--port", "8000"],
        "cwd": "/srv",
        "pid": 4242,
        "started_at": "2026-11-30T01:02:03.000Z",
        "ended_at": "2026-11-30T01:03:00.500Z",
        "exit_code": 1,
        "signal": None,
        "exit_status": 1,
        "ready_seconds": None,
        "api": {"host": "127.0.0.1", "port": 8000, "base_url": "http://127.0.0.1:8000"},
        "served_model": "tiny",
        "stages_reached": ["device_discovery", "engine_init"],
        "interrupted_by": None,
    }
    doc.update(over)
    return doc


def fingerprint_doc(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": "kk3evidence/fingerprint/v1",
        "collected_at": "2026-11-30T01:02:03Z",
        "host": {
            "hostname": "node1",
            "kernel": "6.1.0",
            "os": "Debian GNU/Linux 12",
            "arch": "x86_64",
            "cpu_count": 2,
            "mem_total_bytes": 25769803776,
        },
        "gpus": {
            "source": "nvml",
            "driver_version": "580.65.06",
            "cuda_driver_version": "13.0",
            "nvml_version": "13.580.65.06",
            "devices": [
                {
                    "index": 0,
                    "name": "NVIDIA H200",
                    "uuid": "GPU-0000",
                    "pci_bus_id": "00000000:18:00.0",
                    "memory_total_bytes": 150 * 2**30,
                    "memory_used_bytes": 0,
                    "compute_capability": "9.0",
                    "mig_mode": None,
                    "ecc_mode": "enabled",
                    "processes": [{"pid": 7, "name": "python", "used_memory_bytes": 1024}],
                }
            ],
        },
        "container": {
            "runtime": "docker",
            "runtime_source": "/.dockerenv",
            "image_ref": "vllm/vllm-openai:kimi-k3",
            "image_ref_source": "env",
            "image_id": None,
            "image_id_source": None,
        },
        "python": {
            "interpreter": "/usr/bin/python3",
            "python_version": "3.11.7",
            "vllm_version": "0.32.0",
            "torch_version": "2.13.0",
            "torch_cuda": "13.0",
            "cuda_device_count": 1,
            "nccl_version": "2.27.3",
            "source": "probe",
        },
        "env": {"CUDA_VISIBLE_DEVICES": "0"},
        "libraries": [{"name": "libcudart", "path": "/usr/lib/libcudart.so.13", "version": "13.0"}],
        "probes": [
            {"name": "nvml", "ok": True, "seconds": 0.01, "error": None, "truncated": False}
        ],
    }
    doc.update(over)
    return doc


def notes_doc(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": "kk3evidence/notes/v1",
        "notes": ["first try on the shared cluster"],
        "changes": [{"variable": "image", "from": "a", "to": "b", "at": "2026-11-30T00:00:00Z"}],
        "cluster": {"gpu_processes": [], "text": "no other jobs"},
    }
    doc.update(over)
    return doc


def request_doc(name: str = "fixed", **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": "kk3evidence/request/v1",
        "name": name,
        "kind": "fixed",
        "method": "POST",
        "url": "http://127.0.0.1:8000/v1/chat/completions",
        "request_headers": {"Content-Type": "application/json"},
        "request_body": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
        "sent_at": "2026-11-30T01:02:59Z",
        "status": 200,
        "error": None,
        "latency_s": 0.25,
        "response_body": {"choices": []},
        "usage": {"prompt_tokens": 5, "completion_tokens": 1},
        "cached_tokens": None,
    }
    doc.update(over)
    return doc


def analysis_doc(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": "kk3evidence/analysis/v1",
        "source": "run.tar",
        "lines_total": 5,
        "last_stage_reached": "engine_init",
        "stages": [{"stage": "engine_init", "status": "failed", "first_line": 1, "last_line": 4}],
        "first_failure": {
            "stage": "engine_init",
            "category": "oom",
            "rule": "OOM001",
            "line_no": 4,
            "text": "torch.OutOfMemoryError: CUDA out of memory",
            "process": "EngineCore_DP0 pid=12",
        },
        "consequences": [{"line_no": 5, "rule": "CONS001", "text": "Engine core failed"}],
        "findings": [],
    }
    doc.update(over)
    return doc


def write_bundle(
    out: Path,
    *,
    log: bytes = SAMPLE_LOG,
    documents: Mapping[str, Any] | None = None,
    extra: Mapping[str, bytes] | None = None,
    redactor: Redactor | None = None,
    created: datetime = CREATED,
    bundle_id: str = "test",
) -> Path:
    """A valid bundle at ``out`` (gzip if it ends .tar.gz/.tgz), written by BundleWriter."""
    staging = out.with_name(out.name + ".staging")
    writer = BundleWriter(staging, created=created, bundle_id=bundle_id, redactor=redactor)
    docs: dict[str, Any] = {
        "fingerprint.json": fingerprint_doc(),
        "launch.json": launch_doc(),
        "notes.json": notes_doc(),
        "requests/fixed.json": request_doc(),
    }
    if documents is not None:
        docs.update(documents)
    for name, doc in docs.items():
        if doc is not None:
            writer.write_json(name, doc)
    with writer.open_stream("logs/combined.log") as fp:
        fp.write(log)
    writer.add_bytes("metrics/before.prom", b"# HELP vllm:num_requests_running x\nvllm:x 0\n")
    for name, data in (extra or {}).items():
        writer.add_bytes(name, data)
    return writer.finalize(out)


# --- raw, header-by-header tar building ---------------------------------------------------


@dataclass(frozen=True)
class RawMember:
    """One tar entry. ``size`` overrides the declared size (data is written as given)."""

    name: str
    data: bytes = b""
    type: bytes = tarfile.REGTYPE
    linkname: str = ""
    size: int | None = None
    pax: dict[str, str] = field(default_factory=dict)
    devmajor: int = 0
    devminor: int = 0


def header(member: RawMember) -> bytes:
    info = tarfile.TarInfo(member.name)
    info.type = member.type
    info.linkname = member.linkname
    info.size = len(member.data) if member.size is None else member.size
    if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE):
        info.size = 0 if member.size is None else member.size
    info.mtime = int(CREATED.timestamp())
    info.mode = 0o755 if member.type == tarfile.DIRTYPE else 0o644
    info.devmajor = member.devmajor
    info.devminor = member.devminor
    if member.pax:
        info.pax_headers = dict(member.pax)
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def tar_bytes(
    members: Iterable[RawMember], *, end_marker: bool = True, trailing: bytes = b""
) -> bytes:
    out = bytearray()
    for m in members:
        out += header(m)
        out += m.data
        if len(m.data) % tarfile.BLOCKSIZE:
            out += b"\0" * (tarfile.BLOCKSIZE - len(m.data) % tarfile.BLOCKSIZE)
    if end_marker:
        out += b"\0" * (2 * tarfile.BLOCKSIZE)
    out += trailing
    return bytes(out)


def build_tar(
    out: Path,
    members: Iterable[RawMember],
    *,
    gz: bool = False,
    end_marker: bool = True,
    trailing: bytes = b"",
) -> Path:
    data = tar_bytes(members, end_marker=end_marker, trailing=trailing)
    out.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return out


def manifest_doc(files: Mapping[str, bytes], **over: Any) -> dict[str, Any]:
    """A correct manifest for member name -> data (names relative to the top folder)."""
    doc: dict[str, Any] = {
        "schema": "kk3evidence/bundle/v1",
        "tool": {"name": "kk3evidence", "version": "0.1.0"},
        "bundle_id": "test",
        "created": "2026-11-30T01:02:03.000Z",
        "members": [
            {"name": n, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
            for n, d in files.items()
            if n != "manifest.json"
        ],
        "not_collected": [],
        "redactions": [],
        "losses": [],
        "sealed_from_staging": False,
    }
    doc.update(over)
    return doc


def dumps(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()


def valid_files() -> dict[str, bytes]:
    """Member name -> bytes of a small valid bundle (without the manifest)."""
    return {
        "fingerprint.json": dumps(fingerprint_doc()),
        "launch.json": dumps(launch_doc()),
        "logs/combined.log": SAMPLE_LOG,
    }


def valid_raw_members(
    files: Mapping[str, bytes] | None = None,
    *,
    top: str = TOP,
    manifest: Mapping[str, Any] | None = None,
    listed: Mapping[str, bytes] | None = None,
) -> list[RawMember]:
    """Raw members of a valid bundle: the manifest (listing ``listed``, default ``files``)
    first, then ``files`` in order."""
    files = dict(valid_files() if files is None else files)
    doc = dict(manifest) if manifest is not None else manifest_doc(listed if listed else files)
    out = [RawMember(f"{top}/manifest.json", dumps(doc))]
    out += [RawMember(f"{top}/{name}", data) for name, data in files.items()]
    return out


def with_member(members: list[RawMember], index: int, **changes: Any) -> list[RawMember]:
    copy = list(members)
    copy[index] = replace(copy[index], **changes)
    return copy
