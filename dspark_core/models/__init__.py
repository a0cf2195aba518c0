"""Trained drafters: configuration, modelling, losses."""

from .config import DrafterConfig
from .losses import drafter_loss, expected_tau, l1_distance, position_weights, soft_acceptance
from .parallel import ParallelDrafter

__all__ = ["DrafterConfig", "ParallelDrafter", "drafter_loss", "expected_tau", "l1_distance", "position_weights",
           "soft_acceptance"]
