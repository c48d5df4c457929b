"""Keeping secret values and credentials out of status, events and logs."""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "***"
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")


def redact(text: str, secrets: Iterable[str]) -> str:
    """Replace every secret value (longest first) and any user:password@ in URLs."""
    for value in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(value, MASK)
    return _URL_CREDENTIALS.sub(rf"\g<scheme>{MASK}@", text)


# What a status message or an Event keeps of a longer text (a stack trace, a server's answer).
MESSAGE_CHARS = 1024


def truncate(text: str, limit: int = MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
