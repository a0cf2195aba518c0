"""Linear weights laid out for the few-row products of verification: the same matrices, other memory.

Two layouts besides ``nn.Linear``'s own (``"torch"``): ``"input-major"`` (float32, below) and ``"onednn-packed"``
(bfloat16 on AMX, :class:`PackedLinear`).

Input-major. ``nn.Linear`` keeps its weight ``W`` [out, in] row-major and computes ``x @ W.T``. For a few rows (2 to 16:
the tokens of a verification forward) MKL's float32 GEMM in that layout takes a kernel that is slow for so
few rows, while the same product with ``W.T`` contiguous (``W`` stored input-major, strides (1, out)) takes a
faster one; one row costs about the same either way. On a 2-core Intel Xeon without AMX, 8 rows through one
of the default target's MLP linears took half the time input-major, and through all its layers' linears in
turn, the weights cold, 0.63 of the time on 2 threads and 0.76 on 1 (microbenchmarks, not committed).
``F.linear`` picks the kernel by itself once the weight's memory is input-major, so the layout is only a
re-striding of the parameters: the model computes
the same function (only the kernel's rounding may differ) and plain and speculative decoding both run
through it. ``python -m dspark_core.eval.linear_layout`` measures the layouts side by side.

oneDNN-packed. In bfloat16, ``F.linear`` hands the product to oneDNN, which re-packs the weight into its
blocked layout for the AMX tiles on every call: for one or a few rows that packing costs more than the
product. :class:`PackedLinear` packs each weight once (``torch.ops.mkldnn._reorder_linear_weight``, the op
that inductor's CPU weight prepacking uses) and multiplies with ``torch.ops.mkldnn._linear_pointwise``. On a
2-core Intel Xeon with AMX, the default target's bfloat16 forward of 1 token after 300 took 53 ms as loaded
and 42 ms packed (8 tokens: 61 and 50 ms), with bitwise equal logits; in float32 packing is slower for one
token (57 against 49 ms; microbenchmarks, not committed). Packed linears are for inference: their copy does
not follow in-place updates of the weight, so a forward that needs gradients is refused.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

LINEAR_LAYOUTS = ("torch", "input-major", "onednn-packed")  # nn.Linear's own row-major weights, input-major, packed


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


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] packed by oneDNN (an opaque mkldnn tensor); a clear error where oneDNN cannot."""
    if weight.device.type != "cpu":
        raise ValueError(f"The onednn-packed layout packs CPU weights, got a weight on {weight.device}; "
                         f"use the 'torch' layout there.")
    if not torch.backends.mkldnn.is_available():
        raise ValueError("The onednn-packed layout needs a torch built with oneDNN (mkldnn), and this one is not; "
                         "use the 'torch' layout.")
    if weight.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"The onednn-packed layout packs float32 or bfloat16 weights, got {weight.dtype}; "
                         f"load the model in one of those or use the 'torch' layout.")
    if weight.dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        raise ValueError("oneDNN packs bfloat16 weights only on a CPU with AVX512 (BW, VL and DQ) or AVX-NE-CONVERT, "
                         f"and this one has {torch.backends.cpu.get_cpu_capability()}; use the 'torch' layout, or "
                         "float32 (where bfloat16 is emulated, float32 is faster anyway).")
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


class PackedLinear(nn.Linear):
    """An ``nn.Linear`` that multiplies by a copy of its weight packed once by oneDNN (:func:`pack_weight`).

    ``weight`` and ``bias`` stay the linear's own parameters (shared, not copied), so state dicts and readers
    of ``weight`` see the plain linear; moving or casting the module re-packs the copy. Inference only."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        self.weight, self.bias = linear.weight, linear.bias
        self.packed = pack_weight(self.weight)

    def _apply(self, fn, recurse: bool = True) -> PackedLinear:
        super()._apply(fn, recurse)
        self.packed = pack_weight(self.weight)
        return self

    def __deepcopy__(self, memo: dict) -> PackedLinear:
        """A copy over copied parameters (the memo keeps a tied weight tied), packed anew: oneDNN's packed
        tensor itself cannot be copied."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        linear.weight, linear.bias = copy.deepcopy(self.weight, memo), copy.deepcopy(self.bias, memo)
        return PackedLinear(linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [..., in] -> [..., out], as ``F.linear(x, weight, bias)``."""
        if torch.is_grad_enabled() and (self.weight.requires_grad or x.requires_grad):
            raise RuntimeError("A onednn-packed linear is for inference: run it under torch.inference_mode() or "
                               "torch.no_grad(), or train with the 'torch' layout.")
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")


def use_packed_linears(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` of ``model`` by a :class:`PackedLinear` over the same parameters, in place;
    returns how many (linears already packed are kept)."""
    parents = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if type(child) is nn.Linear]
    for parent, name, child in parents:
        setattr(parent, name, PackedLinear(child))
    return len(parents)


def check_linear_layout(layout: str) -> None:
    """A clear error unless ``layout`` is one of :data:`LINEAR_LAYOUTS`."""
    if layout not in LINEAR_LAYOUTS:
        raise ValueError(f"Unknown linear layout {layout!r}; choose one of {', '.join(LINEAR_LAYOUTS)}.")


def apply_linear_layout(model: nn.Module, layout: str) -> nn.Module:
    """``model`` with its linears in ``layout`` (one of :data:`LINEAR_LAYOUTS`); a clear error otherwise."""
    check_linear_layout(layout)
    if layout == "input-major":
        use_input_major_linears(model)
    elif layout == "onednn-packed":
        use_packed_linears(model)
    return model


def layout_of(model: nn.Module) -> str:
    """The layout of a model's linears (one of :data:`LINEAR_LAYOUTS`), read from its LM head."""
    head = model.get_output_embeddings()
    if isinstance(head, PackedLinear):
        return "onednn-packed"
    return "input-major" if head is not None and is_input_major(head.weight) else "torch"


def follow_target_layout(target: nn.Module, drafter: nn.Module) -> None:
    """Give ``drafter``'s linears the layout of the target's (read from its LM head), in place."""
    apply_linear_layout(drafter, layout_of(target))
