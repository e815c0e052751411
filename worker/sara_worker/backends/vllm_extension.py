"""Methods SARA adds to every vLLM worker process (``worker_extension_cls``).

This module is imported inside vLLM's own worker processes, by its qualified name
(``sara_worker.backends.vllm_extension.SaraWorkerExtension``): the in-process backend
(``backends.vllm``) installs it, and a ``vllm serve`` behind the openai backend takes it as
``--worker-extension-cls``. It imports vLLM only inside the methods.
"""

from __future__ import annotations


class SaraWorkerExtension:
    """Methods added to every vLLM worker (``worker_extension_cls``), called by collective_rpc.

    ``sara_reload_weights(weights_path)`` runs vLLM's own in-place ``reload_weights`` and then
    repairs the output head of models that tie it to the input embedding. The checkpoint has no
    ``lm_head.weight`` of its own, so vLLM's layer-wise reload fills the embedding but treats the
    head as "not loaded" and puts its old state back: on CPU its prepacked GEMM copy of the old
    weight (``cpu_linear``), which silently keeps the old output projection. The head is re-tied
    to the embedding and its weight processing re-run. Returns ``{"heads": n}`` (heads repaired).
    """

    def sara_reload_weights(self, weights_path: str) -> dict:
        if not hasattr(self, "reload_weights"):
            raise NotImplementedError("this vLLM worker has no reload_weights")
        self.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        return {"heads": self.sara_refresh_tied_heads()}

    def sara_refresh_tied_heads(self) -> int:
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            ParallelLMHead, UnquantizedEmbeddingMethod, VocabParallelEmbedding,
        )

        config = self.vllm_config.model_config.hf_config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        if not getattr(text_config, "tie_word_embeddings", False):
            return 0
        model = self.model_runner.get_model()
        heads = [m for m in model.modules() if isinstance(m, ParallelLMHead)]
        embeddings = [m for m in model.modules() if isinstance(m, VocabParallelEmbedding)
                      and not isinstance(m, ParallelLMHead)]
        if len(heads) != 1 or len(embeddings) != 1:
            return 0
        head, embedding = heads[0], embeddings[0]
        if head.weight.shape != embedding.weight.shape:
            return 0
        if head.weight is not embedding.weight:
            head.weight = embedding.weight
        method = getattr(head, "quant_method", None)
        if isinstance(method, UnquantizedEmbeddingMethod):
            method.process_weights_after_loading(head)
        return 1
