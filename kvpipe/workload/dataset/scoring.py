"""How a labelled file's answers are scored (`workload.scorer`), and the 95% interval of their mean.

Text is compared as SQuAD compares it: lower case, punctuation and the articles a/an/the removed,
whitespace collapsed; rouge_l leaves text to Google's `rouge_score`, which tokenises itself. Each
scorer gives an answer 0..1 against one expected answer; an answer is scored against each accepted
answer and keeps the best. Pure Python at import (rouge_score, and scipy for a t interval, imported
when used).
"""

from __future__ import annotations

import contextlib
import math
import re
import statistics
import string
import sys
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
# 1,234.5 or -7 or 0.25: thousands separators are part of a number, a trailing full stop is not
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")
Z_95 = 1.959963984540054  # the normal quantile of a two-sided 95% interval


def normalise(text: str) -> str:
    """SQuAD's normalisation: lower case, no punctuation, no articles, single spaces."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def _contains(answer: str, expected: str) -> float:
    """1 where the expected words appear together, as whole words, in the answer."""
    words, wanted = normalise(answer).split(), normalise(expected).split()
    return float(any(words[i : i + len(wanted)] == wanted for i in range(len(words) - len(wanted) + 1)))


def _exact(answer: str, expected: str) -> float:
    return float(normalise(answer) == normalise(expected))


def _number(answer: str, expected: str) -> float:
    """1 where the answer's first number equals the expected one (7 and 7.0 are equal)."""
    found = _NUMBER.search(answer)
    return float(found is not None and _as_number(found.group()) == _as_number(expected))


def _as_number(text: str) -> float:
    return float(text.strip().replace(",", ""))


def _regex(answer: str, expected: str) -> float:
    return float(re.search(expected, answer) is not None)


def _f1(answer: str, expected: str) -> float:
    """SQuAD's token F1 between the answer's words and the expected ones."""
    ours, theirs = normalise(answer).split(), normalise(expected).split()
    same = sum((Counter(ours) & Counter(theirs)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(ours), same / len(theirs)
    return 2 * precision * recall / (precision + recall)


def _rouge_l(answer: str, expected: str) -> float:
    """ROUGE-L's F-measure (longest common subsequence of words), as Google's rouge_score computes it."""
    return _rouge_scorer().score(expected, answer)["rougeL"].fmeasure


@lru_cache(maxsize=1)
def _rouge_scorer():
    # absl (which rouge_score imports) keeps the sys.stderr of the moment it is first imported: a
    # stream swapped in for a while (a test's capture) would be closed under it, so it gets the real one
    with contextlib.redirect_stderr(sys.__stderr__):
        from rouge_score import rouge_scorer  # imports nltk: ~1.5 s, paid only where rouge_l scores

    # No stemming, as Hugging Face evaluate's rouge defaults: "cats" and "cat" are different words
    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)


def _rouge_tokens_left(expected: str) -> str | None:
    from rouge_score import tokenize  # the tokeniser alone: no nltk

    if tokenize.tokenize(expected, None):
        return None
    return "has no ASCII letters or digits, the only words rouge_score's tokeniser keeps"


def _words_left(expected: str) -> str | None:
    return None if normalise(expected) else "normalises to nothing (only punctuation or articles)"


def _is_number(expected: str) -> str | None:
    try:
        _as_number(expected)
    except ValueError:
        return "is not a number, which workload.scorer=number expects"
    return None


def _compiles(expected: str) -> str | None:
    try:
        re.compile(expected)
    except re.error as error:
        return f"is not a regular expression ({error})"
    return None


@dataclass(frozen=True)
class Scorer:
    """One way to score an answer: `score(answer, expected)` in 0..1; `binary` where it is 0 or 1
    (an interval for a proportion); `unusable(expected)` says why an expected answer cannot be
    scored this way, or None."""

    name: str
    score: Callable[[str, str], float]
    binary: bool = True
    unusable: Callable[[str], str | None] = _words_left

    def best(self, answer: str, accepted: list[str]) -> float:
        """The answer's score against the accepted answer it matches best."""
        return max(self.score(answer, expected) for expected in accepted)


SCORERS = {
    scorer.name: scorer
    for scorer in (
        Scorer("contains", _contains),
        Scorer("exact", _exact),
        Scorer("number", _number, unusable=_is_number),
        Scorer("regex", _regex, unusable=_compiles),
        Scorer("f1", _f1, binary=False),
        Scorer("rouge_l", _rouge_l, binary=False, unusable=_rouge_tokens_left),
    )
}
DEFAULT = "contains"


def wilson(successes: float, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson's score interval of a proportion: sound at 0 or n successes and for few answers."""
    share, z2 = successes / n, z * z
    centre = (share + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(share * (1 - share) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # exactly 0 and 1 at the ends, where rounding would leave the interval a hair beside the share
    low = 0.0 if successes == 0 else centre - half
    high = 1.0 if successes == n else centre + half
    return low, high


def t_interval(scores: list[float]) -> tuple[float, float]:
    """Student's t interval of a mean score, within 0..1; one score says nothing: (0, 1)."""
    if len(scores) < 2:
        return 0.0, 1.0
    from scipy.stats import t

    mean = statistics.fmean(scores)
    half = t.ppf(0.975, len(scores) - 1) * statistics.stdev(scores) / math.sqrt(len(scores))
    return max(0.0, mean - half), min(1.0, mean + half)


def interval(scorer: Scorer, scores: list[float]) -> tuple[float, float]:
    """The 95% interval of the mean score: Wilson's for a scorer of 0 or 1, else a t interval."""
    return wilson(sum(scores), len(scores)) if scorer.binary else t_interval(scores)
