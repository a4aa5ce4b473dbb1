"""A trained vocabulary smaller than --vocab_size is said, with the reason (issue 55: a build
asking for 2,000 entries got 386 from a small corpus without a word)."""

from __future__ import annotations

from pydoc_data.topics import topics

from bertforge.data_prep.tokenizer import describe, train_wordpiece


def _texts(chars: int) -> list[str]:
    return [" ".join(topics.values())[:chars]]


def test_a_corpus_with_too_few_pieces_gets_a_warning_with_the_reason(tmp_path, capsys):
    train_wordpiece(_texts(3000), 2000, True, tmp_path / "tok", min_frequency=2)
    size = describe(tmp_path / "tok").vocab_size
    assert size < 2000
    out = capsys.readouterr().out
    assert f"[data_prep] WARNING: the trained vocabulary has {size} entries, fewer than " in out
    assert "--vocab_size 2000: the training documents have too few distinct words" in out
    assert "--min_frequency 2 times" in out and f"goes on with {size} entries" in out


def test_a_vocabulary_of_the_size_asked_says_nothing(tmp_path, capsys):
    train_wordpiece(_texts(100_000), 300, True, tmp_path / "tok", min_frequency=2)
    assert describe(tmp_path / "tok").vocab_size == 300
    assert "WARNING" not in capsys.readouterr().out
