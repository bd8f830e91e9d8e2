"""Memory plan of one learner step of a ~1B Llama-style model at 1,048,576 tokens.

  python -m launch.plan --config=configs/long_context_1m.py [--config.mesh.seq=8 ...]

The mesh is simulated (host devices, nothing allocated); the sequence is sharded
over `seq` (ring attention), the batch and parameters over `fsdp`.
"""

import ml_collections


def get_config(arg=None):
  del arg
  c = ml_collections.ConfigDict()
  # Llama-3.2-1B shapes: 1.24 B parameters with tied embeddings.
  c.model = ml_collections.ConfigDict(dict(
      arch="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
      num_layers=16, num_heads=32, num_kv_heads=8, head_dim=64, rope_theta=500000.0,
      max_position_embeddings=1048576, tie_word_embeddings=True,
      dtype="bfloat16",      # compute dtype; parameters and Adam state stay float32
      remat=True))           # keep only each layer's input for the backward pass
  c.seq_len = 1048576        # tokens per sequence
  # Sequences per step. With batch=1 the fsdp axis shards parameters and optimizer
  # state only; every fsdp group holds the same 1M-token activations.
  c.batch = 1
  c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=4, tensor=1, seq=16))
  # The learner's packed batch (rlpt.train.learner.Batch): each sequence is one prompt
  # plus its scored completion; `window` completion tokens per row are scored (the
  # policy loss), `rows_per_sequence` rows share the sequence.
  c.window = 32768
  c.rows_per_sequence = 1
  c.loss_chunk = 4096        # positions per vocab-projection chunk
  c.lr = 1e-5
  c.weight_decay = 0.1
  c.hbm_budget_gib = 95.0    # per-device memory the plan must fit
  return c
