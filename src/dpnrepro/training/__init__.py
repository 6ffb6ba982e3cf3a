"""Training: the trainer, optimizers and losses, checkpoints, distributed execution, fine-tuning."""
