"""``--encoding`` through the real commands: ``audit``, ``data show``, and a ladder task's ``encoding``."""

from __future__ import annotations

import json

import pytest
import typer
import yaml
from typer.testing import CliRunner

from labelrl.cli import audit as audit_cli
from labelrl.cli import data as data_cli

runner = CliRunner(env={"COLUMNS": "200"})  # wide: no wrapped lines to match against


@pytest.fixture(scope="module")
def app():
    app = typer.Typer(add_completion=False)
    app.callback()(lambda: None)  # keep the commands as subcommands, as under labelrl.cli.main
    audit_cli.register(app)
    data_cli.register(app)
    return app


@pytest.fixture
def latin1_csv(tmp_path):
    """Two copies of an accented text that disagree (the audit prints and saves their texts)."""
    rows = [("1", "café crème", "ham"), ("2", "café crème", "spam"), ("3", "naïve", "ham"), ("4", "£5 prize", "spam")]
    path = tmp_path / "latin.csv"
    path.write_bytes(("id,text,label\n" + "".join(",".join(r) + "\n" for r in rows)).encode("latin-1"))
    return path


def test_audit_reads_a_latin1_file_with_encoding_and_keeps_the_accents(app, latin1_csv, tmp_path):
    out = tmp_path / "audit.json"
    result = runner.invoke(app, ["audit", str(latin1_csv), "--encoding", "latin-1", "--n-boot", "0", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["n_rows"] == 4 and report["conflicting_groups"][0]["texts"] == ["café crème", "café crème"]
    assert "café crème" in result.stdout  # printed as read, not as mojibake (cafÃ©)


def test_audit_without_encoding_names_the_detected_one_and_the_flag(app, latin1_csv):
    result = runner.invoke(app, ["audit", str(latin1_csv), "--n-boot", "0"])
    assert result.exit_code != 0
    assert "is not valid UTF-8 (b'\\xe9'); it decodes as cp1252: pass --encoding cp1252" in result.output


def test_audit_refuses_an_unknown_codec_naming_it(app, latin1_csv):
    result = runner.invoke(app, ["audit", str(latin1_csv), "--encoding", "latin-9000"])
    assert result.exit_code != 0
    assert "--encoding" in result.output and "latin-9000" in result.output and "not a text encoding" in result.output


def test_data_show_takes_encoding(app, latin1_csv, tmp_path):
    out = tmp_path / "show.json"
    assert runner.invoke(app, ["data", "show", str(latin1_csv)]).exit_code != 0
    result = runner.invoke(app, ["data", "show", str(latin1_csv), "--encoding", "cp1252", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text(encoding="utf-8"))["n_rows"] == 4


def _recipe(tmp_path, data, **task) -> dict:
    arms = {"sft": {"type": "sft"}, "d": {"type": "distill", "teacher": "tiny-random"}, "r": {"type": "relabel", "judge": "x"}}
    (tmp_path / "rubric.md").write_text("spam sells; ham does not", encoding="utf-8")
    raw = {"version": 1, "name": "t", "model": "tiny-random",
           "tasks": {"toy": {"data": str(data), "audit": False, "rubric": str(tmp_path / "rubric.md"),
                                     **task, "arms": arms}}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def test_a_ladder_task_passes_its_encoding_to_every_arm_that_reads_data(latin1_csv, tmp_path):
    from labelrl.ladder.arms import arm_config
    from labelrl.ladder.evaluations import answer_key
    from labelrl.ladder.recipe import load_recipe

    recipe = load_recipe(_recipe(tmp_path, latin1_csv, encoding="latin-1"))
    task = recipe.tasks["toy"]
    assert task.data_options()["encoding"] == "latin-1"
    assert arm_config(recipe, "toy", "sft", tmp_path).encoding == "latin-1"
    assert arm_config(recipe, "toy", "d", tmp_path).encoding == "latin-1"
    assert arm_config(recipe, "toy", "r", tmp_path).encoding == "latin-1"
    assert answer_key(task, tmp_path, "label")["1"] == "ham"  # the answer key reads the file with it too
    # without it, the task keeps the default (no key written, so old recipes resolve as before)
    plain = load_recipe(_recipe(tmp_path, latin1_csv))
    assert "encoding" not in plain.tasks["toy"].data_options()
    assert arm_config(plain, "toy", "sft", tmp_path).encoding == "utf-8"


def test_a_ladder_task_refuses_an_unknown_codec(latin1_csv, tmp_path):
    from labelrl.ladder.recipe import load_recipe

    with pytest.raises(ValueError, match=r"encoding.*not a text encoding"):
        load_recipe(_recipe(tmp_path, latin1_csv, encoding="latin-9000"))


def test_ladder_data_writes_the_encoding_into_the_default_recipe(latin1_csv):
    from labelrl.cli.ladder import data_recipe

    common = dict(budget="smoke", model=None, text_col=[], label_col=None, labels=None, kind=None, rubric=None,
                  on_bad_row="error", delimiter=None, sets=[])
    with pytest.raises(ValueError, match="pass --encoding cp1252"):
        data_recipe(str(latin1_csv), **common)
    recipe = data_recipe(str(latin1_csv), encoding="latin-1", **common)
    (task,) = recipe.tasks.values()
    assert task.encoding == "latin-1" and task.data_options()["encoding"] == "latin-1"
