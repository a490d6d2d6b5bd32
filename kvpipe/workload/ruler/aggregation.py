"""RULER's tracing and aggregation tasks: variable tracking (vt: follow a chain of assignments
through noise), common-word extraction (cwe: the 10 words repeated most in a numbered list) and
frequent-word extraction (fwe: the three most frequent coded words of a Zipf-distributed text).

As RULER's variable_tracking.py, common_words_extraction.py and freq_words_extraction.py, with their
settings for prompts under 4,096 tokens (cwe: common words 6 times, the rest once, one worked
example of 20 words; fwe: alpha 2, vocabulary of length/50 six-letter words, '...' the noise).
Differs: vt has no worked example (RULER's optional `add_fewshot`); cwe's words come from Python's
docs (`sources.words`, hyphenated pairs beyond them) instead of `wonderwords`.
"""

from __future__ import annotations

import math
import random
import string

from kvpipe.workload._encoding import raw_ids
from kvpipe.workload.ruler import sources
from kvpipe.workload.ruler.niah import NOISE
from kvpipe.workload.ruler.prompt import Draft, between_lines, grown

VT_INTRO = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
VT_QUESTION = "\nQuestion: Find all variables that are assigned the value {query} in the text above."
VT_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {count} variables "
    "are assigned the value {query}, they are: "
)
CWE_INTRO = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n"
)
CWE_QUESTION = "\nQuestion: What are the 10 most common words in the above list?"
CWE_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
FWE_INTRO = (
    "Read the following coded text and track the frequency of each coded word. "
    "Find the three most frequently appeared coded words. "
)
FWE_QUESTION = (
    "\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
    "What are the three most frequently appeared words in the above coded text?"
)
FWE_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"
HOPS, COMMON, FWE_ALPHA, CODED_LETTERS = 4, 10, 2.0, 6


def variable_tracking(tokenizer, rng: random.Random, length: int) -> Draft:
    """One chain of HOPS + 1 five-letter variables from a 5-digit value, its lines in order among
    the noise; the answer is every variable of the chain."""
    names: list[str] = []
    while len(names) < HOPS + 1:
        name = "".join(rng.choices(string.ascii_uppercase, k=5))
        names += [name] if name not in names else []
    start = str(rng.randint(10000, 99999))
    chain = [f"VAR {names[0]} = {start}"] + [f"VAR {names[i + 1]} = VAR {names[i]} " for i in range(HOPS)]
    context = between_lines(tokenizer, lambda: NOISE, chain, rng)
    minimum = sum(len(raw_ids(tokenizer, line + "\n")) for line in chain)
    question, prefix = VT_QUESTION.format(query=start), VT_PREFIX.format(count=HOPS + 1, query=start)
    return Draft(VT_INTRO, question, prefix, names, context, minimum)


def common_words(tokenizer, rng: random.Random, length: int) -> Draft:
    """A worked example, then a numbered list where COMMON words appear 6 times and the rest once."""
    seed = rng.random()
    example, answer = _word_list(random.Random(f"{seed}:example"), 20, common_repeats=3)
    shown = CWE_INTRO + example + CWE_QUESTION + CWE_PREFIX + " " + _numbered(answer) + "\n"
    context, minimum = grown(tokenizer, lambda count: _word_list(random.Random(seed), count, 6)[0], COMMON + 1)
    expected = _word_list(random.Random(seed), COMMON + 1, 6)[1]  # the common words do not depend on count
    return Draft(shown + CWE_INTRO, CWE_QUESTION, CWE_PREFIX, expected, context, minimum)


def _word_list(rng: random.Random, distinct: int, common_repeats: int) -> tuple[str, list[str]]:
    """A shuffled numbered list of `distinct` words, the COMMON ones (drawn first, so the same for
    any length) `common_repeats` times each."""
    common = rng.sample(sources.words(), COMMON)
    rest = rng.sample([word for word in _cwe_pool(distinct) if word not in common], distinct - COMMON)
    listed = common * common_repeats + rest
    rng.shuffle(listed)
    return _numbered(listed), common


def _cwe_pool(distinct: int) -> list[str]:
    """The documentation's words, and hyphenated pairs of them where a list needs more."""
    pool = list(sources.words())
    pairs = random.Random(0)
    while len(pool) < distinct:
        pool.append("-".join(pairs.sample(sources.words(), 2)))
    return pool


def _numbered(words: list[str]) -> str:
    return " ".join(f"{i + 1}. {word}" for i, word in enumerate(words))


def frequent_words(tokenizer, rng: random.Random, length: int) -> Draft:
    """Coded words whose counts follow Zipf's law (alpha 2); the top-ranked one is '...' (noise),
    and the answer is ranks 2 to 4."""
    vocabulary: set[str] = set()
    size = max(length // 50, 8)
    while len(vocabulary) < size:
        vocabulary.add("".join(rng.choices(string.ascii_lowercase, k=CODED_LETTERS)))
    ranked = sorted(vocabulary)
    random.Random(rng.random()).shuffle(ranked)
    ranked[0] = "..."
    order = rng.random()

    def text_of(words: int) -> str:
        counts = [int(words * rank**-FWE_ALPHA / _ZETA_2) for rank in range(1, len(ranked) + 1)]
        coded = [word for word, count in zip(ranked, counts) for _ in range(count)]
        random.Random(order).shuffle(coded)
        return " ".join(coded)

    context, minimum = grown(tokenizer, text_of, least=100)  # 100 words: ranks 2-4 already counted apart
    return Draft(FWE_INTRO, FWE_QUESTION, FWE_PREFIX, ranked[1:4], context, minimum)


_ZETA_2 = math.pi**2 / 6  # Riemann's zeta at alpha = 2, RULER's scipy.special.zeta(2.0)
