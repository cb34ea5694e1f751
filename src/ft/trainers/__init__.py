"""Trainer classes by method, and how a recipe becomes their config."""

from .registry import TRAINERS, build_trainer, check_plugins

__all__ = ["TRAINERS", "build_trainer", "check_plugins"]
