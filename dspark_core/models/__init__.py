"""Layer 3, drafter models: configuration, modelling, losses."""

from .config import DrafterConfig
from .eagle import EagleDrafter
from .losses import (
           RECIPES,
           drafter_loss,
           expected_tau,
           l1_distance,
           position_weights,
           soft_acceptance,
)
from .parallel import ParallelDrafter, TargetBoundDrafter

__all__ = ["DrafterConfig", "EagleDrafter", "ParallelDrafter", "RECIPES", "TargetBoundDrafter", "drafter_loss",
           "expected_tau", "l1_distance", "position_weights", "soft_acceptance"]
