"""Layer 3, drafter models: configuration, modelling, losses."""

from .config import DrafterConfig
from .eagle import EagleDraftModel
from .losses import (
           RECIPES,
           drafter_loss,
           expected_tau,
           l1_distance,
           position_weights,
           soft_acceptance,
)
from .parallel import ParallelDraftModel, TargetBoundDraftModel

__all__ = ["DrafterConfig", "EagleDraftModel", "ParallelDraftModel", "RECIPES", "TargetBoundDraftModel", "drafter_loss",
           "expected_tau", "l1_distance", "position_weights", "soft_acceptance"]
