"""Every metric name and rollout column is documented in docs/metrics.md."""

from pathlib import Path

from labelrl import metrics_keys as K
from labelrl.rollout.log import ROLLOUT_SCHEMA

DOC = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text(encoding="utf-8")


def test_every_metric_key_is_documented():
    keys = [v for k, v in vars(K).items() if k.isupper() and isinstance(v, str)]
    assert len(keys) > 30
    missing = [key for key in keys if f"`{key}" not in DOC]
    assert missing == []


def test_every_rollout_column_is_documented():
    missing = [name for name in ROLLOUT_SCHEMA.names if f"| `{name}` |" not in DOC]
    assert missing == []


def test_metric_names_follow_the_area_slash_quantity_scheme():
    keys = [v for k, v in vars(K).items() if k.isupper() and isinstance(v, str) and v != K.STEP]
    assert all(key.count("/") == 1 and key == key.lower() for key in keys)


def test_config_reference_is_generated_from_the_config_models():
    from labelrl.cli.docs import render

    generated = (Path(__file__).resolve().parents[1] / "docs" / "config.md").read_text(encoding="utf-8")
    assert generated == render(), "docs/config.md is stale: run `make docs`"
