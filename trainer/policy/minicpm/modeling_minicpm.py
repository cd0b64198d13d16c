"""The model classes of a MiniCPM checkpoint's own code (see trainer/policy/minicpm/__init__.py)."""

import math

import torch
from torch import nn
from transformers import LlamaForCausalLM, LlamaModel
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from .configuration_minicpm import MiniCPMConfig


class MiniCPMDecoderLayer(LlamaDecoderLayer):
    """Llama's layer with each residual branch scaled by scale_depth / sqrt(layers)."""

    def __init__(self, config: MiniCPMConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.branch_scale = config.scale_depth / math.sqrt(config.num_hidden_layers)

    def forward(self, hidden_states, attention_mask=None, position_ids=None, position_embeddings=None, **kwargs):
        attention, _ = self.self_attn(
            hidden_states=self.input_layernorm(hidden_states),
            attention_mask=attention_mask,
            position_ids=position_ids,
            position_embeddings=position_embeddings,
            **kwargs,
        )
        hidden_states = hidden_states + attention * self.branch_scale
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states)) * self.branch_scale


class MiniCPMModel(LlamaModel):
    config_class = MiniCPMConfig

    def __init__(self, config: MiniCPMConfig):
        super().__init__(config)
        self.layers = nn.ModuleList(MiniCPMDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.post_init()

    def forward(self, input_ids=None, inputs_embeds=None, **kwargs):
        if inputs_embeds is None and input_ids is not None:
            inputs_embeds = self.embed_tokens(input_ids) * self.config.scale_emb
        return super().forward(inputs_embeds=inputs_embeds, **kwargs)


class WidthScaledHead(nn.Linear):
    """The LM head, reading the last hidden state divided by hidden_size / dim_model_base."""

    def __init__(self, config: MiniCPMConfig):
        super().__init__(config.hidden_size, config.vocab_size, bias=False)
        self.width_scale = config.hidden_size / config.dim_model_base

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return super().forward(hidden_states / self.width_scale)


class MiniCPMForCausalLM(LlamaForCausalLM):
    config_class = MiniCPMConfig

    def __init__(self, config: MiniCPMConfig):
        super().__init__(config)
        self.model = MiniCPMModel(config)
        self.lm_head = WidthScaledHead(config)
        self.post_init()
