"""Kubernetes object names, made the same way everywhere tailwatch writes one.

A Service or Deployment name is an RFC 1123 label: lowercase letters, digits and `-`,
beginning and ending with a letter or digit, at most 63 characters. Flagger names the
Services of a Canary after it, so a Canary named after a model (`llama-3.1-70b`) must be
made a label first. `kubernetes_name` does that, keeping a valid name as it is: lowercase, every other character a `-`,
runs of `-` as one, trimmed; a name cut to fit keeps a short hash of the whole, so two long
names that share their first 63 characters stay apart.
"""

from __future__ import annotations

import hashlib
import re

PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
MAX_LENGTH = 63
RULE = ("a Kubernetes name: lowercase letters, digits and '-', beginning and ending with a letter or digit, "
        f"at most {MAX_LENGTH} characters")


def kubernetes_name(text: str) -> str:
    """`text` as an RFC 1123 label: `llama-3.1-70b` → `llama-3-1-70b`, `Whisper_Large` →
    `whisper-large`. Raises ValueError where nothing of it is left (`...`)."""
    if is_kubernetes_name(text):
        return text
    name = re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", text.lower())).strip("-")
    if not name:
        raise ValueError(f"{text!r} holds no letter or digit to name a Kubernetes object by")
    if len(name) > MAX_LENGTH:
        digest = hashlib.sha256(text.encode()).hexdigest()[:6]
        name = f"{name[:MAX_LENGTH - 7].rstrip('-')}-{digest}"
    return name


def is_kubernetes_name(text: str) -> bool:
    return len(text) <= MAX_LENGTH and re.fullmatch(PATTERN, text) is not None
