"""PyTorch Lightning: `Trainer(callbacks=[EmoCallback("policy.json")])` applies the policy on every
rank's GPU while it trains. An iteration is an optimizer step: with gradient accumulation, the first
micro-batch of each step marks it (the policy's t = 0)."""

from __future__ import annotations

from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone package
    from pytorch_lightning.callbacks import Callback  # type: ignore[assignment, unused-ignore]  # its own copy of the class

from emo import loop


class EmoCallback(Callback):
    def __init__(self, policy: Any, **apply_options: Any):
        super().__init__()
        self.policy, self.apply_options = policy, apply_options
        self.clocks: loop.Clocks | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.clocks = loop.apply(self.policy, **self.apply_options)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if self.clocks is not None and batch_idx % max(1, int(trainer.accumulate_grad_batches)) == 0:
            self.clocks.step()

    def on_train_end(self, trainer, pl_module) -> None:
        self._close()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._close()

    def _close(self) -> None:
        if self.clocks is not None:
            self.clocks.close()
