"""MiniCPM's dense decoder as its checkpoints' own code defines it (their config.json's `auto_map`), for the
MiniCPM stand-in checkpoints (trainer/policy/standins.py), which carry these two files as a release carries its
own: transformers ships no dense MiniCPM class, so the harness meets MiniCPM through `trust_remote_code`.

A Llama decoder and three scalings, which make it a different function from a Llama model with the same weights:
the embeddings are multiplied by `scale_emb`, each residual branch by `scale_depth / sqrt(num_hidden_layers)`, and
the last hidden state divided by `hidden_size / dim_model_base` before the LM head (muP-style width scaling).
vLLM's own MiniCPM implementation applies the same three, which is what the tests compare against.
"""
