"""Bridges to other tools. ``labelrl.integrations.trl`` (imported on demand, it needs TRL):
CoRPO advantages inside TRL's ``GRPOTrainer`` and labelrl's graders as TRL reward functions."""
