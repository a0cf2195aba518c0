"""Build a drafter by name, for the CLI and the benchmark scripts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..core.linear_layout import follow_target_layout
from ..core.paths import REPO_ROOT
from ..core.rounds import Drafter
from ..core.target import DEFAULT_TARGET
from .draft_lm import DraftLMDrafter, load_draft_lm
from .lookup import LOOKUP_FIRST_NGRAM, LookupFirst, NgramDrafter, OracleDrafter
from .trained import load_trained_drafter

FEATURE_DRAFTERS = ("eagle", "dflash", "dspark")  # trained on the target's features
DRAFTER_NAMES = ("none", "ngram", "draft-lm", "oracle", *FEATURE_DRAFTERS)
LOOKUP_FIRST = "+ngram"  # e.g. "dspark+ngram": prompt lookup where it matches, the trained drafter elsewhere (ours)
SHIPPED_DIR = REPO_ROOT / "data" / "drafters" / DEFAULT_TARGET
SHIPPED_DRAFTERS = ("eagle", "dflash", "dspark-markov", "dspark-rnn")  # and the draft LM, "draft-lm"


def split_lookup_first(name: str, trained: Sequence[str] = FEATURE_DRAFTERS) -> tuple[str, int | None]:
    """The drafter under a :class:`LookupFirst` name and the shortest match it copies from:
    ``"dspark+ngram3"`` -> ``("dspark", 3)``, ``"dspark+ngram"`` -> ``("dspark", LOOKUP_FIRST_NGRAM)``;
    a name without ``+ngram`` -> ``(name, None)``. The drafter under it must be one of ``trained``."""
    base, found, n = name.partition(LOOKUP_FIRST)
    if not found:
        return name, None
    if base not in trained:
        raise ValueError(f"{name!r}: '{LOOKUP_FIRST}' goes behind a drafter trained on the target's features "
                         f"({', '.join(trained)}), not {base!r}.")
    if n and not (n.isdigit() and int(n) >= 1):
        raise ValueError(f"{name!r}: write '{base}{LOOKUP_FIRST}' or '{base}{LOOKUP_FIRST}N' with N >= 1, the "
                         "shortest match it copies from.")
    return base, int(n) if n else LOOKUP_FIRST_NGRAM


def check_drafter_name(name: str) -> None:
    """Raise a clear error for a name :func:`build_drafter` does not take."""
    if split_lookup_first(name)[0] not in DRAFTER_NAMES:
        raise ValueError(f"Unknown drafter {name!r}; choose one of {', '.join(DRAFTER_NAMES)} "
                         f"(a trained one may take '{LOOKUP_FIRST}', e.g. 'dspark{LOOKUP_FIRST}').")


def shipped_drafter(name: str) -> Path:
    """Folder of a drafter shipped for the default target (``eagle``, ``dflash``, ``dspark-markov``,
    ``dspark-rnn`` or ``draft-lm``); ``make train-drafters`` re-creates them."""
    if name not in SHIPPED_DRAFTERS + ("draft-lm",):
        raise ValueError(f"No shipped drafter {name!r}; shipped: {', '.join(SHIPPED_DRAFTERS + ('draft-lm',))}.")
    return SHIPPED_DIR / name


def build_drafter(
    name: str,
    target_model: PreTrainedModel,
    target_tokenizer: PreTrainedTokenizerBase,
    *,
    draft_model: str | None = None,
    reference: Sequence[int] | None = None,
) -> Drafter | None:
    """A drafter by name (``None`` for ``"none"``, plain decoding).

    draft-lm takes ``draft_model``, a Hugging Face id or folder of a causal LM with the target's
    tokenizer; eagle, dflash and dspark take ``draft_model``, a trained drafter folder for this
    target. Without one they use the drafters shipped for the default target (dspark: the Markov
    head). They run in the target's dtype. oracle needs ``reference``, the continuation it will propose.
    ``eagle+ngram``, ``dflash+ngram``, ``dspark+ngram`` (``+ngramN``: copy from matches of N tokens or more):
    :class:`LookupFirst` over that trained drafter.
    """
    check_drafter_name(name)
    base, min_ngram = split_lookup_first(name)
    if min_ngram is not None:
        return LookupFirst(build_drafter(base, target_model, target_tokenizer, draft_model=draft_model), min_ngram)
    if name == "none":
        return None
    if name == "ngram":
        return NgramDrafter()
    if name == "oracle":
        if reference is None:
            raise ValueError("The oracle drafter needs a reference continuation (e.g. the target's greedy output).")
        return OracleDrafter(reference)
    draft_model = draft_model or str(shipped_drafter("dspark-markov" if name == "dspark" else name))
    if name != "draft-lm":
        drafter = load_trained_drafter(draft_model, target_model, target_tokenizer)
        if drafter.drafter.config.kind != name:
            raise ValueError(f"{draft_model} holds a {drafter.drafter.config.kind} drafter, not {name}.")
        return drafter
    model, tokenizer = load_draft_lm(draft_model, target_tokenizer, device=str(target_model.device),
                                     dtype=target_model.dtype)
    follow_target_layout(target_model, model)
    return DraftLMDrafter(model, tokenizer, target_tokenizer)
