"""Memory and time plan of one GRPO learner step of Llama-3.1-8B on a 64-chip TPU v5p slice.

  python -m launch.plan --config=configs/grpo_llama3_8b_v5p64.py [--config.mesh.seq=...]

`launch.plan` compiles the learner's own step (rlpt.train.learner.train_step) for a
simulated 64-device mesh `fsdp=16, tensor=2, seq=2` (parameters and optimizer state
over fsdp, heads and MLP over tensor, each 8192-token sequence split in two over seq
through ring attention) from shapes only, and prints per-device memory against
v5p's 95 GiB, the model FLOPs of the step and the step time at the stated MFU. The
batch: 16 prompts x 8 samples = 128 sequences of 8192 tokens (4096 scored completion
tokens each) in 8 microbatches; bf16 compute, fp32 master weights and Adam state,
each layer rematerialised.
"""

import ml_collections


def get_config(arg=None):
  del arg
  c = ml_collections.ConfigDict()
  # Llama-3.1-8B (config.json of meta-llama/Llama-3.1-8B): 8.03 B parameters.
  c.model = ml_collections.ConfigDict(dict(
      arch="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
      num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0,
      rope_scaling=(("rope_type", "llama3"), ("factor", 8.0), ("low_freq_factor", 1.0),
                    ("high_freq_factor", 4.0), ("original_max_position_embeddings", 8192)),
      max_position_embeddings=131072, tie_word_embeddings=False,
      dtype="bfloat16", remat=True))
  c.seq_len = 8192
  c.batch = 128               # sequences per step (16 prompts x 8 samples)
  c.rows_per_sequence = 1
  c.window = 4096             # scored completion tokens per row
  c.microbatches = 8          # 16 sequences each: one per fsdp group
  c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=16, tensor=2, seq=2))
  c.loss_chunk = 512
  c.lr = 1e-6
  c.weight_decay = 0.0
  c.hbm_budget_gib = 95.0     # v5p HBM per chip
  c.peak_tflops = 459.0       # v5p dense bf16
  c.mfu = 0.4
  # The engine's decode step on the same slice: 256 rows over 4096 cache slots each.
  c.decode = ml_collections.ConfigDict(dict(batch=256, cache_len=4096))
  c.hbm_tbps = 2.76           # TPU v5p HBM2e
  return c
