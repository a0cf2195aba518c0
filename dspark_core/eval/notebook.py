"""What the notebooks' set-up cells share: parameter checks whose errors say what to change, the
repository root (papermill may start the kernel in ``notebooks/`` or at the root) and where figures go;
and, for ``make notebooks``, the published notebooks' embedded figures stored as 256-colour PNGs
(``python -m dspark_core.eval.notebook NOTEBOOK...``), a third of their size, so the checkout stays small."""

from __future__ import annotations

import ast
import base64
import io
import json
import sys
from pathlib import Path

from ..core.paths import REPO_ROOT
from ..core.provenance import timestamp

PUBLISHED_FIGURES = "figures"  # the published notebooks' figures; written only when a run names this folder (make notebooks)


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


def folder_or(value, *words: str) -> bool:
    """None, one of ``words`` (such as "auto"), or a non-empty path string."""
    return value is None or value in words or (isinstance(value, str) and value.strip() != "")


def as_list(value, name: str) -> list:
    """A list/tuple, or a string such as "[1, 2, 4]" or "1,2,4" (``papermill -p`` passes strings)."""
    if isinstance(value, str):
        text = value.strip()
        parsed = ast.literal_eval(text if text.startswith("[") else f"[{text}]")
        value = list(parsed) if isinstance(parsed, (list, tuple)) else [parsed]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a list, e.g. -y '{name}: [1, 2, 4]'; got {value!r}")
    return list(value)


def find_repo_root() -> Path:
    """The first folder at or above the working directory holding ``dspark_core/`` and ``pyproject.toml``,
    else the folder above the installed package."""
    for folder in [Path.cwd(), *Path.cwd().parents]:
        if (folder / "dspark_core").is_dir() and (folder / "pyproject.toml").is_file():
            return folder
    return REPO_ROOT


def figures_folder(figures_dir: str | None, root: Path, notebook: str) -> Path:
    """The folder a notebook writes its figures to, created: ``figures_dir`` (relative to the repository
    root), or by default a fresh ``figures/runs/<notebook>-<time>/``, so that a run on one's own settings
    never overwrites the published figures in ``figures/`` (``make notebooks`` names that folder)."""
    if figures_dir:
        folder = Path(figures_dir).expanduser()
        folder = folder if folder.is_absolute() else root / folder
    else:
        folder = root / PUBLISHED_FIGURES / "runs" / f"{notebook}-{timestamp()}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def palette_png(png: bytes, colours: int = 256) -> bytes:
    """The image re-encoded as a PNG of at most ``colours`` colours (median cut; any transparency flattened
    onto white); plots hold few colours, so only anti-aliased edges shift slightly. A palette PNG comes
    back as it is."""
    from PIL import Image  # installed with matplotlib, which the notebooks need

    image = Image.open(io.BytesIO(png))
    if image.mode == "P":
        return png
    opaque = Image.alpha_composite(Image.new("RGBA", image.size, "white"), image.convert("RGBA")).convert("RGB")
    image = opaque.quantize(colours, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    image.save(out, "PNG", optimize=True)
    return out.getvalue()


def palette_figures(notebook: Path) -> tuple[int, int]:
    """Rewrite every embedded PNG output of ``notebook`` with :func:`palette_png`, in place, keeping a figure
    as it was where that would not shrink it (a second pass changes nothing); returns the PNG bytes
    before and after."""
    content = json.loads(Path(notebook).read_text())
    before = after = 0
    for cell in content["cells"]:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/png" not in data:
                continue
            png = base64.b64decode(data["image/png"])
            smaller = palette_png(png)
            if len(smaller) < len(png):
                data["image/png"] = base64.b64encode(smaller).decode("ascii")
            before, after = before + len(png), after + min(len(png), len(smaller))
    Path(notebook).write_text(json.dumps(content, indent=1, ensure_ascii=False))  # as nbformat writes it
    return before, after


if __name__ == "__main__":
    for path in sys.argv[1:]:
        old, new = palette_figures(Path(path))
        print(f"{path}: embedded figures {old / 1e6:.2f} MB -> {new / 1e6:.2f} MB (256-colour PNGs)")
