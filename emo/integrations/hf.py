"""Hugging Face Trainer: `Trainer(..., callbacks=[EmoCallback("policy.json")])` applies the policy on
every rank's GPU while it trains. The Trainer's step is an optimizer step (gradient accumulation
included): its start is the policy's t = 0."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from emo import loop


class EmoCallback(TrainerCallback):
    def __init__(self, policy: Any, **apply_options: Any):
        self.policy, self.apply_options = policy, apply_options
        self.clocks: loop.Clocks | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.clocks = loop.apply(self.policy, **self.apply_options)

    def on_step_begin(self, args, state, control, **kwargs):
        if self.clocks is not None:
            self.clocks.step()

    def on_train_end(self, args, state, control, **kwargs):
        if self.clocks is not None:
            self.clocks.close()
