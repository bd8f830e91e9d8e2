"""Memory and time plan of one GRPO learner step of Qwen3-8B on one 8-GPU H100 node.

  python -m launch.plan --config=configs/grpo_qwen3_8b_h100x8.py [--config.batch=...]

`launch.plan` compiles the learner's own step (rlpt.train.learner.train_step) for a
simulated 8-device mesh (`fsdp=8`: parameters, gradients and Adam state split over
the node) from shapes only, and prints per-device memory against the H100's 80 GB,
the model FLOPs of the step and the step time they imply at the stated MFU. The
batch: 8 prompts x 8 samples = 64 sequences of 4096 tokens (2048 scored completion
tokens each), in 8 microbatches of one sequence per GPU; bf16 compute, fp32 master
weights and Adam state, each layer rematerialised.
"""

import ml_collections


def get_config(arg=None):
  del arg
  c = ml_collections.ConfigDict()
  # Qwen3-8B (config.json of Qwen/Qwen3-8B): 8.19 B parameters, untied embeddings.
  c.model = ml_collections.ConfigDict(dict(
      arch="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288,
      num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=1000000.0,
      max_position_embeddings=40960, tie_word_embeddings=False, qk_norm=True,
      dtype="bfloat16", remat=True))
  c.seq_len = 4096
  c.batch = 64                # sequences per step (8 prompts x 8 samples)
  c.rows_per_sequence = 1
  c.window = 2048             # scored completion tokens per row
  c.microbatches = 8          # 8 sequences each: one per GPU
  c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=8, tensor=1, seq=1))
  c.loss_chunk = 512
  c.lr = 1e-6
  c.weight_decay = 0.0
  c.hbm_budget_gib = 74.5     # 80 GB
  c.peak_tflops = 989.0       # H100 SXM dense bf16
  c.mfu = 0.4
  # The engine's decode step on the same node: 64 rows (the step's sequences) over
  # 4096 cache slots each.
  c.decode = ml_collections.ConfigDict(dict(batch=64, cache_len=4096))
  c.hbm_tbps = 3.35           # H100 SXM HBM3
  return c
