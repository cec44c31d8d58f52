"""Text to token ids, the transformer supernet's input: the one tokenizer training, clients and the demo share.

A client sends ``INPUT`` as int64 token ids [batch, sequence length]; the vocabulary that maps words to ids ships
beside the model (``vocab.txt`` in its version folder, one token per line, line i is id i), and the length is the
input's dimension in the model's config. Words are lower-cased runs of letters, digits and apostrophes, and each
other visible character is a token of its own; a word not in the vocabulary is ``<unk>``, and rows are padded
with ``<pad>`` (id 0, which the model masks out) or cut to the length.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

VOCAB_FILE = "vocab.txt"
PAD, UNK = "<pad>", "<unk>"  # ids 0 and 1
_TOKEN = re.compile(r"[a-z0-9']+|[^\sa-z0-9']")


def words(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


@dataclass(frozen=True)
class Tokenizer:
    tokens: tuple[str, ...]  # id -> token; tokens[0] is PAD, tokens[1] UNK

    def __post_init__(self) -> None:
        if self.tokens[:2] != (PAD, UNK):
            raise ValueError(f"a vocabulary starts with {PAD} and {UNK}, got {list(self.tokens[:2])}")
        object.__setattr__(self, "_ids", {t: i for i, t in enumerate(self.tokens)})

    def __len__(self) -> int:
        return len(self.tokens)

    def encode(self, texts: Sequence[str], length: int) -> np.ndarray:
        """Token ids int64 [len(texts), length]."""
        out = np.zeros((len(texts), length), dtype=np.int64)
        for row, text in zip(out, texts):
            ids = [self._ids.get(w, 1) for w in words(text)[:length]]  # type: ignore[attr-defined]
            row[: len(ids)] = ids
        return out

    @classmethod
    def from_corpus(cls, texts: Iterable[str], size: int, min_count: int = 2) -> Tokenizer:
        """The ``size`` - 2 most frequent words seen at least ``min_count`` times (ties by first appearance)."""
        counts: dict[str, int] = {}
        for text in texts:
            for w in words(text):
                counts[w] = counts.get(w, 0) + 1
        frequent = sorted((w for w, n in counts.items() if n >= min_count), key=lambda w: -counts[w])
        return cls((PAD, UNK, *frequent[: size - 2]))

    def text(self) -> str:
        """The vocabulary file's content."""
        return "\n".join(self.tokens) + "\n"

    def save(self, path: Path) -> None:
        path.write_text(self.text())

    @classmethod
    def load(cls, path: Path) -> Tokenizer:
        return cls(tuple(path.read_text().splitlines()))
