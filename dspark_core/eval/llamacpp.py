"""llama.cpp as an optional peer: the engine a CPU user would pick, on the GGUF file the default target
comes from.

Two methods: ``llamacpp`` (plain decoding) and ``llamacpp-lookup`` (its prompt-lookup decoding,
``LlamaPromptLookupDecoding``, drafting ``gamma`` tokens, 10 by default). They need llama-cpp-python,
which ``make peers`` compiles (not part of CI). The prompt is fed as our tokenizer's ids after our chat
template, so both engines start from the same tokens (the GGUF holds the same vocabulary; its size is
checked), and decoding stops after one of our EOS ids or at ``max_new_tokens``. llama.cpp runs on
torch's thread count, so both engines use the same cores. Greedy is temperature 0 (llama.cpp's greedy
sampler); otherwise temperature / top-k / top-p with min-p, typical-p and penalties switched off.
"""

from __future__ import annotations

import time

import torch

from ..core.rounds import GenerationResult
from ..core.sampling import SamplingConfig
from ..core.target import default_gguf_path

LLAMACPP = ("llamacpp", "llamacpp-lookup")
LOOKUP_TOKENS = 10  # llama-cpp-python's default num_pred_tokens


def require_llama_cpp():
    """The ``llama_cpp`` module, or a clear error saying how to install it."""
    try:
        import llama_cpp
    except ImportError as err:
        raise RuntimeError("The llama.cpp methods (llamacpp, llamacpp-lookup) need llama-cpp-python, which is not "
                           "installed: run `make peers` (it compiles llama.cpp for this CPU, several minutes).") from err
    return llama_cpp


class LlamaCppPeer:
    """One llama.cpp model of the default target's GGUF; ``lookup_tokens`` > 0 decodes with prompt lookup."""

    def __init__(self, lookup_tokens: int, vocab_size: int, context: int):
        llama_cpp = require_llama_cpp()
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup_tokens) if lookup_tokens else None
        threads = torch.get_num_threads()
        self.llm = llama_cpp.Llama(model_path=str(default_gguf_path()), n_ctx=context, n_threads=threads,
                                   n_threads_batch=threads, draft_model=draft, seed=0, verbose=False)
        if self.llm.n_vocab() != vocab_size:
            raise ValueError(f"The GGUF's vocabulary ({self.llm.n_vocab()}) differs from the target's ({vocab_size}): "
                             "the llama.cpp peer runs on the default target only.")

    def generate(self, prompt: torch.Tensor, sampling: SamplingConfig, max_new_tokens: int, seed: int,
                 eos: tuple[int, ...]) -> GenerationResult:
        """Decode after ``prompt`` (token ids), timed end to end like our methods (prefill included)."""
        self.llm.reset()  # no key/value reuse from an earlier call with the same prefix
        self.llm.set_seed(seed)
        tokens: list[int] = []
        start = time.perf_counter()
        for token in self.llm.generate(prompt.tolist(), temp=sampling.temperature, top_k=sampling.top_k,
                                       top_p=sampling.top_p, min_p=0.0, typical_p=1.0, repeat_penalty=1.0, reset=True):
            tokens.append(int(token))
            if token in eos or len(tokens) >= max_new_tokens:
                break
        return GenerationResult(prompt_len=len(prompt), tokens=tokens, total_time=time.perf_counter() - start)
