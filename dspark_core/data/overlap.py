"""Near-duplicate detection between training text and evaluation prompts.

Two texts overlap when they are equal after normalising (case, runs of digits, whitespace), when
their word 5-gram sets have Jaccard similarity >= 0.5, or when at least half of an evaluation
prompt's 5-grams occur in the training text (a prompt pasted inside a longer message). The
training-set builder drops every conversation that overlaps an evaluation prompt, and a test checks
the committed sets with the same rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

THRESHOLD = 0.5


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"\d+", "#", text.lower())).strip()


def shingles(text: str, n: int = 5) -> frozenset[tuple[str, ...]]:
    words = normalise(text).split()
    return frozenset(tuple(words[i : i + n]) for i in range(max(1, len(words) - n + 1)))


class OverlapIndex:
    """The evaluation prompts, indexed so that a training text is checked against all of them at once."""

    def __init__(self, prompts: Iterable[tuple[str, str]]):
        """prompts: (id, text) pairs of every evaluation turn."""
        self.ids, self.exact, self.shingles = [], {}, []
        self.by_shingle: dict[tuple[str, ...], list[int]] = {}
        for index, (prompt_id, text) in enumerate(prompts):
            self.ids.append(prompt_id)
            self.exact[normalise(text)] = prompt_id
            sh = shingles(text)
            self.shingles.append(sh)
            for s in sh:
                self.by_shingle.setdefault(s, []).append(index)

    def matches(self, text: str) -> list[str]:
        """Ids of the evaluation prompts that ``text`` overlaps."""
        found = [self.exact[normalise(text)]] if normalise(text) in self.exact else []
        sh = shingles(text)
        counts: dict[int, int] = {}
        for s in sh:
            for index in self.by_shingle.get(s, ()):
                counts[index] = counts.get(index, 0) + 1
        for index, shared in counts.items():
            mine = self.shingles[index]
            if shared / len(sh | mine) >= THRESHOLD or shared / len(mine) >= THRESHOLD:
                found.append(self.ids[index])
        return list(dict.fromkeys(found))  # an exact match also shares its shingles: name it once
