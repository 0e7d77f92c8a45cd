"""Redaction of secrets at capture time (SPEC §3), with consistent placeholders.

One :class:`Redactor` per bundle. Every secret value gets one placeholder for the whole bundle,
``<redacted:LABEL#N>`` (``LABEL`` is where it was first seen: the env name, the flag, the header
or the pattern kind; ``N`` counts secrets in this bundle), so two bundles stay diff-able and a
value seen in the environment, in argv and in the log text reads the same everywhere. With a
per-user key (:meth:`Redactor.with_user_key`) the placeholder also carries a short HMAC tag
(``<redacted:HF_TOKEN#1:3f9c0a2b1d4e>``), equal across bundles of the same user for the same
secret; it is never a plain hash of the secret.

What is redacted:

* environment: values of secret-looking names (``*_TOKEN``, ``*_KEY``, ``*_SECRET``,
  ``*PASSWORD*``, ``*_CREDENTIALS``, ``HF_TOKEN``, ``VLLM_API_KEY``, …); under any other name,
  secret-looking parts of the value (the text patterns below);
* argv: values of ``--api-key``, ``--hf-token``, ``--token``, ``--password`` and any flag
  ending in ``-key``/``-token``/``-secret``/``-password`` (``--flag X`` and ``--flag=X``),
  ``-H``/``--header`` values with a secret header, ``NAME=value`` words with a secret name,
  passwords in URLs (``scheme://user:pass@host``);
* headers: ``Authorization`` (the scheme word such as ``Bearer`` is kept), ``Proxy-Authorization``,
  ``Cookie``, ``X-Api-Key`` and names containing token/secret/key/password;
* text (logs, one line at a time, as bytes): ``hf_…``, ``sk-…``, ``gh?_…`` tokens, JWTs, AWS
  access key ids and secret keys, ``Bearer <token>``, ``Authorization: …``,
  ``password=…``/``api_key: …``-style assignments, URL passwords, and every value already known
  to be secret (from env/argv/headers) wherever it appears.

Only the secret bytes change: everything else in a line (invalid UTF-8, ``\\r``, ANSI codes,
NUL) is kept byte for byte. :meth:`Redactor.records` lists each placeholder, its kind and
where it was found, for the manifest; never the value.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, overload

from kk3evidence._literals import LiteralScanner
from kk3evidence.model import JSONObject, JSONValue

__all__ = [
    "ANCHORS",
    "KEY_FILE_ENV",
    "PLACEHOLDER_RE",
    "Redactor",
    "is_secret_flag",
    "is_secret_header",
    "is_secret_name",
]

KEY_FILE_ENV = "KK3EVIDENCE_REDACT_KEY_FILE"
_DEFAULT_KEY_FILE = Path("~/.config/kk3evidence/redact.key")

# --- what looks secret ----------------------------------------------------------------------

_SECRET_NAME_SUFFIX = re.compile(
    r"(?:^|_)(?:TOKEN|TOKENS|KEY|KEYS|KEY_ID|SECRET|SECRETS|PASSWORD|PASSWD|PASS|PASSPHRASE"
    r"|CREDENTIAL|CREDENTIALS|APIKEY|AUTH|COOKIE)$",
    re.IGNORECASE,
)
_SECRET_NAME_ANY = re.compile(r"PASSWORD|PASSWD|SECRET|PRIVATE_KEY|API_KEY|APIKEY", re.IGNORECASE)
_SECRET_NAMES_EXACT = frozenset(
    {
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HUGGINGFACE_TOKEN",
        "VLLM_API_KEY",
        "OPENAI_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_ACCESS_KEY_ID",
        "WANDB_API_KEY",
        "GITHUB_TOKEN",
        "GH_TOKEN",
        "NGC_API_KEY",
        "ANTHROPIC_API_KEY",
    }
)
_NOT_SECRET_NAMES = frozenset({"PWD", "OLDPWD", "TOKENIZERS_PARALLELISM", "KEYTIMEOUT"})

_SECRET_FLAG = re.compile(
    r"^--?[A-Za-z0-9_-]*?(?:api[-_]?key|apikey|token|secret|password|passwd|passphrase"
    r"|credentials?|private[-_]key|access[-_]key)$",
    re.IGNORECASE,
)
_MULTI_VALUE_FLAGS = frozenset({"--api-key"})
_HEADER_FLAGS = frozenset({"-H", "--header", "--headers", "--http-header"})

_SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "set-cookie",
        "x-api-key",
        "api-key",
        "x-auth-token",
        "x-access-token",
    }
)
_SECRET_HEADER_ANY = re.compile(r"token|secret|api[-_]?key|password|passwd|auth", re.IGNORECASE)
_AUTH_SCHEME = re.compile(r"^\s*(Bearer|Basic|Token|Digest|Negotiate|ApiKey)\s+", re.IGNORECASE)

# Values that are never treated as secrets even under a secret name (flags, not credentials).
_TRIVIAL_VALUES = frozenset({"", "0", "1", "true", "false", "yes", "no", "none", "null"})


def is_secret_name(name: str) -> bool:
    """True if an environment variable (or JSON key) named ``name`` holds a secret."""
    upper = name.upper()
    if upper in _NOT_SECRET_NAMES:
        return False
    return (
        upper in _SECRET_NAMES_EXACT
        or _SECRET_NAME_SUFFIX.search(upper) is not None
        or _SECRET_NAME_ANY.search(upper) is not None
    )


def is_secret_flag(flag: str) -> bool:
    """True if command-line option ``flag`` (``--api-key``) takes a secret value."""
    return _SECRET_FLAG.match(flag) is not None


def is_secret_header(name: str) -> bool:
    """True if HTTP header ``name`` carries a credential."""
    low = name.strip().lower()
    return low in _SECRET_HEADERS or _SECRET_HEADER_ANY.search(low) is not None


# --- text patterns (bytes, so non-UTF-8 input is kept intact) --------------------------------
# Each pattern: (kind, regex). If the regex has a group named "v", only that part is secret.
@dataclass(frozen=True, slots=True)
class _Pattern:
    """One text pattern. The regex runs on a line only if one of ``anchors`` (lower case) is
    in the lower-cased line; group ``v`` is the secret (else the whole match). ``boundary``:
    the match may not follow a letter or digit."""

    kind: str
    anchors: tuple[bytes, ...]
    regex: re.Pattern[bytes]
    boundary: bool = False
    on_lower: bool = False  # run on the lower-cased line (same offsets: ASCII-only lowering)


def _p(
    kind: str,
    anchors: tuple[bytes, ...],
    regex: bytes,
    boundary: bool = False,
    *,
    on_lower: bool = False,
) -> _Pattern:
    return _Pattern(kind, anchors, re.compile(regex), boundary, on_lower)


_PATTERNS: tuple[_Pattern, ...] = (
    _p("hf_token", (b"hf_",), rb"hf_[A-Za-z0-9]{20,}", boundary=True),
    _p("openai_key", (b"sk-",), rb"sk-[A-Za-z0-9_-]{20,}", boundary=True),
    _p(
        "github_token",
        (b"ghp_", b"gho_", b"ghu_", b"ghs_", b"ghr_", b"github_pat_"),
        rb"(?:gh[pousr]|github_pat)_[A-Za-z0-9_]{30,}",
        boundary=True,
    ),
    _p("jwt", (b"eyj",), rb"eyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*", True),
    _p(
        "aws_access_key_id",
        (b"akia", b"asia"),
        rb"(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Z])",
        boundary=True,
    ),
    _p(
        "aws_secret_access_key",
        (b"secret",),
        rb"(?:aws_secret_access_key|aws_secret_key|secret_access_key|secretaccesskey)"
        rb"[\"']?\s*[:=]\s*[\"']?(?P<v>[a-z0-9/+=]{40})(?![a-z0-9/+=])",
        on_lower=True,
    ),
    _p(
        "authorization",
        (b"authorization",),
        rb"authorization[\"']?\s*[:=]\s*[\"']?"
        rb"(?:(?:bearer|basic|token|digest|apikey)\s+)?"
        rb"(?P<v>(?!(?:bearer|basic|token|digest|apikey)(?:\s|$))[^\s\"',;<>]{6,})",
        boundary=True,
        on_lower=True,
    ),
    _p("bearer", (b"bearer",), rb"bearer\s+(?P<v>[a-z0-9._~+/=-]{8,})", True, on_lower=True),
    _p(
        "url_password",
        (b"://",),
        rb"://[^/\s:@\"'<>]{1,256}:(?P<v>[^/\s@\"'<>]{1,256})@",
    ),
    _p(
        "secret_flag",
        tuple(
            b"--" + f
            for f in (
                b"api-key",
                b"hf-token",
                b"token",
                b"password",
                b"passwd",
                b"secret",
                b"access-token",
                b"auth-token",
            )
        ),
        rb"--(?:api-key|hf-token|token|password|passwd|secret|access-token|auth-token)"
        rb"(?:\s+|=)[\"']?(?P<v>[^\s\"'<>-][^\s\"'<>]*)",
        on_lower=True,
    ),
    _p(
        "secret_assignment",
        (
            b"passw",
            b"pwd",
            b"secret",
            *(
                a + sep + b
                for a, b in (
                    (b"api", b"key"),
                    (b"access", b"token"),
                    (b"auth", b"token"),
                    (b"hf", b"token"),
                    (b"api", b"token"),
                    (b"refresh", b"token"),
                    (b"session", b"token"),
                    (b"private", b"key"),
                )
                for sep in (b"", b"_", b"-")
            ),
        ),
        rb"(?:password|passwd|pwd|secret|api[_-]?key|apikey"
        rb"|access[_-]?token|auth[_-]?token|hf[_-]?token|api[_-]?token|refresh[_-]?token"
        rb"|session[_-]?token|client[_-]?secret|private[_-]?key)[\"']?\s*[:=]\s*[\[(]?\s*"
        rb"[\"']?(?P<v>[^\s\"',;<>\])}]{6,})",
        boundary=True,
        on_lower=True,
    ),
    _p(
        "private_key",
        (b"-----begin",),
        # A PEM private key inside one text (an env value, a JSON string with "\\n" escapes):
        # the body up to the END line, or to the end of the text if the END line is cut off.
        rb"-----begin [a-z0-9 ]*private key-----(?P<v>(?:(?!-----end)[\s\S]){16,16384})",
        on_lower=True,
    ),
    _p(
        "json_secret",
        (b'token"', b"passw", b'secret"', b'key"', b"credential", b'cookie"'),
        # "token": "…" / "password": "…": the whole JSON string, spaces included.
        rb'"[a-z0-9_.-]*(?:token|password|passwd|secret|api[_-]?key|apikey|credentials?'
        rb'|private[_-]?key|cookie)"\s*:\s*"(?P<v>(?:[^"\\\n]|\\.){4,4096})"',
        on_lower=True,
    ),
    _p(
        "cookie",
        (b"cookie",),
        rb"(?:set-)?cookie[\"']?\s*[:=]\s*[\"']?(?P<v>[^\s\"'](?:[^\r\n\"']{0,4096}[^\s\"'])?)",
        boundary=True,
        on_lower=True,
    ),
    _p(
        "user_password",
        (b"-u", b"--user"),
        # curl -u user:pass / --user=user:pass (only the password after the colon).
        rb"(?:^|[\s\"'])(?:-u\s*|--user(?:\s+|=))[\"']?[^\s:\"']{1,256}:(?P<v>[^\s\"']{1,1024})",
    ),
    _p(
        "stripe_key",
        (b"sk_live_", b"rk_live_", b"sk_test_", b"rk_test_"),
        rb"[sr]k_(?:live|test)_[A-Za-z0-9]{10,}",
        boundary=True,
    ),
    _p("google_api_key", (b"aiza",), rb"AIza[0-9A-Za-z_-]{30,}", boundary=True),
    _p(
        "slack_webhook",
        (b"hooks.slack.com",),
        rb"hooks\.slack\.com/(?:services|workflows|triggers)/(?P<v>[A-Za-z0-9_/-]{8,})",
    ),
    _p("slack_token", (b"xox",), rb"xox[abposr]-[A-Za-z0-9-]{10,}", boundary=True),
)
#: every anchor of every text pattern (lower case): a line holding none of them (and no known
#: secret, and not inside a multi-line key) is kept as is without running any regex
ANCHORS: tuple[bytes, ...] = tuple(sorted({a for p in _PATTERNS for a in p.anchors}))


#: one scan finds every anchor of a line (``low`` is lower-cased already)
_SCANNER = LiteralScanner(ANCHORS)
#: each pattern's anchors as ids of ``_SCANNER`` (indexes in ANCHORS)
_ANCHOR_IDS = tuple(frozenset(ANCHORS.index(a) for a in p.anchors) for p in _PATTERNS)


def _present_anchors(low: bytes) -> set[int]:
    """The ids of the anchors found in ``low``, in one C pass (not one ``in`` per anchor)."""
    return set(_SCANNER.matches(low))


#: a placeholder this module wrote (its label may contain an anchor such as ``hf_``)
PLACEHOLDER_RE = re.compile(rb"<redacted:[A-Za-z0-9_.-]{1,48}#[0-9]+(?::[0-9a-f]{12})?>")


def _has_anchor(low: bytes) -> bool:
    return _SCANNER.any(low)


_NOT_A_SECRET = re.compile(rb"^(?i:none|null|true|false|\*+|x+|redacted|unset|hidden)$")
_LABEL_OK = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(slots=True)
class _Record:
    placeholder: str
    kind: str
    where: set[str] = field(default_factory=set)
    count: int = 0

    def to_json(self) -> JSONObject:
        """The manifest's ``redactions`` entry (never the value)."""
        where: list[JSONValue] = []
        where.extend(sorted(self.where))
        return {
            "placeholder": self.placeholder,
            "kind": self.kind,
            "where": where,
            "count": self.count,
        }


def _load_user_key(path: str | os.PathLike[str] | None) -> bytes | None:
    candidate = Path(path) if path is not None else None
    if candidate is None:
        env = os.environ.get(KEY_FILE_ENV)
        candidate = Path(env) if env else _DEFAULT_KEY_FILE.expanduser()
    try:
        if candidate.is_file() and candidate.stat().st_size <= 4096:
            key = candidate.read_bytes().strip()
            return key or None
    except OSError:
        return None
    return None


class Redactor:
    """Redacts secrets for one bundle, with the same placeholder for the same secret.

    Call :meth:`env`, :meth:`argv` and :meth:`headers` first (they learn the secret values),
    then :meth:`text` once per log line (bytes or str). :meth:`records` gives the manifest's
    ``redactions`` list.

    For a fast pre-filter of log blocks (``capture``'s ``LogRedactor``): :attr:`anchors` and
    :meth:`known_values` are the literals a line must hold to need :meth:`text`,
    :attr:`in_block` says every line needs it for now, :attr:`learned` grows when a secret is
    learned, :meth:`replace_known` and :meth:`safe_cut` work on whole blocks.
    """

    #: the lower-case literals one of which every text pattern needs (:data:`ANCHORS`)
    anchors: ClassVar[tuple[bytes, ...]] = ANCHORS

    def __init__(self, *, key: bytes | None = None, min_known_length: int = 6) -> None:
        self._key = key
        self._min_known = min_known_length
        self._by_value: dict[bytes, str] = {}
        self._records: dict[str, _Record] = {}
        self._n = 0
        self._compiled: re.Pattern[bytes] | None = None
        self._known: tuple[bytes, ...] = ()
        self._longest = 0
        # Inside a PEM private key printed over several lines (see _pem_spans).
        self._pem_lines = 0
        self._pem_ph: str | None = None

    @classmethod
    def with_user_key(cls, path: str | os.PathLike[str] | None = None) -> Redactor:
        """A Redactor tagging placeholders with an HMAC from the user's key file, if present.

        The key file is ``$KK3EVIDENCE_REDACT_KEY_FILE`` or ``~/.config/kk3evidence/redact.key``;
        without one, placeholders carry no tag.
        """
        return cls(key=_load_user_key(path))

    # placeholders ----------------------------------------------------------------------
    def _assign(self, value: bytes, label: str) -> str:
        """The placeholder of ``value``, made (and learned for text search) if new."""
        if len(value) > MAX_KNOWN_BYTES:  # kept by digest: a flood of huge ones stays small
            value = b"\0sha256:" + hashlib.sha256(value).digest()
        ph = self._by_value.get(value)
        if ph is not None:
            return ph
        self._n += 1
        clean = _LABEL_OK.sub("_", label).strip("_") or "secret"
        tag = ""
        if self._key is not None:
            tag = ":" + hmac.new(self._key, value, hashlib.sha256).hexdigest()[:12]
        ph = f"<redacted:{clean[:48]}#{self._n}{tag}>"
        self._by_value[value] = ph
        if value.startswith(b"\0sha256:"):
            self._records[ph] = _Record(ph, label)
            return ph
        for variant in _variants(value):
            self._by_value.setdefault(variant, ph)
        # A multi-line secret (a PEM key in the environment) reaches the log one line at a
        # time: each of its long lines is a secret of its own, under the same placeholder.
        for piece in _secret_lines(value):
            self._by_value.setdefault(piece, ph)
        self._records[ph] = _Record(ph, label)
        if _learnable(value, self._min_known):
            self._compiled = None  # learn it: it is now searched for in text
        return ph

    def _placeholder(self, value: bytes, label: str, where: str) -> str:
        ph = self._assign(value, label)
        rec = self._records[ph]
        rec.where.add(where)
        rec.count += 1
        return ph

    def add_known(self, value: str | bytes, label: str = "secret", *, where: str = "known") -> str:
        """Declare ``value`` secret (found elsewhere); returns its placeholder."""
        raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
        return self._placeholder(raw, label, where)

    def placeholder_for(self, value: str | bytes) -> str | None:
        """The placeholder already given to ``value``, if any."""
        raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
        if len(raw) > MAX_KNOWN_BYTES:
            raw = b"\0sha256:" + hashlib.sha256(raw).digest()
        return self._by_value.get(raw)

    @property
    def learned(self) -> int:
        """How many secrets have a placeholder so far (grows when one is learned)."""
        return len(self._records)

    def known_values(self) -> tuple[bytes, ...]:
        """Every secret value (and spelling) searched for in text so far, longest first."""
        self._known_regex()
        return self._known

    def records(self) -> list[JSONObject]:
        """``[{placeholder, kind, where, count}]`` in placeholder order; never the value."""
        return [r.to_json() for r in self._records.values()]

    # structured inputs -----------------------------------------------------------------
    def value(self, value: str, label: str, *, where: str) -> str:
        """Redact a whole value known to be secret (empty/trivial values are kept)."""
        if value.strip().lower() in _TRIVIAL_VALUES:
            return value
        return self.add_known(value, label, where=where)

    def env(self, env: Mapping[str, str], *, where: str = "env") -> dict[str, str]:
        """A copy of ``env`` with secret values replaced (names are kept)."""
        out: dict[str, str] = {}
        for name, value in env.items():
            if is_secret_name(name):
                out[name] = self.value(value, name, where=f"{where}:{name}")
        for name, value in env.items():
            if name not in out:
                out[name] = self.text(value, where=f"{where}:{name}")
                self._pem_lines = 0  # a key cut off inside one value never runs on into the log
        return {name: out[name] for name in env}

    def argv(self, argv: Sequence[str], *, where: str = "argv") -> list[str]:
        """A copy of ``argv`` with secret option values replaced; other words kept as given."""
        out = list(argv)
        i = 0
        while i < len(out):
            word = out[i]
            here = f"{where}[{i}]"
            if word.startswith("-") and "=" in word:
                flag, _, val = word.partition("=")
                if is_secret_flag(flag):
                    out[i] = f"{flag}={self.value(val, flag.lstrip('-'), where=here)}"
                elif flag in _HEADER_FLAGS:
                    out[i] = f"{flag}={self._header_line(val, here)}"
            elif is_secret_flag(word) and i + 1 < len(out) and not out[i + 1].startswith("--"):
                # vLLM's --api-key takes one or more keys (nargs="+"); the others take one.
                last = i + 1
                if word in _MULTI_VALUE_FLAGS:
                    while last + 1 < len(out) and not out[last + 1].startswith("-"):
                        last += 1
                for j in range(i + 1, last + 1):
                    out[j] = self.value(out[j], word.lstrip("-"), where=f"{where}[{j}]")
                i = last
            elif word in _HEADER_FLAGS and i + 1 < len(out):
                out[i + 1] = self._header_line(out[i + 1], f"{where}[{i + 1}]")
                i += 1
            elif not word.startswith("-") and "=" in word:
                name, _, val = word.partition("=")
                if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) and is_secret_name(name):
                    out[i] = f"{name}={self.value(val, name, where=here)}"
            i += 1
        # Second pass: patterns and every secret learned above, anywhere in any word.
        return [self.text(w, where=f"{where}[{j}]") for j, w in enumerate(out)]

    def _header_line(self, line: str, where: str) -> str:
        name, sep, val = line.partition(":")
        if not sep or not is_secret_header(name):
            return line
        return f"{name}{sep}{self._header_value(name.strip(), val, where)}"

    def _header_value(self, name: str, value: str, where: str) -> str:
        lead = value[: len(value) - len(value.lstrip())]
        body = value.strip()
        m = _AUTH_SCHEME.match(body)
        if m is not None and name.lower().endswith("authorization"):
            return f"{lead}{m.group(0)}{self.value(body[m.end() :], name, where=where)}"
        return f"{lead}{self.value(body, name, where=where)}"

    @overload
    def headers(self, headers: Mapping[str, str], *, where: str = ...) -> dict[str, str]: ...
    @overload
    def headers(
        self, headers: Iterable[tuple[str, str]], *, where: str = ...
    ) -> list[tuple[str, str]]: ...
    def headers(
        self, headers: Mapping[str, str] | Iterable[tuple[str, str]], *, where: str = "headers"
    ) -> dict[str, str] | list[tuple[str, str]]:
        """A copy of HTTP headers (a mapping or name/value pairs) with credentials replaced."""
        pairs = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
        out: list[tuple[str, str]] = []
        for name, value in pairs:
            here = f"{where}:{name}"
            if is_secret_header(name):
                out.append((name, self._header_value(name, value, here)))
            else:
                out.append((name, self.text(value, where=here)))
        return dict(out) if isinstance(headers, Mapping) else out

    def json(self, obj: JSONValue, *, where: str = "json") -> JSONValue:
        """A copy of a JSON value: values under secret-looking keys and secret text replaced."""
        if isinstance(obj, dict):
            res: JSONObject = {}
            for k, v in obj.items():
                here = f"{where}.{k}"
                if isinstance(v, str) and is_secret_name(str(k)):
                    res[k] = self.value(v, str(k), where=here)
                else:
                    res[k] = self.json(v, where=here)
            return res
        if isinstance(obj, list):
            return [self.json(v, where=f"{where}[{i}]") for i, v in enumerate(obj)]
        if isinstance(obj, str):
            return self.text(obj, where=where)
        return obj

    # text ------------------------------------------------------------------------------
    def _known_regex(self) -> re.Pattern[bytes] | None:
        if self._compiled is None:
            known = sorted(
                (v for v in self._by_value if _learnable(v, self._min_known)),
                key=lambda v: (-len(v), v),
            )
            self._known = tuple(known)
            self._longest = max(map(len, known), default=0)
            self._compiled = re.compile(b"|".join(re.escape(v) for v in known) or b"(?!)")
        return self._compiled if self._known else None

    @overload
    def text(self, data: bytes, *, where: str = ...) -> bytes: ...
    @overload
    def text(self, data: str, *, where: str = ...) -> str: ...
    def text(self, data: bytes | str, *, where: str = "text") -> bytes | str:
        """Redact secrets in one line (or a chunk that ends at a line boundary).

        Bytes in, bytes out; str in, str out. Only the secret bytes change.
        """
        if isinstance(data, str):
            raw = data.encode("utf-8", "surrogateescape")
            return self._text(raw, where).decode("utf-8", "surrogateescape")
        return self._text(bytes(data), where)

    def text_lines(self, lines: Iterable[bytes], *, where: str = "text") -> Iterator[bytes]:
        """Redact an iterable of lines lazily (streaming)."""
        for line in lines:
            yield self._text(line, where)

    @property
    def in_block(self) -> bool:
        """True while inside a multi-line secret (a PEM key printed line by line): every next
        line must go through :meth:`text`, even one with no anchor."""
        return self._pem_lines > 0

    def safe_cut(self, data: bytes, keep: int = 16 * 1024) -> int:
        """Where a long unfinished line may be cut (for writing its head now) without cutting
        a secret in two: at least ``keep`` bytes (and the longest known secret) are held
        back, and the cut is moved before any secret or pattern match that spans it."""
        self._known_regex()
        cut = len(data) - max(keep, self._longest + 1)
        if cut <= 0:
            return len(data)
        spans = self._match_spans(data)
        moved = True
        while moved:
            moved = False
            for start, end in spans:
                if start < cut < end:
                    cut, moved = start, True
        # A match as long as the whole head (a megabyte-long token): write it all, redacted.
        return cut if cut > 0 else len(data)

    def _match_spans(self, data: bytes) -> list[tuple[int, int]]:
        spans: list[tuple[int, int]] = []
        known = self._known_regex()
        if known is not None and any(v in data for v in self._known):
            spans.extend(m.span() for m in known.finditer(data))
        low = data.lower()
        present = _present_anchors(low)
        for pat, ids in zip(_PATTERNS, _ANCHOR_IDS, strict=True):
            if not present.isdisjoint(ids):
                spans.extend(m.span() for m in pat.regex.finditer(low if pat.on_lower else data))
        return spans

    def replace_known(self, data: bytes, *, where: str = "text") -> bytes:
        """Every secret already known replaced in ``data`` (a block of lines), at C speed.

        The patterns are not run: a caller that finds no anchor in
        ``PLACEHOLDER_RE.sub(b"", result)`` is done, else it runs :meth:`text` per line."""
        self._known_regex()
        for value in self._known:  # longest first: a secret inside a longer one stays inside
            if value in data:
                ph = self._by_value[value]
                rec = self._records[ph]
                rec.where.add(where)
                rec.count += data.count(value)
                data = data.replace(value, ph.encode())
        return data

    def _maybe(self, raw: bytes) -> bool:
        self._known_regex()  # secrets learned from earlier lines of the same block count
        return self._pem_lines > 0 or _has_anchor(raw.lower()) or any(v in raw for v in self._known)

    def _text(self, raw: bytes, where: str) -> bytes:
        if not raw:
            return raw
        if raw.count(b"\n") > 1:
            if not self._maybe(raw):
                return raw
            # A block of lines: only lines that may hold a secret are searched.
            return b"\n".join(
                self._line(part, where) if part and self._maybe(part) else part
                for part in raw.split(b"\n")
            )
        return self._line(raw, where)

    def _pem_spans(self, body: bytes, low: bytes) -> list[tuple[int, int, int, str]]:
        """Spans of a PEM private key's body lines when it is printed over several lines.

        A BEGIN line with no END after it opens the block; every following line's base64
        runs are secret until the END line (or a line with none, or 400 lines)."""
        if self._pem_lines == 0:
            begin = low.rfind(b"-----begin ")
            if begin >= 0 and b"private key-----" in low[begin:] and b"-----end" not in low[begin:]:
                self._pem_lines = 400
                self._pem_ph = None
            return []
        end = low.find(b"-----end")
        head = body if end < 0 else body[:end]
        runs = [m.span() for m in _BASE64_RUN.finditer(head)]
        self._pem_lines = 0 if end >= 0 or (not runs and head.strip()) else self._pem_lines - 1
        out = []
        for start, stop in runs:
            value = body[start:stop]
            if self._pem_ph is None:
                self._pem_ph = self._assign(value, "private_key")
            if self._by_value.setdefault(value, self._pem_ph) == self._pem_ph:
                self._compiled = None  # a repeat of this line elsewhere is found too
            out.append((start, stop, -1, ""))
        return out

    def _line(self, raw: bytes, where: str) -> bytes:
        # The line ending stays out of every match (a placeholder never swallows a newline).
        body = raw.rstrip(b"\r\n")
        ending = raw[len(body) :]
        low = body.lower()
        spans = self._pem_spans(body, low)  # start, end, priority, kind
        present = _present_anchors(low)
        for prio, pat in enumerate(_PATTERNS):
            if present.isdisjoint(_ANCHOR_IDS[prio]):
                continue
            for m in pat.regex.finditer(low if pat.on_lower else body):
                if pat.boundary and m.start() > 0 and body[m.start() - 1 : m.start()].isalnum():
                    continue
                start, end = m.span("v") if "v" in pat.regex.groupindex else m.span()
                secret = body[start:end]
                if _NOT_A_SECRET.match(secret) or secret.startswith(b"<redacted:"):
                    continue
                spans.append((start, end, prio, pat.kind))
                self._assign(secret, pat.kind)  # learned now: repeats on this line count
        known = self._known_regex()
        if known is not None and any(v in body for v in self._known):
            spans.extend((m.start(), m.end(), -1, "") for m in known.finditer(body))
        if not spans:
            return raw
        spans.sort(key=lambda x: (x[0], x[0] - x[1], x[2]))
        out: list[bytes] = []
        pos = 0
        for start, end, prio, kind in spans:
            if start < pos:
                continue  # overlaps a secret already replaced
            value = body[start:end]
            if prio < 0:
                ph = self._by_value[value]
                rec = self._records[ph]
                rec.where.add(where)
                rec.count += 1
            else:
                ph = self._placeholder(value, kind, where)
            out.append(body[pos:start])
            out.append(ph.encode())
            pos = end
        out.append(body[pos:])
        out.append(ending)
        return b"".join(out)


#: a secret longer than this is replaced where found but not searched for elsewhere (a
#: 600 KB "sk-sk-sk-…" run would otherwise make every later search cost its length)
MAX_KNOWN_BYTES = 16 * 1024


def _learnable(value: bytes, min_len: int) -> bool:
    return (
        min_len <= len(value) <= MAX_KNOWN_BYTES
        and value.lower() not in _TRIVIAL_BYTES
        and not value.startswith(b"\0sha256:")
    )


_BASE64_RUN = re.compile(rb"[A-Za-z0-9+/=]{16,}")


def _secret_lines(value: bytes) -> set[bytes]:
    """The long lines of a multi-line secret, without PEM armour lines."""
    if b"\n" not in value:
        return set()
    out = set()
    for raw in value.split(b"\n"):
        line = raw.strip()
        if len(line) >= 16 and not line.startswith(b"-----"):
            out.add(line)
    return out


_TRIVIAL_BYTES = frozenset(v.encode() for v in _TRIVIAL_VALUES)


def _variants(value: bytes) -> set[bytes]:
    """Other spellings of a secret that logs and JSON produce: JSON-escaped, URL-quoted."""
    out: set[bytes] = set()
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return out
    out.add(json.dumps(text)[1:-1].encode())
    out.add(json.dumps(text, ensure_ascii=False)[1:-1].encode())
    out.add(urllib.parse.quote(text, safe="").encode())
    out.add(urllib.parse.quote_plus(text).encode())
    out.discard(value)
    return out
