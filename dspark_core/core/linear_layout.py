"""Linear weights stored input-major: the same matrices, laid out for the few-row products of verification.

``nn.Linear`` keeps its weight ``W`` [out, in] row-major and computes ``x @ W.T``. For a few rows (2 to 16:
the tokens of a verification forward) MKL's float32 GEMM in that layout takes a kernel that is slow for so
few rows, while the same product with ``W.T`` contiguous (``W`` stored input-major, strides (1, out)) takes a
faster one; one row costs about the same either way. On a 2-core Intel Xeon without AMX, 8 rows through one
of the default target's MLP linears took half the time input-major, and through all its layers' linears in
turn, the weights cold, 0.63 of the time on 2 threads and 0.76 on 1 (microbenchmarks, not committed).
``F.linear`` picks the kernel by itself once the weight's memory is input-major, so the layout is only a
re-striding of the parameters: the model computes
the same function (only the kernel's rounding may differ) and plain and speculative decoding both run
through it. ``python -m dspark_core.eval.linear_layout`` measures both layouts side by side.
"""

from __future__ import annotations

import torch
from torch import nn

LINEAR_LAYOUTS = ("torch", "input-major")  # nn.Linear's own row-major weights, or input-major ones


def input_major(weight: torch.Tensor) -> torch.Tensor:
    """The same [out, in] matrix with its memory input-major (its transpose is contiguous)."""
    return weight.t().contiguous().t()


def is_input_major(weight: torch.Tensor) -> bool:
    """Whether a 2-D weight [out, in] is stored input-major (and not also row-major, as a vector is)."""
    return weight.dim() == 2 and weight.shape[0] > 1 and weight.stride() == (1, weight.shape[0])


@torch.no_grad()
def use_input_major_linears(model: nn.Module) -> int:
    """Re-stride every ``nn.Linear`` weight of ``model`` input-major, in place; returns how many. An LM head
    tied to the input embedding gets its own copy (the embedding keeps its row-major layout for lookups)."""
    linears = [module for module in model.modules() if isinstance(module, nn.Linear)]
    for linear in linears:
        linear.weight = nn.Parameter(input_major(linear.weight), requires_grad=linear.weight.requires_grad)
    return len(linears)


def check_linear_layout(layout: str) -> None:
    """A clear error unless ``layout`` is one of :data:`LINEAR_LAYOUTS`."""
    if layout not in LINEAR_LAYOUTS:
        raise ValueError(f"Unknown linear layout {layout!r}; choose one of {', '.join(LINEAR_LAYOUTS)}.")


def apply_linear_layout(model: nn.Module, layout: str) -> nn.Module:
    """``model`` with its linears in ``layout`` (one of :data:`LINEAR_LAYOUTS`); a clear error otherwise."""
    check_linear_layout(layout)
    if layout == "input-major":
        use_input_major_linears(model)
    return model


def layout_of(model: nn.Module) -> str:
    """The layout of a model's linears, read from its LM head: ``"input-major"`` or ``"torch"``."""
    head = model.get_output_embeddings()
    return "input-major" if head is not None and is_input_major(head.weight) else "torch"


def follows_input_major(target: nn.Module, drafter: nn.Module) -> None:
    """Give ``drafter`` the target's layout: input-major linears when the target's LM head is input-major."""
    apply_linear_layout(drafter, layout_of(target))
