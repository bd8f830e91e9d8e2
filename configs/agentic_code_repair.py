"""The edit-run-fix loop on CPU: SmolLM2-135M-Instruct repairs planted bugs in HumanEval.

The domain is "code_repair" (rlpt.data.sources.repair_tasks): a HumanEval solution
with one bug planted (a flipped comparison, an off-by-one, a wrong operator, a
dropped branch) in `solution.py`, and visible tests in `test_solution.py`. Each
task is played as an episode (rlpt.envs.code_repair) in a gVisor sandbox session:
the model runs the tests, reads the failure, edits solution.py (edit_file /
write_file) and runs them again; the problem's full HumanEval tests, never shown,
score the final file (rlpt.rewards.repair), and touching the tests scores 0.

Only the shipped mutants whose solution.py has at most 450 characters are used
(58 train, 12 held out), so that an episode fits 1024 tokens on CPU.

A CPU-sized run: 4 GRPO steps of 2 problems x 6 episodes (each row up to 1024
tokens), after 8 SFT steps of 4 demonstrations; it shows the loop end to end and
measures the repair rate, not a trained repairer.

Stages: an SFT warm-up on the reference agent's episodes (run the tests, read the
failure, apply the canonical fix with edit_file, run again, stop:
rlpt.envs.code_repair.demonstration) on train problems, then GRPO on groups of
episodes. The holdout repair rate (held-out HumanEval problems) is evaluated with
the tools by the run: base model, after SFT, after RL.

  python -m launch.train --config=configs/agentic_code_repair.py --workdir=runs/repair
"""

import ml_collections

from configs import common


def get_config(arg=None):
  del arg
  c = common.base_config()
  c.model.name = "smollm2-135m-instruct"
  c.total_steps = 4
  c.data.domains = ml_collections.ConfigDict({"code_repair": 1.0})
  c.data.code_repair_max_chars = 450
  c.data.prompts_per_step = 2
  c.data.holdout_per_domain = 12
  c.rollout.n = 6
  c.rollout.max_new_tokens = 128      # per model turn (the reference's longest is 112)
  c.rollout.max_prompt_len = 512      # the longest opening is 492 tokens
  c.rollout.kv_cache_mb = 1024
  c.rollout.max_batch = 12
  c.episodes.update(dict(max_turns=5, max_context_tokens=1024, max_calls=6, max_tool_s=30.0,
                         run_timeout_s=5.0, truncated_reward="zero"))
  c.rl.advantage = "group_norm"
  c.rl.policy_loss = "ppo_clip"
  c.rl.loss_agg = "seq_mean_token_mean"
  c.rl.lr = 2e-5
  c.rl.microbatch_size = 4
  c.rl.length_multiple = 128
  c.rl.window_multiple = 128
  c.sft.steps = 8
  c.sft.batch_size = 4
  c.sft.lr = 5e-5
  c.sft.max_len = 1024
  c.sft.length_multiple = 128
  c.eval.every = 0                    # holdout before SFT, after SFT and at the end
  c.eval.base_tasks = 12
  c.checkpoint.every = 2
  return c
