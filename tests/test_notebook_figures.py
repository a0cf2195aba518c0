"""The published notebooks' embedded figures are stored as 256-colour PNGs (make notebooks): the pixels
stay close to matplotlib's, the file shrinks, and a second pass changes nothing."""

import base64
import io
import json

import numpy as np
import pytest

from dspark_core.eval.notebook import palette_figures, palette_png

matplotlib = pytest.importorskip("matplotlib")  # with Pillow: the dev extra
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from PIL import Image  # noqa: E402


def _figure_png() -> bytes:
    fig, ax = plt.subplots(figsize=(6, 3), dpi=100)
    x = np.linspace(0, 6, 200)
    for shift in range(8):
        ax.plot(x, np.sin(x + shift), label=f"curve {shift}")
    ax.legend()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    plt.close(fig)
    return out.getvalue()


def _pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int16)


def test_a_palette_png_is_smaller_and_looks_the_same():
    png = _figure_png()
    small = palette_png(png)
    assert Image.open(io.BytesIO(small)).mode == "P" and len(small) < len(png)
    diff = np.abs(_pixels(small) - _pixels(png))
    assert diff.shape == _pixels(png).shape
    assert diff.mean() < 0.5  # of 255, per channel
    assert (diff.max(axis=-1) <= 16).mean() > 0.995  # the rest: anti-aliased edge pixels
    assert palette_png(small) == small


def test_transparency_is_flattened_onto_white():
    clear = io.BytesIO()
    Image.new("RGBA", (4, 4), (255, 0, 0, 0)).save(clear, "PNG")
    assert (_pixels(palette_png(clear.getvalue())) == 255).all()


def test_palette_figures_rewrites_only_the_figures(tmp_path):
    png = _figure_png()
    outputs = [{"output_type": "display_data", "metadata": {}, "data": {"image/png": base64.b64encode(png).decode(),
                                                                        "text/plain": "<Figure>"}},
               {"output_type": "stream", "name": "stdout", "text": "tau 1.86\n"}]
    notebook = {"cells": [{"cell_type": "code", "metadata": {}, "source": "plot()", "outputs": outputs,
                           "execution_count": 1}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(notebook, indent=1))
    before, after = palette_figures(path)
    assert before == len(png) and after < before
    rewritten = json.loads(path.read_text())
    data = rewritten["cells"][0]["outputs"][0]["data"]
    assert base64.b64decode(data["image/png"]) == palette_png(png) and data["text/plain"] == "<Figure>"
    assert rewritten["cells"][0]["outputs"][1] == outputs[1]
    text = path.read_text()
    palette_figures(path)
    assert path.read_text() == text
