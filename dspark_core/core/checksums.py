"""SHA-256 checksums of a checkpoint's weights, written at save time and checked at load.

A checkpoint folder may hold ``checksums.sha256`` in ``sha256sum`` format (``<hex>  <file name>``
per line, so ``sha256sum -c checksums.sha256`` checks it by hand too). Training writes it beside
``model.safetensors`` (:func:`write_checksums`); loading a folder that has one verifies every listed
file first (:func:`verify_checksums`), so a flipped byte or a replaced file is a clear error
instead of a model that silently drafts worse. A folder without the file (a hub model, an older
run) loads unchecked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

CHECKSUM_FILE = "checksums.sha256"
WEIGHTS = ("model.safetensors",)


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_checksums(folder: Path, names: Sequence[str] = WEIGHTS) -> Path:
    """Record the SHA-256 of ``names`` (files in ``folder``) in ``folder/checksums.sha256``; returns its path."""
    folder = Path(folder)
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"Cannot checksum {', '.join(missing)}: not in {folder}. Save the checkpoint first.")
    path = folder / CHECKSUM_FILE
    path.write_text("".join(f"{sha256_file(folder / name)}  {name}\n" for name in names))
    return path


def verify_checksums(folder: Path) -> bool:
    """Check every file ``folder/checksums.sha256`` lists; False when the folder has no such file.

    Raises a ValueError naming the file, both digests and what to do when one does not match."""
    folder = Path(folder)
    path = folder / CHECKSUM_FILE
    if not path.is_file():
        return False
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        expected, _, name = line.partition("  ")
        if len(expected) != 64 or not name:
            raise ValueError(f"{path}:{number} is not a '<sha256>  <file>' line; restore the file or rewrite it "
                             "with dspark_core.core.checksums.write_checksums(folder).")
        if not (folder / name).is_file():
            raise ValueError(f"{folder / name} is missing but {path} lists it: restore the checkpoint.")
        found = sha256_file(folder / name)
        if found != expected:
            raise ValueError(f"{folder / name} does not match its recorded SHA-256 ({path}: expected {expected}, "
                             f"found {found}): the file is corrupt or was replaced. Restore it (e.g. `git checkout -- "
                             f"{folder / name}`); if you re-trained it on purpose, record the new checksum with "
                             "dspark_core.core.checksums.write_checksums(folder).")
    return True
