"""The depth scenario's long prompts: generated from the recipe's seed alone, tokenized by the model.

A prompt of 4k or 120k tokens cannot be written into a recipe, and a download would make the run
depend on a host: the text is a passage of sentences drawn from a fixed word list by numpy's PCG64
seeded with the recipe's ``depth.seed``, tokenized by the first stage (the model's own tokenizer, with
its BOS), then cut to the length asked for.  Same seed, same model: the same tokens on every host;
``prompts`` cuts every length from the longest, so the scenario reads one passage to different depths.
Ordinary words rather than token ids drawn at random: a random id can be a control or unused
token, whose rows in an untrained or real embedding say nothing about the depth a user reaches.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from core.errors import ConfigurationError

WORDS = (
    "the a of to and in is on for with as by at from that this it be are was were has have had not but "
    "or if then when where which while each every one two three four five six seven eight nine ten "
    "model layer stage worker pipeline token tokens context cache key value head heads attention window "
    "compressed index indexer expert experts router residual boundary seam network machine host port "
    "session epoch prompt prefill decode batch pass passes chunk chunks position positions length "
    "weight weights tensor tensors float bytes memory disk file files split shard shards certificate "
    "report gate gates parity speed figure figures limit limits run runs build lane lanes patch commit "
    "signed verified hash digest recipe placement route ring chain relay driver sink trace reference "
    "long short deep wide small large fast slow early late first last next previous same other new old "
    "reads writes holds moves sends takes keeps drops fills grows waits starts stops checks counts"
).split()
Tokenize = Callable[[str], list[int]]
"""``tokenize(text) -> ids``: the first stage's Tokenize, BOS included (worker.client.StageClient)."""


def passage(seed: int, n_words: int) -> str:
    """``n_words`` words in sentences of 4-15 words, numbers now and then: one seed, one text."""
    rng = np.random.Generator(np.random.PCG64(seed))
    sentences: list[str] = []
    written = 0
    while written < n_words:
        length = min(int(rng.integers(4, 16)), n_words - written)
        words = [WORDS[int(i)] for i in rng.integers(0, len(WORDS), size=length)]
        if rng.random() < 0.2:
            words[int(rng.integers(0, length))] = str(int(rng.integers(0, 10_000)))
        sentences.append(" ".join(words).capitalize() + ".")
        written += length
    return " ".join(sentences)


def long_prompt(seed: int, n_tokens: int, tokenize: Tokenize) -> list[int]:
    """The first ``n_tokens`` tokens of the seed's passage, tokenized by the model.  The passage is
    doubled until it is long enough (a word is at least one token, so ``n_tokens`` words is a start)."""
    if n_tokens < 2:
        raise ConfigurationError(f"a depth prompt needs at least 2 tokens, not {n_tokens}")
    n_words, tokens = n_tokens, []
    for _ in range(8):
        tokens = tokenize(passage(seed, n_words))
        if len(tokens) >= n_tokens:
            return tokens[:n_tokens]
        n_words *= 2
    raise ConfigurationError(
        f"the model's tokenizer gave {len(tokens)} tokens for a passage of {n_words // 2} words, "
        f"fewer than the {n_tokens} asked for"
    )


def prompts(seed: int, lengths: tuple[int, ...], tokenize: Tokenize) -> dict[int, list[int]]:
    """One prompt per length, each the first tokens of the longest."""
    longest = long_prompt(seed, max(lengths), tokenize)
    return {n: longest[:n] for n in lengths}
