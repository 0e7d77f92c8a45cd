"""The planted secret set (environment, argv, printed text; split writes, long lines, repeats,
PEM keys, floods) goes through a real ``kk3evidence capture`` and no planted value is anywhere
in the bundle (SPEC §7). What redaction does not cover is listed in docs/security.md."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from progs.helpers import PY, all_member_bytes, base_env, prog, run_capture

from kk3evidence.bundle.archive import open_bundle, validate

HF = "hf_" + "Pl4nt3dT0k3nAbCdEfGhIjKlMnOpQr"
API_KEY = "argv-api-key-7f3e9b1c5d"
LEARNED = "Le4rnedFromTheLog-77x"
PEM_BODY = [
    "MIIEvgIBADANBgkqhkiG9w0BAQEFAASCBKgwggSkAgEAAoIBAQC7VJTUt9Us8cKj",
    "MzEfYyjiWA4R4/M2bS1GB4t7NXp98C3SC6dVMvDuictGeurT8jNbvJZHtCSuYEvu",
    "NMoSfm76oqFvAp8Gy0iz5sxjZmSnXyCdPEovGhLa0VzMaQ8s+CLOyS56YyCFGeJZ",
]
PEM = "-----BEGIN PRIVATE KEY-----\n" + "\n".join(PEM_BODY) + "\n-----END PRIVATE KEY-----"
NEW_PEM_BODY = [
    "MHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5owiNQaQqZbqPoAoGCCqGSM49",
    "AwEHoUQDQgAEPR3tU2ZAuLPDRfYVmvpGqxETMbckvQeTr5kTPF9dS6QyJ6q6dmYk",
]
NEW_PEM = (
    "-----BEGIN EC PRIVATE KEY-----\n" + "\n".join(NEW_PEM_BODY) + "\n-----END EC PRIVATE KEY-----"
)
PATTERN_SECRETS = {
    "cookie": "sessionid=c00k1eValue99; csrftoken=zz88yy77",
    "curl": "S3cretCurlPa55",
    "stripe": "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc",
    "google": "AIza" + "SyA1234567890abcdefghijklmnopqrstu",
    "slack": "T0001/B0002/XXXXsl4ckW3bh00kXXXX",
    "json_token": "json token with spaces 123",
    "json_password": "json-pass-Qq11",
    "openai": "sk-" + "proj-A1b2C3d4E5f6G7h8I9j0K1l2",
    "github": "ghp_" + "0123456789abcdefABCDEF0123456789abcd",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJwbGFudGVkIn0.c2lnbmF0dXJl",
    "akid": "AKIA" + "IOSFODNN7PLANTED",
    "bearer": "Op4que.Bearer-Tok3n",
    "url": "url-pa55-w0rd",
}
SAMPLES = "\n".join(
    [
        f"Cookie: {PATTERN_SECRETS['cookie']}",
        f"+ curl -u admin:{PATTERN_SECRETS['curl']} http://127.0.0.1:1/",
        f"stripe {PATTERN_SECRETS['stripe']} google {PATTERN_SECRETS['google']}",
        f"hook https://hooks.slack.com/services/{PATTERN_SECRETS['slack']}",
        json.dumps(
            {"token": PATTERN_SECRETS["json_token"], "password": PATTERN_SECRETS["json_password"]}
        ),
        f"{PATTERN_SECRETS['openai']} {PATTERN_SECRETS['github']} {PATTERN_SECRETS['jwt']}",
        f"{PATTERN_SECRETS['akid']} Authorization: Bearer {PATTERN_SECRETS['bearer']}",
        f"pip https://bob:{PATTERN_SECRETS['url']}@pypi.internal/simple",
        NEW_PEM,
    ]
)


def _planted_values() -> list[str]:
    return [HF, API_KEY, LEARNED, *PEM_BODY, *NEW_PEM_BODY, *PATTERN_SECRETS.values()]


@pytest.mark.slow
def test_no_planted_secret_reaches_the_bundle(tmp_path: Path) -> None:
    bundle = tmp_path / "b.tar"
    env = base_env(
        HF_TOKEN=HF,
        TLS_PRIVATE_KEY=PEM,
        PLANTED_LEARNED=LEARNED,
        PLANTED_SAMPLES=SAMPLES,
        PLANTED_FLOOD_BATCHES="40",
    )
    cmd = [PY, prog("planted.py"), "--api-key", API_KEY]
    ran = run_capture(bundle, cmd, env=env, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert HF.encode() in ran.stdout  # the terminal sees the real output
    assert validate(bundle) == []
    data = all_member_bytes(bundle)
    leaked = [v for v in _planted_values() if v.encode() in data]
    assert leaked == []
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
    assert all(HF not in n for n in names)
    with open_bundle(bundle) as b:
        manifest = b.manifest
        log = b.read_bytes("logs/combined.log")
    # nothing dropped: the flood (4,000 long lines carrying the secret) is all there
    assert manifest["losses"] == []
    assert log.count(b"F" * 3000) == 4000
    assert log.endswith(b"done\n")
    kinds = {r["kind"] for r in manifest["redactions"]}
    assert {"HF_TOKEN", "private_key", "cookie", "user_password", "json_secret"} <= kinds


@pytest.mark.slow
def test_a_78_mb_burst_of_secret_bearing_lines_is_recorded_whole_and_redacted(
    tmp_path: Path,
) -> None:
    """The issue's burst: 78 MB of 3 KB lines each carrying HF_TOKEN, far more than the
    writer's 32 MiB queue. Capture holds CMD back instead of dropping (backpressure): every
    line is in the bundle, redacted, and nothing is lost."""
    bundle = tmp_path / "b.tar"
    env = base_env(
        HF_TOKEN=HF,
        TLS_PRIVATE_KEY=PEM,
        PLANTED_LEARNED=LEARNED,
        PLANTED_SAMPLES=SAMPLES,
        PLANTED_FLOOD_BATCHES="257",  # 25,700 lines of 3,031 bytes: 78 MB
    )
    cmd = [PY, prog("planted.py"), "--api-key", API_KEY]
    ran = run_capture(bundle, cmd, env=env, timeout=600)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.count(b"F" * 3000 + HF.encode()) == 25_700
    assert validate(bundle) == []
    with open_bundle(bundle) as b:
        manifest = b.manifest
        log = b.read_bytes("logs/combined.log")
    assert manifest["losses"] == []
    assert log.count(b"F" * 3000 + b"<redacted:") == 25_700
    assert HF.encode() not in log
    assert log.endswith(b"done\n")
