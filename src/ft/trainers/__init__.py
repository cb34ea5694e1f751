"""Trainer classes by method, and how a recipe becomes their config."""

from .registry import TRAINERS, build_trainer

__all__ = ["TRAINERS", "build_trainer"]
