"""Scoring exactly as upstream RULER (scripts/eval/evaluate.py, synthetic/constants.py), checked by hand."""

import pytest

from longctx.eval.scoring import postprocess_pred, score_predictions, string_match_all, string_match_part

PREDS = [
    "  The answer is 1234 and 5678\x00 ",  # control char -> newline, stripped: both found
    "\tAPPLE pie\x1f\n",  # case-insensitive; one of two references
    "",  # null
    "\x07",  # BEL is not whitespace for str.strip(); becomes "\n", then stripped: null
    "12\x0034",  # the control char splits the number: no match
]
REFS = [["1234", "5678"], ["apple", "banana"], ["x"], ["bell"], ["1234"]]


def test_postprocess_quirks():
    assert postprocess_pred("  a\x00b\x1fc\x7f ") == "a\nb\nc\x7f"  # \x7f (DEL) is kept
    assert postprocess_pred("\x07") == ""
    assert postprocess_pred(" \u00a0x\u00a0 ") == "x"  # unicode whitespace is stripped by str.strip()
    assert postprocess_pred("The Answer.") == "The Answer."  # no punctuation/article removal


def test_score_by_hand():
    all_ = score_predictions(PREDS, REFS, "string_match_all")
    # per sample 1, 1/2, 0, 0, 0 -> 1.5 / 5 * 100
    assert (all_.score, all_.nulls, all_.samples) == (30.0, 2, 5)
    part = score_predictions(PREDS, REFS, "string_match_part")
    # any-match: 1, 1, 0, 0, 0 -> 40.0 (lm-eval's fraction-of-references variant would give 30.0)
    assert (part.score, part.nulls) == (40.0, 2)


def test_rounding_and_scale():
    # one of three references matched in one of three samples: (1/3) / 3 * 100 = 11.111.. -> 11.11
    assert string_match_all(["a", "", ""], [["a", "b", "c"], ["z"], ["z"]]) == 11.11
    assert string_match_part(["a b", "b", "zz"], [["a"], ["b"], ["q"]]) == 66.67
    assert string_match_all(["X"], [["x"]]) == 100.0


def test_empty_and_bad_metric():
    assert score_predictions([], [], "string_match_all").score is None
    with pytest.raises(ValueError, match="unknown metric"):
        score_predictions(["a"], [["a"]], "exact")
