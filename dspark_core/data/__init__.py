"""Layer 4, datasets: the evaluation and training prompt sets, self-distilled answers, and the
target features that drafters train on."""
