"""Callbacks that mark iterations for emo.apply in the common trainers: PyTorch Lightning
(emo.integrations.lightning.EmoCallback) and Hugging Face Trainer (emo.integrations.hf.EmoCallback).
Each module imports its framework; this package imports none."""
