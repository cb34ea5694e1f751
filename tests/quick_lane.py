"""The quick lane (``pytest -m "not slow"``, the README's command for a fast check) trains nothing: a test that trains
a model, or uses a fixture that does (``conftest.TRAINING_FIXTURES``), is marked slow and runs in the full suite only.

Enforced where the suite's ``ft`` commands and its in-process trainers run: with ``FT_TESTS_QUICK_LANE`` set (conftest
sets it for a quick-lane session), ``transformers.Trainer.train`` (every method's trainer inherits it) fails the
command with the message below, in the test process and in each command the fork server runs (``tests/ft_server.py``).
A command conftest starts as a fresh process (an environment of its own) is not covered."""

from __future__ import annotations

import os

ENV = "FT_TESTS_QUICK_LANE"
MESSAGE = ("the quick lane (pytest -m 'not slow') trains nothing, and this test trains a model: mark it slow "
           "(pytest.mark.slow), or add the training fixture it uses to conftest.TRAINING_FIXTURES")


class TrainedInQuickLane(AssertionError):
    pass


def forbid_training_if_quick() -> None:
    """In a quick-lane session, make ``Trainer.train`` fail with ``MESSAGE`` in this process."""
    if not os.environ.get(ENV):
        return
    from transformers import Trainer

    def train(self, *args, **kwargs):
        raise TrainedInQuickLane(MESSAGE)

    Trainer.train = train
