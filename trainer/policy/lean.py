"""A lean forward pass of the tiny families: transformers' Llama / Qwen2 / Qwen3 sdpa forward as plain tensor calls.

At ~1M parameters a forward pass costs a few milliseconds, and the modeling code's per-module Python (hooks,
decorators, kwargs plumbing, mask preparation, output records) is a large share of it. `LeanDecoder` runs the same
arithmetic, element for element, so its logits are bit-identical to the model's own call (tested), with a third
fewer ops:

* q, k and v come from one matmul with the three weights stacked, gate and up from another (each output column is
  the same dot product as in its own matmul); q and k are normalised (Qwen3) and rotated together;
* the rotary cos / sin come from a table of every position, built once with transformers' formula, and
  `rotate_half(x) * sin` is `x.roll(d/2) * [-sin, sin]` (a sign moved between the factors is exact);
* grouped key/value heads are read as they are (`enable_gqa`), not copied per query head; a one-token decode step
  packs the query heads of a group instead (transformers' `pack_gqa`).

Two uses: `step` feeds tokens to the rollout engine's per-row KV cache (trainer/rollout/hf_engine.py) and returns
the last position's logits; `logits` scores whole sequences under causal attention, without gradients (the
update's old log-probs and SPO's re-scoring, `trainer.update.token_logprobs`). Training passes keep the model's
own call: there the stacked weights would change the gradients' rounding.

The stacked weights are copies, rebuilt whenever a parameter was written since (its version counter moved: an
optimizer step, `load_state_dict`), replaced, or moved (`.to()`), so a model that keeps training needs nothing
more; writes through `.data` bypass the version counter and are not seen. Served: these architectures with full
attention on every layer, the sdpa kernel, default rotary embeddings and no attention dropout, **on a CPU** (where
per-op cost is what the lean forward saves; bit-identity is tested there, and on a GPU the stacked copies would
double the weights' memory and its kernels choose by shape). Anything else takes the model's own call.
"""

from __future__ import annotations

import weakref
from typing import ClassVar

import torch
from torch import nn

F = nn.functional


class LeanDecoder:
    """The lean forward of one model (see the module docstring)."""

    ARCHITECTURES: ClassVar[dict[str, bool]] = {
        "LlamaForCausalLM": False,
        "Qwen2ForCausalLM": False,
        "Qwen3ForCausalLM": True,
    }
    """Served classes, and whether their attention normalises queries and keys (Qwen3's q_norm / k_norm)."""

    def __init__(self, model: nn.Module):
        # the submodules, not the model: a model's decoder (kept in a weak dictionary by `lean_decoder`) must not
        # keep the model alive
        self.base, self.lm_head = model.model, model.lm_head
        self.qk_norm = self.ARCHITECTURES[type(model).__name__]
        base = self.base
        self.head_dim = base.layers[0].self_attn.head_dim
        self.heads = model.config.num_attention_heads
        self.kv_heads = model.config.num_key_value_heads
        self._versions: tuple | None = None
        self._cos = self._sin = None

    @classmethod
    def serves(cls, model: nn.Module) -> bool:
        """Only configurations that this class restates exactly, on a CPU (see the module docstring); a sharded or
        wrapped model's class has another name."""
        config = getattr(model, "config", None)
        if (
            type(model).__name__ not in cls.ARCHITECTURES
            or not type(model).__module__.startswith("transformers.")
            or getattr(config, "_attn_implementation", None) != "sdpa"
        ):
            return False
        rope = getattr(config, "rope_parameters", None) or {}
        layer_types = getattr(config, "layer_types", None) or ["full_attention"]
        first = next(model.parameters(), None)
        return (
            config.hidden_act == "silu"
            and rope.get("rope_type", "default") == "default"
            and getattr(config, "pretraining_tp", 1) == 1
            and not getattr(config, "attention_dropout", 0.0)
            and all(t == "full_attention" for t in layer_types)
            and first is not None
            and first.device.type == "cpu"
        )

    # -- weights and tables ------------------------------------------------------------------------------------

    def _stack_weights(self) -> None:
        """(Re)build the stacked per-layer weights when any parameter changed since they were built: written in
        place (its version counter moved) or replaced by `.to()` (its storage moved)."""
        versions = tuple(
            (id(p), p._version, p.data_ptr(), p.dtype)
            for module in (self.base, self.lm_head)
            for p in module.parameters()
        )
        if versions == self._versions:
            return
        with torch.no_grad():
            self.layers = []
            for layer in self.base.layers:
                a, m = layer.self_attn, layer.mlp
                projections = (a.q_proj, a.k_proj, a.v_proj)
                self.layers.append(
                    dict(
                        norm1=layer.input_layernorm,
                        norm2=layer.post_attention_layernorm,
                        attn=a,
                        qkv=torch.cat([proj.weight for proj in projections]),
                        qkv_bias=None if a.q_proj.bias is None else torch.cat([proj.bias for proj in projections]),
                        qk_norm=(
                            torch.cat(
                                [a.q_norm.weight.expand(self.heads, -1), a.k_norm.weight.expand(self.kv_heads, -1)]
                            )
                            if self.qk_norm
                            else None
                        ),
                        qk_eps=a.q_norm.variance_epsilon if self.qk_norm else None,
                        gate_up=torch.cat([m.gate_proj.weight, m.up_proj.weight]),
                        gate_up_bias=None
                        if m.gate_proj.bias is None
                        else torch.cat([m.gate_proj.bias, m.up_proj.bias]),
                        inner=m.gate_proj.weight.shape[0],
                        down=m.down_proj.weight,
                        down_bias=m.down_proj.bias,
                    )
                )
        self._versions = versions

    def _rotary(self, positions: torch.Tensor, size: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and [-sin, sin] at `positions` [n, W] (all below `size`) as [n, W, 1, head_dim], from a table of
        positions grown by doubling, computed as transformers computes them (the module's own `inv_freq`)."""
        rotary = self.base.rotary_emb
        table = self._cos
        if table is None or table.shape[0] < size or table.dtype != dtype or table.device != rotary.inv_freq.device:
            size = max(size, 2 * (0 if table is None else table.shape[0]), 256)
            inv_freq = rotary.inv_freq.float()
            freqs = torch.arange(size, device=inv_freq.device).float()[:, None] * inv_freq
            emb = torch.cat((freqs, freqs), dim=-1)
            half = freqs.shape[-1]
            sin = emb.sin() * rotary.attention_scaling
            self._cos = (emb.cos() * rotary.attention_scaling).to(dtype)
            self._sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1).to(dtype)
        return self._cos[positions].unsqueeze(2), self._sin[positions].unsqueeze(2)

    @staticmethod
    def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + eps)
        return weight * x.to(dtype)

    # -- the layers ----------------------------------------------------------------------------------------------

    def _hidden(self, ids: torch.Tensor, positions: torch.Tensor, positions_below: int, attend) -> torch.Tensor:
        """The final hidden states [n, W, hidden] (before the final norm) at `positions` (each < `positions_below`);
        `attend(i, q, k, v)` is layer i's attention over q [n, heads, W, d] and this pass's k, v [n, kv_heads, W, d],
        returning [n, W, heads * d]."""
        self._stack_weights()
        h = F.embedding(ids, self.base.embed_tokens.weight)
        n, width = ids.shape
        heads, kv_heads, d = self.heads, self.kv_heads, self.head_dim
        cos, sin = self._rotary(positions, positions_below, h.dtype)
        for i, layer in enumerate(self.layers):
            norm1, attn = layer["norm1"], layer["attn"]
            x = self._norm(h, norm1.weight, norm1.variance_epsilon)
            qkv = F.linear(x, layer["qkv"], layer["qkv_bias"]).view(n, width, heads + 2 * kv_heads, d)
            qk, v = qkv[:, :, : heads + kv_heads], qkv[:, :, heads + kv_heads :]
            if self.qk_norm:
                qk = self._norm(qk, layer["qk_norm"], layer["qk_eps"])
            qk = qk * cos + qk.roll(d // 2, dims=-1) * sin
            out = attend(i, qk[:, :, :heads].transpose(1, 2), qk[:, :, heads:].transpose(1, 2), v.transpose(1, 2))
            h = h + F.linear(out, attn.o_proj.weight, attn.o_proj.bias)
            norm2, inner = layer["norm2"], layer["inner"]
            x = self._norm(h, norm2.weight, norm2.variance_epsilon)
            gate_up = F.linear(x, layer["gate_up"], layer["gate_up_bias"])
            gate = gate_up[
                ..., :inner
            ].contiguous()  # as the model's: silu rounds a strided row's tail apart (inner 48)
            h = h + F.linear(F.silu(gate) * gate_up[..., inner:], layer["down"], layer["down_bias"])
        return h

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        norm = self.base.norm
        return F.linear(self._norm(h, norm.weight, norm.variance_epsilon), self.lm_head.weight, self.lm_head.bias)

    def step(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache) -> torch.Tensor:
        """Feed `ids` [n, W] at `positions` to the engine's row cache (its layers' `update` writes this pass's keys and
        values and returns the keys and values to attend to; `cache.plan.kv_len` exceeds every position), attending
        under the additive `mask` [n, 1, W, kv_len]; the next-token logits [n, vocab] after the last slot of each
        row (the model's dtype)."""
        n, width = ids.shape
        heads, kv_heads, d = self.heads, self.kv_heads, self.head_dim

        def attend(i, q, k, v):
            k, v = cache.layers[i].update(k, v)
            scale = self.layers[i]["attn"].scaling
            if width == 1:  # the query heads of a group share one row of keys (transformers' pack_gqa)
                out = F.scaled_dot_product_attention(
                    q.reshape(n, kv_heads, heads // kv_heads, d), k, v, attn_mask=mask, scale=scale
                )
                return out.reshape(n, 1, heads * d)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=kv_heads != heads)
            return out.transpose(1, 2).reshape(n, width, heads * d)

        return self._head(self._hidden(ids, positions, cache.plan.kv_len, attend)[:, -1])

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, vocab] of whole sequences `ids` [B, T] from position 0, causal attention, no padding mask
        (the model's call on right-padded rows: a real position never attends to a later pad)."""
        if torch.is_grad_enabled():  # the stacked weights are detached copies: no gradient would reach the model
            raise RuntimeError("LeanDecoder.logits scores without gradients; train through the model's own call")
        batch, width = ids.shape
        heads, kv_heads, d = self.heads, self.kv_heads, self.head_dim
        positions = torch.arange(width, device=ids.device).expand(batch, width)

        def attend(i, q, k, v):
            out = F.scaled_dot_product_attention(
                q, k, v, is_causal=width > 1, scale=self.layers[i]["attn"].scaling, enable_gqa=kv_heads != heads
            )
            return out.transpose(1, 2).reshape(batch, width, heads * d)

        return self._head(self._hidden(ids, positions, width, attend))


_SCORERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def lean_decoder(model: nn.Module) -> LeanDecoder | None:
    """The model's `LeanDecoder` (one per model, kept while the model lives), or None where it is not served."""
    if not LeanDecoder.serves(model):
        return None
    if model not in _SCORERS:
        _SCORERS[model] = LeanDecoder(model)
    return _SCORERS[model]
