"""The package's folders are its layers, and a layer imports only from the layers below it."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "dspark_core"
LAYER = {"core": 1, "decode": 2, "models": 3, "drafters": 4, "data": 5, "train": 5, "eval": 5, "cli": 6, "__init__": 6}


def layer_of(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def imported_layers(path: Path) -> set[str]:
    """First-level dspark_core packages that ``path`` imports (relative or absolute)."""
    found = set()
    depth = len(path.relative_to(PACKAGE).parts) - 1  # folders between the package root and the file
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative: climb to the package root, then read the first name
                parts = list(path.relative_to(PACKAGE).parts[:-1])[: max(0, depth - (node.level - 1))]
                parts += (node.module or "").split(".") if node.module else [a.name for a in node.names]
            elif (node.module or "").startswith("dspark_core."):
                parts = node.module.split(".")[1:]
            else:
                continue
            if parts:
                found.add(parts[0])
    return found


def test_every_module_belongs_to_a_layer():
    assert {layer_of(p) for p in PACKAGE.rglob("*.py")} <= set(LAYER)


def test_layers_import_downward_only():
    upward = []
    for path in PACKAGE.rglob("*.py"):
        mine = layer_of(path)
        for other in imported_layers(path) - {mine}:
            if other in LAYER and LAYER[other] >= LAYER[mine] and mine not in ("cli", "__init__"):
                if not (LAYER[other] == LAYER[mine] == 5):  # datasets, training and evaluation may share
                    upward.append(f"{path.relative_to(PACKAGE)} imports {other}")
    assert not upward, upward


def test_the_serving_half_loads_without_training_or_evaluation():
    """Importing a decoding module (package __init__ included) pulls in no training, evaluation or
    registry code: the layers hold at run time, not only in the source."""
    probe = ("import sys, dspark_core.decode.policies; "
             "print(' '.join(m for m in sys.modules if m.startswith('dspark_core.')))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert "dspark_core.decode.policies" in loaded
    above = [m for m in loaded if m.startswith(("dspark_core.train", "dspark_core.eval", "dspark_core.data",
                                                "dspark_core.drafters.registry", "dspark_core.cli"))]
    assert not above, above
