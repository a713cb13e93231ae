import numpy as np
import pytest

from labelrl.evaluate.io import Predictions, join_on_id, predictions_table, read_predictions, write_predictions
from labelrl.types import LabelSpace

BINARY = LabelSpace(("yes", "no"), kind="binary", positive="yes")
THREE = LabelSpace(("neg", "neu", "pos"))


def binary_predictions():
    probs = np.array([[0.2, 0.8], [0.9, 0.1], [0.5, 0.5]])  # columns in label order: yes, no
    table = predictions_table(["a", "b", "c"], ["yes", "no", "no"], ["no", "yes", None],
                              ["ok", "ok", "no_answer"], BINARY, probs)
    return Predictions(table, BINARY, {"model_fingerprint": "abc"})


def test_binary_score_column_is_the_positive_probability():
    pred = binary_predictions()
    assert pred.table.column("score").to_pylist() == [0.2, 0.9, 0.5]  # P(yes), yes being positive
    assert np.allclose(pred.scores(), [[0.2, 0.8], [0.9, 0.1], [0.5, 0.5]])


def test_parquet_round_trip_keeps_label_space_and_provenance(tmp_path):
    path = write_predictions(binary_predictions(), tmp_path / "p.parquet")
    back = read_predictions(path)
    assert back.labels == BINARY  # declared order and positive survive (not re-inferred)
    assert back.info["model_fingerprint"] == "abc" and back.info["source"] == str(path)
    assert back.y_pred == ["no", "yes", None]
    assert np.allclose(back.scores(), binary_predictions().scores())


def test_a_parquet_read_with_the_other_positive_label_scores_that_labels_probability(tmp_path):
    # written with "yes" positive (score = P(yes)); read with "no" positive, the score is P(no),
    # so the ROC of "no" is the mirror of the ROC of "yes", not a ranking turned upside down
    path = write_predictions(binary_predictions(), tmp_path / "p.parquet")
    back = read_predictions(path, positive_label="no")
    assert back.labels.positive_label == "no"
    assert np.allclose(back.table.column("score").to_pylist(), [0.8, 0.1, 0.5])
    assert np.allclose(back.scores(), binary_predictions().scores())  # P(yes), P(no) per row, as written
    assert np.allclose(read_predictions(path, positive_label="yes").scores(), binary_predictions().scores())
    # written back, the file says which label its score is the probability of
    again = read_predictions(write_predictions(back, tmp_path / "again.parquet"))
    assert again.labels.positive_label == "no" and np.allclose(again.scores(), binary_predictions().scores())


def test_a_binary_csv_names_the_label_of_each_score_so_either_positive_reads_it_right(tmp_path):
    # "yes" is the writer's positive, but read back without metadata the inferred positive of
    # no/yes is "yes" only by order: written with "no" positive, a bare `score` column (P(no))
    # would be read as P(yes). The CSV says whose probability each column is.
    written = LabelSpace(("yes", "no"), kind="binary", positive="no")
    probs = np.array([[0.2, 0.8], [0.9, 0.1], [0.5, 0.5]])
    table = predictions_table(["a", "b", "c"], ["yes", "no", "no"], ["no", "yes", None], ["ok", "ok", "no_answer"],
                              written, probs)
    assert table.column("score").to_pylist() == [0.8, 0.1, 0.5]  # P(no), in memory and in Parquet
    path = write_predictions(Predictions(table, written), tmp_path / "p.csv")
    header = path.read_text(encoding="utf-8").splitlines()[0]
    assert '"score_yes","score_no"' in header and '"score"' not in header
    for positive in (None, "yes", "no"):
        back = read_predictions(path, positive_label=positive)
        p_yes = back.scores()[:, back.labels.index("yes")]
        assert np.allclose(p_yes, [0.2, 0.9, 0.5]), positive
    assert read_predictions(path, positive_label="no").labels.positive_label == "no"


def test_csv_from_elsewhere_infers_labels_and_positive(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("id,label,prediction,score\n1,0,1,0.7\n2,1,1,0.9\n3,0,,0.2\n", encoding="utf-8")
    pred = read_predictions(path)
    assert pred.labels.labels == ("0", "1") and pred.labels.positive_label == "1"
    assert pred.ids == ["1", "2", "3"]
    assert pred.y_pred == ["1", "1", None]
    assert pred.table.column("parse_status").to_pylist() == ["ok", "ok", "no_answer"]
    flipped = read_predictions(path, positive_label="0")
    assert flipped.labels.positive_label == "0"
    assert np.allclose(flipped.scores()[:, 0], [0.7, 0.9, 0.2])


def test_multiclass_score_columns(tmp_path):
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    table = predictions_table(["a", "b"], ["neg", "pos"], ["neg", "pos"], ["ok", "ok"], THREE, probs)
    assert [c for c in table.column_names if c.startswith("score_")] == ["score_neg", "score_neu", "score_pos"]
    back = read_predictions(write_predictions(Predictions(table, THREE), tmp_path / "m.csv"))
    assert back.labels.labels == ("neg", "neu", "pos")
    assert np.allclose(back.scores(), probs)


@pytest.mark.parametrize("content, message", [
    ("id,label\n1,a\n", "missing column"),
    ("id,label,prediction\n1,a,a\n1,b,a\n", "distinct"),
    ("id,label,prediction\n1,a,a\n2,b,c\n3,a,b\n", None),
])
def test_bad_files_are_refused(tmp_path, content, message):
    path = tmp_path / "bad.csv"
    path.write_text(content, encoding="utf-8")
    if message is None:  # three labels inferred: a, b, c is fine
        assert read_predictions(path).labels.labels == ("a", "b", "c")
    else:
        with pytest.raises(ValueError, match=message):
            read_predictions(path)


def test_unknown_prediction_label_is_refused(tmp_path):
    path = tmp_path / "p.parquet"
    table = predictions_table(["a"], ["yes"], ["maybe"], ["ok"], BINARY)
    write_predictions(Predictions(table, BINARY), path)
    with pytest.raises(ValueError, match="'maybe' is not one of the labels"):
        read_predictions(path)


def test_join_on_id_refuses_different_answer_keys():
    a = binary_predictions()
    table = predictions_table(["c", "a", "z"], ["no", "yes", "yes"], ["no", "no", "no"], ["ok"] * 3, BINARY)
    rows_a, rows_b = join_on_id(a, Predictions(table, BINARY))
    assert rows_a == [0, 2] and rows_b == [1, 0]
    relabelled = predictions_table(["a"], ["no"], ["no"], ["ok"], BINARY)
    with pytest.raises(ValueError, match="different answer keys"):
        join_on_id(a, Predictions(relabelled, BINARY))
