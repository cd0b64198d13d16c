"""The configuration class of a MiniCPM checkpoint's own code: Llama's keys plus MiniCPM's three scalings."""

from transformers import LlamaConfig


class MiniCPMConfig(LlamaConfig):
    model_type = "minicpm"

    def __init__(self, scale_emb: float = 1.0, dim_model_base: int = 1, scale_depth: float = 1.0, **kwargs):
        self.scale_emb = scale_emb
        self.dim_model_base = dim_model_base
        self.scale_depth = scale_depth
        super().__init__(**kwargs)
