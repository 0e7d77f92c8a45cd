"""Redaction at capture time: no planted secret reaches a bundle; placeholders are consistent;
only the secret bytes change."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from bundle_factory import fingerprint_doc, launch_doc, request_doc, write_bundle
from hypothesis import given, settings
from hypothesis import strategies as st

from kk3evidence.bundle.archive import open_bundle, validate
from kk3evidence.bundle.redact import Redactor, is_secret_flag, is_secret_header, is_secret_name

HF = "hf_" + "q7Wm3Zr9Kp2Lx8Vb4Nt6Yc1Hd5Gf0Js"
OPENAI = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6"
JWT = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJrazMiLCJpYXQiOjE3MDB9.c2lnbmF0dXJlLWJ5dGVz"
AKID = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
VLLM_KEY = "vllm-key-Zx81-qq"
BEARER = "tok.Opaque_Bearer-9988"
URL_PASS = "p4ss-w0rd-in-url"
GH = "ghp_" + "0123456789abcdefABCDEF0123456789abcd"
COOKIE = "session=deadbeefcafe1234"
PASSWORD_ARG = "Hunter2!Hunter2!"
PLANTED = [HF, OPENAI, JWT, AKID, AWS_SECRET, VLLM_KEY, BEARER, URL_PASS, GH, COOKIE, PASSWORD_ARG]

ENV = {
    "HF_TOKEN": HF,
    "HUGGING_FACE_HUB_TOKEN": HF,
    "VLLM_API_KEY": VLLM_KEY,
    "OPENAI_API_KEY": OPENAI,
    "AWS_ACCESS_KEY_ID": AKID,
    "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
    "GITHUB_TOKEN": GH,
    "DB_PASSWORD": PASSWORD_ARG,
    "PIP_INDEX_URL": f"https://builder:{URL_PASS}@pypi.internal/simple",
    "MY_CUSTOM_VAR": f"prefix {JWT} suffix",
    "CUDA_VISIBLE_DEVICES": "0,1",
    "TOKENIZERS_PARALLELISM": "false",
    "PWD": "/srv",
    "VLLM_ENGINE_READY_TIMEOUT_S": "3600",
}
ARGV = [
    "vllm",
    "serve",
    "moonshotai/Kimi-K3",
    "--api-key",
    VLLM_KEY,
    f"--hf-token={HF}",
    "--password",
    PASSWORD_ARG,
    "-H",
    f"Authorization: Bearer {BEARER}",
    "--header",
    f"Cookie: {COOKIE}",
    "--tensor-parallel-size",
    "8",
    "--tokenizer",
    "moonshotai/Kimi-K3",
    "--max-tokens",
    "128",
]
HEADERS = {"Authorization": f"Bearer {BEARER}", "Content-Type": "application/json"}
LOG = [
    f"(APIServer pid=1) INFO non-default args: {{'api_key': ['{VLLM_KEY}'], 'hf_token': '{HF}'}}\n",
    f"\x1b[33mWARNING\x1b[0m using token {HF} from env\r\n",
    f"openai key {OPENAI} and github {GH}\n",
    f"auth header Authorization: Bearer {BEARER}\n",
    f"jwt={JWT}\n",
    f"aws {AKID} aws_secret_access_key = {AWS_SECRET}\n",
    f"pip from https://builder:{URL_PASS}@pypi.internal/simple\n",
    f"cookie: {COOKIE} password={PASSWORD_ARG}\n",
    "INFO 11-30 01:47:53 [model.py:2152] Using max model len 512\n",
]


def _redacted_bundle(tmp_path: Path, suffix: str = ".tar.gz") -> Path:
    r = Redactor()
    fp = fingerprint_doc(env=r.env(ENV, where="fingerprint.json $.env"))
    launch = launch_doc(argv=r.argv(ARGV, where="launch.json $.argv"))
    req = request_doc(request_headers=r.headers(HEADERS, where="requests/fixed.json headers"))
    log = b"".join(r.text(line.encode() + b"\xff", where="logs/combined.log") for line in LOG)
    return write_bundle(
        tmp_path / f"run{suffix}",
        log=log,
        documents={"fingerprint.json": fp, "launch.json": launch, "requests/fixed.json": req},
        redactor=r,
    )


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
def test_no_planted_secret_appears_anywhere_in_the_bundle(tmp_path: Path, suffix: str) -> None:
    out = _redacted_bundle(tmp_path, suffix)
    raw = out.read_bytes()
    if suffix == ".tar.gz":
        raw = gzip.decompress(raw)
    for secret in PLANTED:
        assert secret.encode() not in raw, f"secret {secret[:6]}… leaked"
        # Also not in a JSON-escaped form.
        assert json.dumps(secret)[1:-1].encode() not in raw
    assert validate(out) == []


def test_manifest_lists_what_was_redacted_and_where_never_the_value(tmp_path: Path) -> None:
    out = _redacted_bundle(tmp_path)
    with open_bundle(out) as b:
        records = b.redactions
        text = json.dumps(b.manifest)
    assert records
    for secret in PLANTED:
        assert secret not in text
    hf = next(r for r in records if r["kind"] == "HF_TOKEN")
    assert any(w.startswith("fingerprint.json") for w in hf["where"])
    assert any(w.startswith("launch.json") for w in hf["where"])
    assert "logs/combined.log" in hf["where"]


def test_same_secret_gets_the_same_placeholder_everywhere(tmp_path: Path) -> None:
    out = _redacted_bundle(tmp_path)
    with open_bundle(out) as b:
        assert b.fingerprint is not None and b.launch is not None
        env = b.fingerprint["env"]
        argv = b.launch["argv"]
        log = b"".join(b.iter_log_lines())
    ph = env["HF_TOKEN"]
    assert re.fullmatch(r"<redacted:HF_TOKEN#\d+>", ph)
    assert env["HUGGING_FACE_HUB_TOKEN"] == ph
    assert argv[5] == f"--hf-token={ph}"
    assert log.count(ph.encode()) >= 2
    assert argv[4] == env["VLLM_API_KEY"]
    assert argv[3] == "--api-key"


def test_non_secrets_are_left_alone() -> None:
    r = Redactor()
    env = r.env(ENV)
    for name in (
        "CUDA_VISIBLE_DEVICES",
        "TOKENIZERS_PARALLELISM",
        "PWD",
        "VLLM_ENGINE_READY_TIMEOUT_S",
    ):
        assert env[name] == ENV[name]
    argv = r.argv(ARGV)
    assert argv[-6:] == ARGV[-6:]
    assert argv[:3] == ARGV[:3]
    line = b"INFO 11-30 01:47:53 [model.py:2152] max model len 512; max_num_batched_tokens=8192\n"
    assert r.text(line) == line
    assert (
        r.text(b"api key is not set; password: None\n") == b"api key is not set; password: None\n"
    )


def test_authorization_scheme_word_is_kept() -> None:
    r = Redactor()
    out = r.headers({"Authorization": f"Bearer {BEARER}"})
    assert re.fullmatch(r"Bearer <redacted:Authorization#1>", out["Authorization"])
    pairs = r.headers([("X-Api-Key", "abcdef123456"), ("Accept", "*/*")])
    assert pairs[0][1].startswith("<redacted:X-Api-Key#") and pairs[1] == ("Accept", "*/*")


def test_text_keeps_every_non_secret_byte() -> None:
    r = Redactor()
    line = b"\x1b[31m\x00\xff\xfe " + HF.encode() + b" \r tail\xc3\x28\n"
    out = r.text(line)
    assert out == b"\x1b[31m\x00\xff\xfe <redacted:hf_token#1> \r tail\xc3\x28\n"
    assert r.text(line.decode("latin-1")) == out.decode("latin-1")


@settings(max_examples=200, deadline=None)
@given(
    before=st.binary(max_size=60),
    after=st.binary(max_size=60),
    secret=st.text(
        alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJ0123456789_-", min_size=8, max_size=40
    ),
)
def test_known_secret_is_replaced_and_nothing_else_changes(
    before: bytes, after: bytes, secret: str
) -> None:
    r = Redactor()
    ph = r.add_known(secret, "MY_TOKEN").encode()
    line = before + b" " + secret.encode() + b" " + after
    out = r.text(line)
    assert secret.encode() not in out
    # Everything outside secrets is kept: removing placeholders leaves only what was around.
    if out.count(b"<redacted:") == 1:
        assert out == before + b" " + ph + b" " + after


def test_placeholders_are_stable_and_numbered_in_order() -> None:
    r = Redactor()
    a = r.value("aaaaaaaa1", "A_TOKEN", where="x")
    b = r.value("bbbbbbbb2", "B_TOKEN", where="y")
    assert (a, b) == ("<redacted:A_TOKEN#1>", "<redacted:B_TOKEN#2>")
    assert r.value("aaaaaaaa1", "OTHER", where="z") == a
    assert r.records()[0]["where"] == ["x", "z"] and r.records()[0]["count"] == 2


def test_user_key_adds_an_hmac_tag_equal_across_bundles(tmp_path: Path) -> None:
    key = tmp_path / "redact.key"
    key.write_bytes(b"a per-user secret key\n")
    one = Redactor.with_user_key(key).value(HF, "HF_TOKEN", where="env")
    two = Redactor.with_user_key(key).value(HF, "HF_TOKEN", where="env")
    other = Redactor(key=b"someone else").value(HF, "HF_TOKEN", where="env")
    assert one == two and re.fullmatch(r"<redacted:HF_TOKEN#1:[0-9a-f]{12}>", one)
    assert one != other
    assert Redactor.with_user_key(tmp_path / "absent.key").value(HF, "X", where="e").endswith("#1>")


def test_json_values_under_secret_keys_are_redacted() -> None:
    r = Redactor()
    out = r.json({"hf_token": HF, "nested": [{"api_key": "k" * 12}], "ok": "fine"})
    assert out["hf_token"].startswith("<redacted:")
    assert out["nested"][0]["api_key"].startswith("<redacted:")
    assert out["ok"] == "fine"


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("HUGGING_FACE_HUB_TOKEN", True),
        ("VLLM_API_KEY", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("WANDB_API_KEY", True),
        ("MY_PASSWORD_FILE", True),
        ("GOOGLE_APPLICATION_CREDENTIALS", True),
        ("DB_PASS", True),
        ("TOKENIZERS_PARALLELISM", False),
        ("PWD", False),
        ("CUDA_VISIBLE_DEVICES", False),
        ("VLLM_ENGINE_READY_TIMEOUT_S", False),
        ("NCCL_DEBUG", False),
        ("MAX_NUM_BATCHED_TOKENS_X", False),
    ],
)
def test_secret_env_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


@pytest.mark.parametrize(
    ("flag", "secret"),
    [
        ("--api-key", True),
        ("--hf-token", True),
        ("--token", True),
        ("--password", True),
        ("--client-secret", True),
        ("--tokenizer", False),
        ("--max-tokens", False),
        ("--ssl-keyfile", False),
        ("--skip-tokenizer-init", False),
    ],
)
def test_secret_flags(flag: str, secret: bool) -> None:
    assert is_secret_flag(flag) is secret


def test_secret_headers() -> None:
    assert is_secret_header("Authorization") and is_secret_header("proxy-authorization")
    assert is_secret_header("Cookie") and is_secret_header("X-Api-Key")
    assert not is_secret_header("Content-Type") and not is_secret_header("Accept")


def test_api_key_with_several_values_redacts_them_all() -> None:
    r = Redactor()
    out = r.argv(["vllm", "serve", "m", "--api-key", "first-key-1", "second-key-2", "--port", "1"])
    assert out[3] == "--api-key"
    assert out[4].startswith("<redacted:") and out[5].startswith("<redacted:")
    assert out[6:] == ["--port", "1"]
    # Other secret flags take exactly one value.
    out = r.argv(["x", "--token", "tok-123456", "positional"])
    assert out[3] == "positional"


def test_escaped_spellings_of_a_known_secret_are_redacted_too() -> None:
    r = Redactor()
    secret = 'p@ss:w/rd"quoted\\x'
    ph = r.value(secret, "DB_PASSWORD", where="env")
    for spelling in (json.dumps(secret)[1:-1], "p%40ss%3Aw%2Frd%22quoted%5Cx"):
        line = f"config {spelling} end\n".encode()
        assert r.text(line) == f"config {ph} end\n".encode()


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        (f"x {HF} y", "hf_token"),
        (f"x {OPENAI} y", "openai_key"),
        (f"x {GH} y", "github_token"),
        (f"x {JWT} y", "jwt"),
        (f"x {AKID} y", "aws_access_key_id"),
        (f"AWS_Secret_Access_Key: {AWS_SECRET}", "aws_secret_access_key"),
        ("PROXY-AUTHORIZATION: Digest abcdef123456", "authorization"),
        ("sent with BEARER abc.def-123456", "bearer"),
        ("git clone https://me:tok3n-value@git.example/x", "url_password"),
        ("cmd --HF-TOKEN=abcdefgh123", "secret_flag"),
        ('{"Client_Secret": "abcdefgh123"}', "secret_assignment"),
        ("refresh-token = zzzzzzzzzz", "secret_assignment"),
    ],
)
def test_every_text_pattern_finds_its_sample_in_any_letter_case(line: str, kind: str) -> None:
    r = Redactor()
    out = r.text(line + "\n")
    assert f"<redacted:{kind}#1>" in out, out
    assert [rec["kind"] for rec in r.records()] == [kind]


def test_the_api_capture_prefilters_log_blocks_with() -> None:
    """capture's LogRedactor sends a line to ``text`` only if it holds one of ``anchors`` or
    ``known_values()``, or ``in_block`` is set; ``learned`` says when to look again."""
    r = Redactor()
    assert r.anchors and all(a == a.lower() for a in r.anchors)
    assert {b"hf_", b"bearer", b"-----begin"} <= set(r.anchors)
    assert r.known_values() == () and r.learned == 0 and not r.in_block
    plain = b"INFO 11-30 engine started in 3.2 s\n"
    assert not any(a in plain.lower() for a in r.anchors) and r.text(plain) == plain
    r.env({"MY_PASSWORD": "s3cretValue99", "HOME": "/root"})
    assert r.learned == 1 == len(r.records())
    known = r.known_values()
    assert b"s3cretValue99" in known
    assert [len(v) for v in known] == sorted((len(v) for v in known), reverse=True)
    assert r.text(b"saw s3cretValue99\n") == b"saw <redacted:MY_PASSWORD#1>\n"
    r.text(b"Authorization: Bearer abcdefghijklmnop\n")
    assert r.learned == 2 and b"abcdefghijklmnop" in r.known_values()
    r.text(b"-----BEGIN RSA PRIVATE KEY-----\n")
    assert r.in_block
