"""What a notebook's set-up cells share: parameter checks whose errors say what to change, and the
repository root (papermill may start the kernel in ``notebooks/`` or at the root)."""

from __future__ import annotations

from pathlib import Path


def require(condition: bool, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``condition``; the message names the parameter and what to change."""
    if not condition:
        raise ValueError(message)


def is_int(value) -> bool:
    """An integer that is not a bool (papermill passes both as JSON)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def int_list(value, low: int = 1, high: int | None = None) -> bool:
    """A non-empty list of distinct integers in [low, high]."""
    return (isinstance(value, (list, tuple)) and len(value) > 0 and all(is_int(v) and v >= low for v in value)
            and (high is None or all(v <= high for v in value)) and len(set(value)) == len(value))


def folder_or_none(value) -> bool:
    """None, or a non-empty path string."""
    return value is None or (isinstance(value, str) and value.strip() != "")


def find_repo_root() -> Path:
    """The first folder at or above the working directory holding ``dspark_core/`` and ``pyproject.toml``,
    else the folder above the installed package."""
    for folder in [Path.cwd(), *Path.cwd().parents]:
        if (folder / "dspark_core").is_dir() and (folder / "pyproject.toml").is_file():
            return folder
    return Path(__file__).resolve().parents[2]
