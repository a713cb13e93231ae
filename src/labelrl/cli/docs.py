"""Generate docs/config.md from the config models (``make docs``); never edit that file by hand."""

from __future__ import annotations

from labelrl.cli.options import field_help
from labelrl.train.config import RLConfig, SFTConfig

COMMANDS = {"sft": SFTConfig, "rl": RLConfig}


def render() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from the config models in `src/labelrl/train/config.py` by `make docs`; do not edit.",
        "Every option can be given on the command line (`--group-size 8`) or in a YAML file passed",
        "with `--config FILE` (`group_size: 8`); the command line wins.",
        "",
    ]
    for command, model in COMMANDS.items():
        lines += [f"## `labelrl {command}`", "", (model.__doc__ or "").strip(), "", "| option | help |", "| --- | --- |"]
        for name, field in model.model_fields.items():
            flag = "--" + name.replace("_", "-")
            lines.append(f"| `{flag}` | {field_help(name, field).replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(), end="")
