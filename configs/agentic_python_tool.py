"""Multi-turn agentic RL on CPU: SmolLM2-135M-Instruct learns to use a Python tool.

The domain is "python_tool" (rlpt.data.sources.tool_tasks): two-operation
arithmetic over 3-4 digit numbers with a product, in several phrasings, which the
135M model cannot do in its head. Each task is played as an episode
(rlpt.envs.python_tool): the system message offers a `python` tool (a tool call in
`<tool_call>` JSON, its output back in `<tool_response>`, run in a gVisor sandbox
session held for the episode), and the final `<answer>` is verified as an exact
integer. Episodes are token-exact (the learner trains the sampled ids; the tool
turns are masked) and continue from the engine's KV cache turn after turn.

Stages: a short SFT warm-up on scripted tool-use episodes (call `python` with the
expression, read the output, answer: rlpt.envs.python_tool.demonstration) teaches
the format only; then GRPO with dynamic sampling on groups of 8 episodes. The
holdout is evaluated with the tool by the run (base model, after SFT, after RL);
the "without the tool" column comes from the same checkpoints with
`--config.episodes.with_tools=False`:

  python -m launch.train --config=configs/agentic_python_tool.py --workdir=runs/agentic
  python -m launch.eval --config=configs/agentic_python_tool.py --checkpoint=runs/agentic/sft \
      --config.episodes.with_tools=False --n=1 --k=1
"""

import ml_collections

from configs import common


def get_config(arg=None):
  del arg
  c = common.base_config()
  c.model.name = "smollm2-135m-instruct"
  c.total_steps = 10                  # 23-27 min end to end here (docs/agentic.md); 16 took 33
  c.data.domains = ml_collections.ConfigDict({"python_tool": 1.0})
  c.data.prompts_per_step = 4
  c.data.holdout_per_domain = 100
  c.rollout.n = 8
  c.rollout.max_new_tokens = 48       # per model turn
  c.rollout.max_prompt_len = 256
  c.rollout.kv_cache_mb = 1024
  c.rollout.max_batch = 32
  c.episodes.update(dict(max_turns=3, max_context_tokens=448, max_calls=2, max_tool_s=20.0,
                         run_timeout_s=5.0, truncated_reward="zero"))
  c.rl.advantage = "group_norm"
  c.rl.policy_loss = "ppo_clip"
  c.rl.loss_agg = "seq_mean_token_mean"
  c.rl.lr = 2e-5
  c.rl.dynamic_sampling = True
  c.rl.max_refill_rounds = 2
  c.rl.microbatch_size = 8
  # Episodes are long and vary in length: coarse padding keeps the learner's compiled
  # shapes few (a multiple of 32 / 8 compiled the step again on most steps).
  c.rl.length_multiple = 128
  c.rl.window_multiple = 64
  c.sft.steps = 8
  c.sft.batch_size = 8
  c.sft.lr = 5e-5
  c.sft.max_len = 320
  c.sft.length_multiple = 32
  c.eval.every = 0                    # holdout before SFT, after SFT and at the end
  c.eval.base_tasks = 32
  c.checkpoint.every = 5
  return c
