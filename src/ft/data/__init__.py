"""Datasets for a run: sources → canonical rows → (SFT) tokens with loss masks and a length column."""

from .build import PreparedData, chat_template_for, prepare_data
from .rows import DataError

__all__ = ["DataError", "PreparedData", "chat_template_for", "prepare_data"]
