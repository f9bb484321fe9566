"""The Lightning and Hugging Face callbacks drive the runtime applier against the NVML fake: the
policy is applied from the first training step, marked once per optimizer step (gradient
accumulation included), and every GPU's clock is reset when training ends."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from emo.policy import FrequencyPolicy, Step

sys.path.insert(0, str(Path(__file__).parent))
import nvml_fake  # noqa: E402

torch = pytest.importorskip("torch")


@pytest.fixture
def fake(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    FrequencyPolicy(gpu="a100", steps={0: [Step(0.0, 900)]}, period_ms=1.0).save(tmp_path / "policy.json")
    yield from nvml_fake.for_loop_api(monkeypatch, tmp_path / "owner-calls.jsonl", gpus=2)


def _locks_and_resets(fake):
    return [c[0] for c in fake.calls if c[0] in ("lock", "reset")]


def test_lightning_callback(fake):
    L = pytest.importorskip("lightning.pytorch")
    from emo.integrations.lightning import EmoCallback

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return ((self.lin(x) - y) ** 2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    cb = EmoCallback("policy.json")
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        accumulate_grad_batches=2,
        callbacks=[cb],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=2))
    assert cb.clocks.iterations == 4  # 8 micro-batches, 2 per optimizer step
    assert [c for c in fake.calls if c[0] == "lock"] == [("lock", 0, 900, 900)]  # GPU 0 locked once, at step 1
    assert _locks_and_resets(fake)[-1] == "reset" and cb.clocks.closed and cb.clocks.landed == 1


def test_hugging_face_trainer_callback(fake, tmp_path):
    transformers = pytest.importorskip("transformers")
    from emo.integrations.hf import EmoCallback

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def forward(self, x, labels):
            return {"loss": ((self.lin(x) - labels) ** 2).mean()}

    data = [{"x": torch.randn(4), "labels": torch.randn(1)} for _ in range(12)]
    cb = EmoCallback("policy.json")
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"),
        max_steps=3,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    transformers.Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=[cb]).train()
    assert cb.clocks.iterations == 3  # the Trainer's steps are optimizer steps
    assert [c for c in fake.calls if c[0] == "lock"] == [("lock", 0, 900, 900)]
    assert _locks_and_resets(fake)[-1] == "reset" and cb.clocks.closed
