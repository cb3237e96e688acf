"""Offline text similarity for the groupthink detectors: no network, no model, pure Python.

Texts become TF-IDF vectors over their content-word stems: lower-cased ``[a-z0-9]+`` words, a small English
stop-word list removed, a light suffix stripper ("sharding", "shards" → "shard"), weights ``tf × idf`` with the
smoothed ``idf = ln((1 + N) / (1 + df)) + 1`` computed over the texts being compared, vectors L2-normalised;
similarity is their cosine (0 = no shared content word, 1 = the same words in the same proportions).

Built on that:

- :func:`premise_overlap` — the share of one agent's premises that another agent also holds (a premise of A is
  shared when its best match among B's premises reaches ``match``), averaged over every ordered pair of agents;
- :func:`clusters` — average-linkage agglomerative clustering of texts: the two groups with the highest mean
  pairwise similarity merge while that mean reaches ``threshold``; what is left are the semantic clusters;
- :func:`best_match` — the highest similarity of a text to any of several earlier texts (what "new" means for a
  claim).

Paraphrases that share no content word score low: the measure sees vocabulary, not meaning. That errs toward
"diverse", so the detectors it feeds fire on panels that repeat each other's words, not on every agreement.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Sequence

_WORD = re.compile(r"[a-z0-9]+")
_STOP_TEXT = """
a about above after again against all also am an and any are as at be because been before being below between
both but by can could did do does doing down during each few for from further had has have having he her here
hers him his how i if in into is it its itself just me more most my no nor not now of off on once only or other
our ours out over own same she should so some such than that the their theirs them then there these they this
those through to too under until up very was we were what when where which while who whom why will with would
you your yours yourself one two may might must shall us its it's via per than rather
"""
STOP_WORDS = frozenset(_STOP_TEXT.split())
_SUFFIXES = ("ations", "ation", "ments", "ment", "ness", "ings", "ing", "edly", "ed", "ies", "es", "ly", "s")


@functools.lru_cache(maxsize=16384)
def stem(word: str) -> str:
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)] + ("y" if suffix == "ies" else "")
    return word


def terms(text: str) -> list[str]:
    """The content-word stems of ``text``, in order."""
    return [stem(w) for w in _WORD.findall(text.lower()) if w not in STOP_WORDS and len(w) > 1]


def vectors(texts: Sequence[str]) -> list[dict[str, float]]:
    """L2-normalised TF-IDF vectors of ``texts``, the IDF computed over ``texts`` themselves."""
    counts = [Counter(terms(t)) for t in texts]
    df: Counter[str] = Counter()
    for c in counts:
        df.update(c.keys())
    n = len(texts)
    out = []
    for c in counts:
        v = {term: tf * (math.log((1 + n) / (1 + df[term])) + 1) for term, tf in c.items()}
        norm = math.sqrt(sum(x * x for x in v.values()))
        out.append({k: x / norm for k, x in v.items()} if norm else {})
    return out


def cosine(a: dict[str, float], b: dict[str, float]) -> float:
    if len(a) > len(b):
        a, b = b, a
    return sum(x * b.get(k, 0.0) for k, x in a.items())


def similarity_matrix(texts: Sequence[str]) -> list[list[float]]:
    """Every pairwise similarity of ``texts`` (1 on the diagonal), by dot products over each term's postings."""
    vs = vectors(texts)
    postings: dict[str, list[tuple[int, float]]] = {}
    for i, v in enumerate(vs):
        for term, weight in v.items():
            postings.setdefault(term, []).append((i, weight))
    matrix = []
    for i, v in enumerate(vs):
        row = [0.0] * len(vs)
        for term, weight in v.items():
            for j, other in postings[term]:
                row[j] += weight * other
        row[i] = 1.0
        matrix.append(row)
    return matrix


def best_match(text: str, earlier: Sequence[str]) -> float:
    """The highest similarity of ``text`` to any of ``earlier`` (0 when there is none)."""
    if not earlier:
        return 0.0
    vs = vectors([text, *earlier])
    return max((cosine(vs[0], v) for v in vs[1:]), default=0.0)


def best_matches(texts: Sequence[str], earlier: Sequence[str]) -> list[float]:
    """For each of ``texts``, its highest similarity to any of ``earlier`` (one vectorisation for all of them)."""
    if not texts:
        return []
    if not earlier:
        return [0.0] * len(texts)
    vs = vectors([*texts, *earlier])
    postings: dict[str, list[tuple[int, float]]] = {}
    for j, v in enumerate(vs[len(texts):]):
        for term, weight in v.items():
            postings.setdefault(term, []).append((j, weight))
    out = []
    for v in vs[: len(texts)]:
        dots = [0.0] * len(earlier)
        for term, weight in v.items():
            for j, other in postings.get(term, ()):
                dots[j] += weight * other
        out.append(max(dots))
    return out


def premise_overlap(premises: Sequence[Sequence[str]], match: float) -> float:
    """Mean over ordered pairs of agents (A, B) of the share of A's premises with a match ≥ ``match`` among B's.

    ``premises``: one list of premise texts per agent. Agents without premises are left out; fewer than two
    agents with premises overlap 0 (nothing to compare)."""
    groups = [list(p) for p in premises if p]
    if len(groups) < 2:
        return 0.0
    sim = similarity_matrix([t for g in groups for t in g])
    spans, start = [], 0
    for g in groups:
        spans.append(range(start, start + len(g)))
        start += len(g)
    shares = []
    for i, own in enumerate(spans):
        for j, other in enumerate(spans):
            if i == j:
                continue
            shared = sum(1 for a in own if max(sim[a][b] for b in other) >= match)
            shares.append(shared / len(own))
    return sum(shares) / len(shares)


def clusters(texts: Sequence[str], threshold: float) -> list[list[int]]:
    """Average-linkage agglomerative clustering: indexes of ``texts`` grouped; groups merge while their mean
    pairwise similarity is at least ``threshold``."""
    sim = similarity_matrix(texts)
    groups = [[i] for i in range(len(texts))]
    while len(groups) > 1:
        best, pair = -1.0, (0, 0)
        for a in range(len(groups)):
            for b in range(a + 1, len(groups)):
                mean = sum(sim[i][j] for i in groups[a] for j in groups[b]) / (len(groups[a]) * len(groups[b]))
                if mean > best:
                    best, pair = mean, (a, b)
        if best < threshold:
            break
        a, b = pair
        groups[a] = sorted(groups[a] + groups[b])
        del groups[b]
    return groups
