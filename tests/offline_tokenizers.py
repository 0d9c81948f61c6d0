"""Byte-level BPE tokenizers trained offline on a few texts, GPT-2 style: what the span and
dataset tests build instead of downloading a model's tokenizer."""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from tokenizers.normalizers import Normalizer


def byte_level_bpe(
    texts: Iterable[str],
    *,
    vocab_size: int,
    special_tokens: list[str],
    trim_offsets: bool = False,
    normalizer: Normalizer | None = None,
) -> Tokenizer:
    """A byte-level BPE (no prefix space) trained on ``texts``, normalised by ``normalizer``
    (None: not at all) in training and after, its offsets trimmed of spaces where
    ``trim_offsets``."""
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=trim_offsets)
    return tok
