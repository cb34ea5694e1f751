"""Datasets for a run: sources → canonical rows → (SFT) tokens with loss masks and a length column."""

from .build import PreparedData, chat_template_for, prepare_data
from .rows import DataError
from .templates import response_template_for

__all__ = ["DataError", "PreparedData", "chat_template_for", "prepare_data", "response_template_for"]
