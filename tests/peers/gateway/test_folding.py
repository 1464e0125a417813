import pytest

from peers.gateway.folding import KEY_WORDS, fold_for_screening


@pytest.mark.parametrize(
    ("text", "folded"),
    [
        ("i g n o r e this", "ignore this"),
        ("i.g.n.o.r.e this", "ignore this"),
        ("p-r-o-m-p-t", "prompt"),
        ("1gn0r3 it", "ignore it"),
        ("pr0mpt", "prompt"),
        ("ignroe it", "ignore it"),  # two neighbours swapped
        ("instrucions", "instructions"),  # a letter dropped
        ("iunstructions", "instructions"),  # a letter added
        ("previos", "previous"),
        ("in-structions", "instructions"),
        ("sys_tem", "system"),
    ],
)
def test_disguised_key_words_are_written_plainly(text, folded):
    """Spaced letters, leetspeak, one-letter typos and split words fold to the key word."""
    assert fold_for_screening(text) == folded


@pytest.mark.parametrize(
    "text",
    [
        "precious metals",  # one edit from "previous", but an English word
        "a b c d e",  # spaced letters that spell no key word
        "covid-19 and h2o and b12",
        "well-known long-term results",
        "the rules of the roles",
    ],
)
def test_real_words_and_other_text_are_left_alone(text):
    """Words of the vocabulary, and disguises of no key word, are not changed."""
    assert fold_for_screening(text) == text


def test_folding_is_idempotent_on_key_words():
    """Every key word folds to itself."""
    text = " ".join(sorted(KEY_WORDS))
    assert fold_for_screening(text) == text
