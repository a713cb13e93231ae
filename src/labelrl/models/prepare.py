"""A model ready to train: a run directory resolved to its saved model, LoRA added or kept,
the trainable parameters chosen."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from labelrl.models.load import BUILTIN_MODELS, load_model

RUN_MODEL_DIR = "model"


def resolve_model_spec(spec: str) -> str:
    """A run directory stands for the model it saved (``RUN_DIR/model``)."""
    saved = Path(spec) / RUN_MODEL_DIR
    return str(saved) if saved.is_dir() else spec


def prepare_model(cfg):
    """Load the model ``cfg.model`` and make the right parameters trainable (``cfg``: the
    model options of ``sft`` or ``rl``: ``model``, ``lora``, ``lora_r``, ``lora_alpha``, ``seed``,
    ``trust_remote_code``).

    LoRA on a plain model adds a fresh adapter on every linear layer; LoRA on a saved
    adapter (an SFT run) keeps training that adapter, so the result stays one adapter on
    the original base; full fine-tuning folds any adapter in first.
    """
    from peft import LoraConfig, PeftModel, get_peft_model

    spec = resolve_model_spec(cfg.model)
    torch.manual_seed(cfg.seed)
    model, tokenizer = load_model(spec, trust_remote_code=cfg.trust_remote_code)
    if isinstance(model, PeftModel):
        if cfg.lora:
            for name, param in model.named_parameters():
                param.requires_grad = "lora_" in name
        else:
            model = model.merge_and_unload()
    elif cfg.lora:
        # Recorded in adapter_config.json so load_model(adapter_dir) finds the same base.
        base_name = spec if spec in BUILTIN_MODELS else str(Path(spec).resolve())
        lora = LoraConfig(
            r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
            target_modules="all-linear", task_type="CAUSAL_LM",
        )
        with warnings.catch_warnings():
            # peft asks transformers 5 for a renamed attribute; the message is for peft's authors
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            model = get_peft_model(model, lora)
        model.peft_config["default"].base_model_name_or_path = base_name
    if not cfg.lora:
        for param in model.parameters():
            param.requires_grad = True
    model.train()
    return model, tokenizer
