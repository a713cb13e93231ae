"""Training: supervised fine-tuning, group-relative RL, configs, presets and checkpoints."""
