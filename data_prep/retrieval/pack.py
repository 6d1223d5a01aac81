"""Budget packing (SPEC §10): whole units in order until the next one would exceed any model's budget.

Every model of a study must see the same evidence text, so a unit is kept only while it fits the
budget under *every* tokenizer of the study; the first tokenizer it would overflow ends the list.
A unit's cost is the token count of its text alone (no special tokens, no line label, no chat
template), summed over the units kept: the same number whatever prompt wraps them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from real_fae_core.errors import UserError


class BudgetTooSmall(ValueError):
    """The first unit of an ordering alone exceeds the budget: packing would give an empty pool."""

    def __init__(self, budget: int, unit: int, tokenizer: str, tokens: int):
        self.budget, self.unit, self.tokenizer, self.tokens = budget, unit, tokenizer, tokens
        super().__init__(f"budget {budget} tokens is smaller than the first unit (id {unit}: {tokens} tokens "
                         f"with {tokenizer})")


def pack(order: Sequence[int], lengths: dict[str, Sequence[int]], budget: int) -> list[int]:
    """The longest prefix of ``order`` (unit ids) whose token total fits ``budget`` under every tokenizer.

    ``lengths`` maps a tokenizer's name to the token count of each unit, indexed by unit id.
    """
    totals = dict.fromkeys(lengths, 0)
    kept: list[int] = []
    for uid in order:
        over = [name for name in lengths if totals[name] + lengths[name][uid] > budget]
        if over:
            if not kept:
                raise BudgetTooSmall(budget, uid, over[0], lengths[over[0]][uid])
            break
        for name in lengths:
            totals[name] += lengths[name][uid]
        kept.append(uid)
    return kept


def check_budgets(budgets: Sequence[int]) -> list[int]:
    """The budgets, each once, in the order given; a budget under one token is bad input."""
    out: list[int] = []
    for b in budgets:
        if b <= 0:
            raise UserError(f"--budgets: {b} is not a positive number of tokens")
        if b not in out:
            out.append(b)
    return out


def load_tokenizers(names: Sequence[str]) -> dict:
    """``{name: tokenizer}``; one that cannot be loaded is bad input naming it."""
    from transformers import AutoTokenizer

    out = {}
    for name in names:
        if not Path(name).expanduser().exists() and (name.startswith((".", "/", "~")) or name.count("/") > 1):
            raise UserError(f"--tokenizer {name!r}: path does not exist")
        try:
            out[name] = AutoTokenizer.from_pretrained(name)
        except (OSError, ValueError) as exc:
            raise UserError(f"--tokenizer {name!r}: cannot be loaded ({str(exc).splitlines()[0]})") from None
    return out


def token_lengths(tokenizers: dict, texts: Sequence[str]) -> dict[str, list[int]]:
    """``{tokenizer name: [token count of each text]}``, special tokens left out."""
    if not texts:
        return {name: [] for name in tokenizers}
    return {name: [len(ids) for ids in tok(list(texts), add_special_tokens=False)["input_ids"]]
            for name, tok in tokenizers.items()}
