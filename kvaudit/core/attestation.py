"""Run attestations: proof that a run directory's records are what ``kvaudit run`` wrote.

The audit's chain of trust (:mod:`kvaudit.audit.trust`) binds ``audit.json`` to the sha256 of
``manifest.json`` and ``pairs.jsonl``: it catches records changed *after* the audit, not records
edited *before* it (an answer, or every ``dtype`` set to bfloat16, which loosens the identity
tolerance). An attestation closes that gap in the manner of in-toto / SLSA provenance, with a
shared secret instead of a public-key infrastructure: when ``KVAUDIT_ATTESTATION_KEY`` is set,
``kvaudit run`` writes ``RUN/attestation.json`` at the end of every session, an HMAC-SHA256 over
the two files' sha256 (and the kvaudit version and git revision that wrote them), keyed by that
secret; a ``simulation.json`` already in the run (``kvaudit simulate --out RUN``, which decides
the gate's simulated hit-rate row) is signed with them (:data:`OPTIONAL_SUBJECTS`). A CI that holds the same secret asks for it with the policy's
``[provenance] require_attestation = true``; ``kvaudit gate`` then re-derives the hashes and the
MAC, and cannot judge (exit 2) a run whose attestation is missing, stale or forged.

What it protects against and what it does not is written in docs/audit.md ("Provenance").
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvaudit.core.errors import DatasetError
from kvaudit.core.jsonio import dump_json, file_sha256, read_json, write_atomic
from kvaudit.core.run_format import ATTESTATION_FILE, MANIFEST_FILE, PAIRS_FILE, SIMULATION_FILE

ATTESTATION_FORMAT = 1
KEY_ENV = "KVAUDIT_ATTESTATION_KEY"
MIN_KEY_BYTES = 16
SUBJECTS = (MANIFEST_FILE, PAIRS_FILE)
# Signed when present at signing time; once signed, a change (or removal) breaks the attestation.
OPTIONAL_SUBJECTS = (SIMULATION_FILE,)
_PAYLOAD_FIELDS = {"format", "producer", "subject", "key_id", "created"}


class AttestationError(DatasetError):
    """The attestation key is unusable (too short)."""


def attestation_key(environ: dict[str, str] | None = None) -> bytes | None:
    """The secret from ``KVAUDIT_ATTESTATION_KEY`` (None when unset); too short a key is an error
    rather than a weak signature."""
    value = (os.environ if environ is None else environ).get(KEY_ENV, "")
    if not value:
        return None
    key = value.encode("utf-8")
    if len(key) < MIN_KEY_BYTES:
        raise AttestationError(f"{KEY_ENV}: the key must be at least {MIN_KEY_BYTES} bytes "
                               f"(e.g. `openssl rand -hex 32`), got {len(key)}")
    return key


def key_id(key: bytes) -> str:
    """Names a key without revealing it (which key signed, when a CI rotates keys)."""
    return hashlib.sha256(b"kvaudit-key-id:" + key).hexdigest()[:16]


def _mac(key: bytes, payload: dict[str, Any]) -> str:
    return hmac.new(key, dump_json(payload).encode("utf-8"), hashlib.sha256).hexdigest()


def attest(run_dir: str | os.PathLike, key: bytes, producer: dict[str, Any]) -> Path:
    """Write ``RUN/attestation.json`` over the run's current files (those of
    :data:`OPTIONAL_SUBJECTS` that exist too); ``producer`` says what wrote them (kvaudit
    version, git revision)."""
    d = Path(run_dir)
    names = list(SUBJECTS) + [n for n in OPTIONAL_SUBJECTS if (d / n).is_file()]
    payload = {
        "format": ATTESTATION_FORMAT,
        "producer": dict(producer),
        "subject": {name: file_sha256(d / name) for name in names},
        "key_id": key_id(key),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    path = d / ATTESTATION_FILE
    write_atomic(path, dump_json({"payload": payload, "hmac_sha256": _mac(key, payload)}))
    return path


@dataclass
class Attestation:
    """What :func:`verify_attestation` found: ``state`` is ``verified``, ``missing``, ``no_key``
    or ``broken``; ``reason`` one sentence for the gate's table; ``subject`` the sha256 of every
    file it signed, by name (verified only)."""

    state: str
    reason: str
    producer: dict[str, Any] | None = None
    subject: dict[str, str] = field(default_factory=dict)


def verify_attestation(run_dir: str | os.PathLike, key: bytes | None) -> Attestation:
    """Check ``RUN/attestation.json`` against the run's files and ``key``. Never raises for a bad
    file: a malformed attestation is ``broken``."""
    d = Path(run_dir)
    path = d / ATTESTATION_FILE
    if key is None:
        return Attestation("no_key", f"{KEY_ENV} is not set, so the run's attestation cannot be verified")
    if not path.exists():
        return Attestation("missing", f"{path} not found: the run was not attested (run `kvaudit run` "
                                      f"with {KEY_ENV} set)")
    try:
        raw = read_json(path)
    except DatasetError as e:
        return Attestation("broken", str(e))
    payload = raw.get("payload") if isinstance(raw, dict) else None
    mac = raw.get("hmac_sha256") if isinstance(raw, dict) else None
    if not isinstance(payload, dict) or set(payload) != _PAYLOAD_FIELDS or not isinstance(mac, str):
        return Attestation("broken", f"{path}: not an attestation kvaudit wrote (fields 'payload', 'hmac_sha256')")
    if payload["format"] != ATTESTATION_FORMAT:
        return Attestation("broken", f"{path}: field 'payload.format' is {str(payload['format'])[:20]}, "
                                     f"this kvaudit reads {ATTESTATION_FORMAT}")
    if payload["key_id"] != key_id(key):
        return Attestation("broken", f"{path}: signed with another key (key id "
                                     f"{str(payload['key_id'])[:16]}, ours {key_id(key)})")
    if not hmac.compare_digest(mac, _mac(key, payload)):
        return Attestation("broken", f"{path}: the signature does not match its content (edited after signing)")
    subject = payload["subject"] if isinstance(payload["subject"], dict) else {}
    signed = [*SUBJECTS, *(n for n in OPTIONAL_SUBJECTS if n in subject)]
    for name in signed:
        if not (d / name).is_file():
            return Attestation("broken", f"{d / name} not found (`kvaudit run` signed it)")
        if subject.get(name) != file_sha256(d / name):
            return Attestation("broken", f"{d / name} changed after `kvaudit run` attested it "
                                         "(its sha256 differs from the signed one)")
    producer = payload["producer"] if isinstance(payload["producer"], dict) else {}
    return Attestation("verified", f"signed by `kvaudit run` (key id {payload['key_id']}, "
                                   f"{payload['created']}); {', '.join(signed)} unchanged since", producer,
                       {name: subject[name] for name in signed})
