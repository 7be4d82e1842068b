"""The argument similarity of loop detection, in Python (the detector computes it in SQL).

``analytics/sql/repeated_calls.sql`` normalizes arguments exactly like this module: the
signature is the argument words (lower case, split on anything but letters, digits, ``_`` and
``.``, a few function words dropped, JSON escapes read as white space) sorted; the similarity is
the token-set Jaccard of those words with trailing dots trimmed, more stop words dropped (question
words, filler, JSON envelope keys of framework tool inputs) and a light stemming (plural -s/-ies,
-ing, -ed, final -e). ``analytics.calibration`` scores labelled pairs with it, and
tests/test_analytics_loops_differential.py holds the SQL equal to it on random span sets.
"""

from __future__ import annotations

import re

SIGNATURE_STOP_WORDS = frozenset(
    {"a", "an", "the", "in", "for", "of", "to", "and", "or", "on", "at", "by", "with"}
)
SIMILARITY_STOP_WORDS = SIGNATURE_STOP_WORDS | frozenset(
    """is are was were be been being what which who whom whose how when where why me my i you your
    we our it its this that these those there please can could would should do does did find get
    show give tell list search look lookup up about from into as any all some current latest args
    kwargs sanitize_inputs_outputs true false null none s has have had""".split()
)
_ESCAPE = re.compile(r"\\[ntr]")
_SPLIT = re.compile(r"[^a-z0-9_.]+")


def argument_words(args: str) -> list[str]:
    """The argument words of the signature (lower case, function words dropped), in order."""
    text = _ESCAPE.sub(" ", args or "").lower()
    return [word for word in _SPLIT.split(text) if word and word not in SIGNATURE_STOP_WORDS]


def signature(args: str) -> str:
    """The normalized arguments: the argument words sorted (white space, case, key order free)."""
    return " ".join(sorted(argument_words(args)))


def stem(word: str) -> str:
    """Light suffix stripping: plural -ies/-s, then -ing/-ed, then a final -e."""
    if len(word) > 4 and word.endswith("ies"):
        word = word[:-3] + "y"
    elif len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    if len(word) > 5 and word.endswith("ing"):
        word = word[:-3]
    elif len(word) > 4 and word.endswith("ed"):
        word = word[:-2]
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]
    return word


def similarity_tokens(args: str) -> frozenset[str]:
    """The token set two calls' arguments are compared on."""
    trimmed = (word.strip(".") for word in argument_words(args))
    return frozenset(stem(word) for word in trimmed if word and word not in SIMILARITY_STOP_WORDS)


def argument_similarity(first: str, second: str) -> float:
    """Similarity of two calls' arguments, 0..1: 1 for the same signature, else the Jaccard of
    their similarity tokens (0 when both have none)."""
    if signature(first) == signature(second):
        return 1.0
    a, b = similarity_tokens(first), similarity_tokens(second)
    return len(a & b) / len(a | b) if a and b else 0.0
