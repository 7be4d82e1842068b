"""The argument similarity of loop detection, in Python (the detector computes it in SQL).

``analytics/sql/repeated_calls.sql`` normalizes arguments exactly like this module: the
signature is the argument words (lower case, split on anything but letters, digits, ``_`` and
``.``, a few function words dropped, JSON escapes read as white space) sorted; the similarity is
the token-set Jaccard of those words with trailing dots trimmed, more stop words dropped (question
words, filler, JSON envelope keys of framework tool inputs) and a light stemming (plural -s/-ies,
-ing, -ed, final -e). ``analytics.calibration`` scores labelled pairs with it, and
tests/analytics/test_loops_differential.py holds the SQL equal to it on random span sets.
"""

from __future__ import annotations

import functools
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


@functools.lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """Light suffix stripping: plural -ies/-s, then -ing/-ed, then a final -e (cached: a fold
    stems the words of every new call, and the same words recur)."""
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


@functools.lru_cache(maxsize=32768)
def similarity_tokens(args: str) -> frozenset[str]:
    """The token set two calls' arguments are compared on (cached: a fold compares each new call
    with its group's last calls, tokenized when they were new)."""
    trimmed = (word.strip(".") for word in argument_words(args))
    return frozenset(stem(word) for word in trimmed if word and word not in SIMILARITY_STOP_WORDS)


def argument_similarity(first: str, second: str) -> float:
    """Similarity of two calls' arguments, 0..1: 1 for the same signature, else the Jaccard of
    their similarity tokens (0 when both have none)."""
    if signature(first) == signature(second):
        return 1.0
    a, b = similarity_tokens(first), similarity_tokens(second)
    return len(a & b) / len(a | b) if a and b else 0.0


# Task statements (what a manager asks a sub-agent) are sentences, not tool arguments: two asks
# of the same request share few words ("employee count" / "number of employees") and two asks
# that differ in one year or name share almost all. They are compared on meaning (the cosine of
# their sentence embeddings) weighted by whether they name the same specifics (numbers and
# names): see task_similarity. Calibrated on sample_traces/calibration/task_pairs.csv.
_TASK_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9&'\u2019.\-]*")
_SENTENCE_END = re.compile(r"[.!?:;]\s")


def _task_words(text: str) -> list[tuple[int, str]]:
    """(position in its sentence, word) of a task statement's words, a trailing 's dropped."""
    words = []
    for sentence in _SENTENCE_END.split(text or ""):
        for position, word in enumerate(_TASK_WORD.findall(sentence)):
            word = word.rstrip(".-")
            for suffix in ("'s", "\u2019s"):
                word = word.removesuffix(suffix)
            if word:
                words.append((position, word))
    return words


@functools.lru_cache(maxsize=16384)
def task_specifics(text: str) -> frozenset[str]:
    """The numbers and names a task statement asks about: its words that hold a digit, and its
    capitalised words that do not start a sentence (lower case, a trailing 's dropped). Cached,
    as ``_named``: a fold compares each new hand-off with its group's last ones."""
    return frozenset(
        word.lower()
        for position, word in _task_words(text)
        if any(ch.isdigit() for ch in word) or (position > 0 and word[0].isupper() and word != "I")
    )


def specifics_overlap(first: str, second: str) -> float:
    """The share of the two statements' specifics that both statements name (a name that starts
    one statement's sentence still counts as named there); 1 when neither names any."""
    specifics = task_specifics(first) | task_specifics(second)
    if not specifics:
        return 1.0
    return len(specifics & _named(first) & _named(second)) / len(specifics)


@functools.lru_cache(maxsize=16384)
def _named(text: str) -> frozenset[str]:
    """Every word a task statement names (lower case)."""
    return frozenset(word.lower() for _, word in _task_words(text))


def task_similarity(first: str, second: str, cosine: float) -> float:
    """Similarity of two task statements, 0..1: 1 for the same signature, else the cosine of
    their sentence embeddings (``cosine``, clipped at 0) times the Jaccard of their specifics."""
    if signature(first) == signature(second):
        return 1.0
    return max(0.0, float(cosine)) * specifics_overlap(first, second)


def could_link(first: str, second: str, threshold: float) -> bool:
    """Whether two task statements' ``task_similarity`` can reach ``threshold`` whatever their
    embeddings: it is at most their specifics overlap (the cosine of normalised vectors is at
    most 1; a margin for its rounding), so pairs below need no embedding."""
    return specifics_overlap(first, second) * (1 + 1e-6) >= threshold
