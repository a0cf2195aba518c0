"""Layer 4, evaluation: the side-by-side benchmark and the rounds that calibration is fitted on."""
