"""Long-context SFT + GRPO on 16k-token extraction reports (up to 32k), sequence-sharded.

  python -m launch.train --config=configs/long_extraction.py --workdir=runs/long_extraction

SmolLM2-135M-Instruct (trained to 8,192 positions) stretched to 40,960 by linear RoPE
interpolation (positions / 5, on the same weights), on a ("seq",) mesh of 8 host
devices: the learner's and SFT's attention is ring attention over `seq` (each device
holds 1/8 of every sequence's activations; parameters and Adam state are split over
`seq` too), and the engine, decoding on one device, prefills each report as ring
attention over the same mesh into a KV cache sized from the request. The task is
rlpt's "extraction" domain: a synthetic annual report with the fields asked up front,
answered as one JSON object, scored per field (rlpt.rewards.extraction).

Report lengths: the source sizes a report in chars / 4 (`data.extraction_tokens`);
SmolLM2's tokenizer packs 5.7-5.8 characters into a token here, so the committed
(23000, 24000) gives prompts of 16.1k-17.1k policy tokens, and (23000, 46000) the
whole 16k-32k range (tests/launch/test_train_cli.py tokenizes both ends; the model,
engine and SFT limits below are sized for 32k):

  python -m launch.train --config=configs/long_extraction.py --workdir=runs/lx32k \
      --config.data.extraction_tokens='(23000, 46000)'

CPU-sized, and still CPU hours: on the 2-core machine one forward+backward pass over
an 11.6k-token sequence on the 8-device ring takes about 14 minutes and over a 17k one
24 minutes (attention grows with the square of the length), and the process peaked at
15.2 GB and 19.3 GB resident, about 0.8 GB more per thousand tokens: reports near 32k
need a machine with more than this one's 24 GB, hence the committed range. The run is
1 SFT step (one demonstration: report + gold JSON), 1 GRPO step of 1 report x 2
samples with up to 96 new tokens, and a holdout of 2 reports scored before SFT, after
SFT and after RL: 1.5 hours here. The summary and WORKDIR/evals.json give the field
accuracy (`score`: fields right / fields asked) before and after; metrics.jsonl gives
each stage's seconds. docs/benchmarks.md ("long_extraction") records this run and a
12k-token one with 2 + 2 steps. A mechanics check at short
reports (minutes, not hours):

  python -m launch.train --config=configs/long_extraction.py --workdir=/tmp/lx \
      --config.data.extraction_tokens='(1500, 2000)' --config.sft.max_len=4096
"""

import ml_collections

from configs import common


def get_config(arg=None):
  del arg
  c = common.base_config()
  c.model.name = "smollm2-135m-instruct"
  c.model.remat = True                    # keep each layer's input only: 32k activations
  c.model.context_length = 40960          # 32k report + instruction + answer, rounded up
  c.model.rope_scaling = ml_collections.ConfigDict({"rope_type": "linear", "factor": 5.0})
  c.cpu_devices = 8                       # launch.train asks XLA for 8 host devices
  c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=1, seq=8))
  c.total_steps = 1
  c.data.domains = ml_collections.ConfigDict({"extraction": 1.0})
  c.data.extraction_tokens = (23000, 24000)   # chars / 4: 16.1k-17.1k SmolLM2 tokens (5.7 chars each)
  c.data.extraction_fields = (4, 6)
  c.data.prompts_per_step = 1
  c.data.holdout_per_domain = 2
  c.rollout.n = 2
  c.rollout.max_new_tokens = 96           # a JSON object of 4-7 fields
  c.rollout.max_prompt_len = 34816        # the longest report (32.1k tokens) plus the instruction
  c.rollout.min_prompt_bucket = 1024
  c.rollout.length_multiple = 1024
  c.rollout.kv_cache_mb = 4096            # 2 x 37k tokens x 46 KB (30 layers, 3 kv heads)
  c.rollout.max_batch = 2
  c.rl.advantage = "group_norm"
  c.rl.policy_loss = "ppo_clip"
  c.rl.loss_agg = "constant"
  c.rl.kl_coef = 0.0
  c.rl.lr = 1e-5
  c.rl.microbatch_size = 1                # one 16k-32k sequence per forward+backward
  c.rl.length_multiple = 1024
  c.sft.steps = 1
  c.sft.batch_size = 1
  c.sft.lr = 1e-5
  c.sft.max_len = 36864
  c.sft.length_multiple = 1024
  c.eval.every = 0                        # holdout before SFT, after SFT and at the end
  c.eval.base_tasks = -1                  # the base model on the same 2 reports (before)
  c.checkpoint.every = 1
  c.checkpoint.keep = 1
  return c
