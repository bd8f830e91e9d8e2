"""The schema every RL experiment config starts from.

Experiment files call `base_config()` and change what they vary; every field that
exists here can be overridden on the command line as `--config.a.b=value`.
"""

import ml_collections


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.total_steps = 100

  # Policy. `name` is a load_model path: HF dir, .gguf file or "smollm2-135m-instruct".
  c.model = ml_collections.ConfigDict()
  c.model.name = "smollm2-135m-instruct"
  c.model.dtype = "float32"          # compute dtype; params stay float32
  c.model.remat = False              # rematerialise each layer in the backward pass
  # A longer context than the checkpoint's (0 = the checkpoint's max_position_embeddings),
  # with RoPE scaling for it ({} = the checkpoint's), e.g. {"rope_type": "linear",
  # "factor": 4.0}: position interpolation, positions divided by the factor.
  c.model.context_length = 0
  c.model.rope_scaling = ml_collections.ConfigDict()
  # Sizes of the random Llama-style model of `name = "tiny"` (smoke runs, learning tests).
  c.model.tiny = ml_collections.ConfigDict(
      dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, mlp=128))

  # CPU only: run on this many host devices (XLA's forced host platform device count;
  # set by launch.train before anything touches a device). 0 = what the platform has.
  c.cpu_devices = 0
  # Mesh axis sizes (product = number of devices used).
  c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=1, seq=1))

  # Sampling.
  c.rollout = ml_collections.ConfigDict()
  c.rollout.engine = "jax"           # "jax" (embedded JaxEngine) | "fleet" (c.fleet)
  c.rollout.n = 8                    # samples per prompt (the group size)
  c.rollout.max_new_tokens = 128
  # The learner trains softmax(logits / temperature) (AlgoSpec.temperature), so a
  # temperature other than 1 (or 0) needs top_p = 1 and top_k = 0.
  c.rollout.temperature = 1.0
  c.rollout.top_p = 1.0
  c.rollout.top_k = 0
  # Engine sizes (the embedded JaxEngine and every fleet server member alike).
  c.rollout.kv_cache_mb = 2048
  c.rollout.max_batch = 64           # decode slots
  c.rollout.max_prompt_len = 512     # longest prompt, tokens (+ max_new_tokens = max_len)
  c.rollout.min_prompt_bucket = 32   # smallest prefill bucket (powers of two above it)
  c.rollout.length_multiple = 64     # KV cache and output buffers rounded up to this
  # Per-sample wall cap, seconds from the sample's admission into a decode slot: a
  # runaway sample ends with its tokens (finish_reason "time", scored as a sample cut
  # at its budget) so it cannot hold a step. 0 = none (the cut point depends on the
  # machine's speed, so exact replays leave it off). Single-turn samples only:
  # episodes have their own caps (c.episodes).
  c.rollout.max_wall_s = 0.0

  # Rollout fleet (rollout.engine = "fleet"): server processes as Ray actors, or
  # servers already running elsewhere (kind "url", e.g. SGLang on GPUs).
  c.fleet = ml_collections.ConfigDict()
  c.fleet.kind = "server"            # "server" (rlpt.rollout.server_main processes) | "url"
  c.fleet.members = 2                # server processes (kind "server")
  c.fleet.urls = ""                  # comma-separated SGLang-API base URLs (kind "url")
  c.fleet.load_hf = True             # url members load the HF export, not the Orbax dir
  c.fleet.startup_timeout_s = 600.0  # a member must answer /health within this
  # "auto": on a cluster joined with ray.address, a GPU per member where the cluster has
  # one for each, else a CPU per member, spread over the nodes; "none": no resources
  c.fleet.placement = "auto"

  # Tasks: domain -> sampling weight.
  c.data = ml_collections.ConfigDict()
  c.data.domains = ml_collections.ConfigDict({"math": 1.0})
  c.data.prompts_per_step = 8
  c.data.holdout_per_domain = 32
  c.data.math_generators = ""        # "math" domain: comma-separated rg generators ("" = all)
  # Per-domain reasoning-gym generator fields, e.g. {"rg/chain_sum": {"max_digits": 1}}.
  c.data.rg_config = ml_collections.ConfigDict()
  c.data.curriculum = "none"         # "none" | "learnability" (rlpt.data.mixer)
  # Forgetting guard: a domain whose holdout accuracy falls more than this (a fraction)
  # below its best is flagged and drawn forgetting_boost x as often; 0 = off.
  c.data.forgetting_margin = 0.0
  c.data.forgetting_boost = 2.0
  # Draw every domain once before any twice (a mix of many domains: each is seen early).
  c.data.cover_domains_first = False
  c.data.synthetic_length = 2        # digits per prompt of the "synthetic" domain
  c.data.code_repair_max_chars = 0   # "code_repair": only files this short (0 = all)
  # "extraction": report length in tokens (chars / 4, drawn log-uniformly) and fields asked
  c.data.extraction_tokens = (2000, 100000)
  c.data.extraction_fields = (4, 10)

  # Algorithm (rlpt/algorithms; named presets in rlpt.algorithms.presets).
  c.rl = ml_collections.ConfigDict()
  c.rl.lr = 1e-6
  c.rl.warmup_steps = 0
  c.rl.weight_decay = 0.0
  c.rl.max_grad_norm = 1.0
  c.rl.advantage = "group_norm"
  c.rl.policy_loss = "ppo_clip"
  c.rl.clip_eps_low = 0.2
  c.rl.clip_eps_high = 0.2
  c.rl.loss_agg = "token_mean"
  c.rl.kl_coef = 0.0
  c.rl.kl_estimator = "k3"
  c.rl.entropy_coef = 0.0
  c.rl.microbatch_size = 8
  c.rl.adv_eps = 1e-6                # std normalizers: (x - mean) / (std + adv_eps)
  c.rl.gamma = 1.0                   # discount (reinforce_pp / gae)
  c.rl.gae_lambda = 1.0              # GAE lambda (ppo)
  c.rl.dual_clip_c = 3.0             # dual-clip lower bound c (policy_loss="dual_clip")
  c.rl.loss_agg_constant = 0         # Dr.GRPO normalizer; 0 = rollout.max_new_tokens
  c.rl.kl_in = "loss"                # "loss" | "reward": where kl_coef * KL(pi||ref) goes
  c.rl.value_coef = 0.0              # value-head loss weight (ppo)
  c.rl.value_clip = 0.2              # value clipping range (ppo)
  c.rl.lr_schedule = "constant"      # "constant" | "cosine" | "linear" (after warmup)
  c.rl.adam_b1 = 0.9
  c.rl.adam_b2 = 0.999
  c.rl.adam_eps = 1e-8
  c.rl.dynamic_sampling = False      # DAPO: drop groups with zero reward variance, refill
  c.rl.max_refill_rounds = 3         # extra generation rounds to refill a filtered batch
  # Prompts drawn per round = ceil(this x groups still missing): drawing more than the
  # batch lacks fills it in fewer (serial) generation rounds; the surplus informative
  # groups of a step are generated, recorded in trajectories/ and not trained.
  c.rl.dynamic_sampling_oversample = 1.0
  c.rl.overlong_buffer = 0           # DAPO soft overlong punishment: L_cache tokens (0 = off)
  c.rl.overlong_penalty = 1.0        # its maximum penalty
  c.rl.length_multiple = 64          # learner batches padded to a multiple (bounds recompiles)
  c.rl.window_multiple = 8           # the scored completion window too (episodes: coarser)
  c.rl.share_prompts = True          # a group's rows run their shared prompt once (packing.py)
  c.rl.max_staleness = 0             # weight versions a trained trajectory may lag behind
  # Off-policy correction (rlpt.algorithms.off_policy): "none" (ratio to the sampling
  # policy) | "decoupled_ppo" | "tis" (ratio to the learner's pre-update policy, each
  # token weighted by pi_prox / mu, capped at importance_cap).
  c.rl.off_policy = "none"
  c.rl.importance_cap = 2.0
  # "sync": generate, then train, then sync weights. "async": generation runs on the
  # fleet into a bounded buffer while the learner trains (rlpt.train.async_collector);
  # needs rollout.engine = "fleet" and rl.max_staleness >= 1.
  c.rl.mode = "sync"
  # async: finished groups held (0 = 2 x prompts_per_step), and how the staleness gate
  # reckons the groups a step takes: "all" counts every group as a trained one, so
  # with dynamic sampling generation stays about a round ahead of the learner;
  # "observed" uses the recent steps' kept / taken ratio and lets it run as far ahead
  # as max_staleness allows. On separate devices use "observed" and a buffer of 2 x
  # RLSettings.collect_budget; on one shared CPU host (the default through the fleet
  # on 2 cores) the overlap slowed the learner as much as it fed it: 37.3 and about
  # 34 min against 31.8 (docs/benchmarks.md).
  c.rl.buffer_groups = 0
  c.rl.gate_keep = "all"
  c.rl.async_rounds = 2              # async: generation rounds of prompts_per_step in flight
  c.rl.inflight = "finish"           # async: a request running when weights change "finish"es
                                     # on the old weights, "abort"s and reruns on the new, or
                                     # "continue"s under the new ones (partial rollout: each
                                     # token keeps the version that sampled it)

  # Rewards: reward = score - sum(penalties[v] for v in violations).
  c.rewards = ml_collections.ConfigDict()
  c.rewards.penalties = ml_collections.ConfigDict(
      dict(format=0.0, timeout=0.0, sandbox=0.0, resource=0.0))
  c.rewards.timeout_s = 10.0

  # The round scheduler (rlpt.train.scheduler, its FAILURES table): transient failures
  # (a fleet member down, a sandbox that could not run, a verifier that raised once) are
  # retried up to max_attempts per stage, waiting backoff_s x 2^k; deterministic ones
  # (a prompt past rollout.max_prompt_len, a task whose reference completion fails its
  # verifier, a verifier that raises twice on one completion) go to WORKDIR/dead_letter/.
  c.scheduler = ml_collections.ConfigDict(dict(max_attempts=3, backoff_s=0.5,
                                               check_references=True))

  # Episodic domains (rlpt.envs.registry, e.g. "python_tool") are played as multi-turn
  # episodes (rlpt.train.generation): per episode at most max_turns model turns,
  # max_context_tokens tokens (prompt + every turn), max_tool_s summed tool seconds and
  # max_calls tool calls, each command cut at run_timeout_s; a truncated episode scores
  # 0 ("zero") or its verifier's verdict on the final state ("score"). with_tools=False
  # plays the same episodes without tools (an evaluation's "without the tool" column).
  c.episodes = ml_collections.ConfigDict(dict(
      max_turns=4, max_context_tokens=1024, max_tool_s=30.0, truncated_reward="zero",
      max_calls=4, run_timeout_s=5.0, with_tools=True, kv_reuse=True))

  # Supervised warm-up on demonstrations before RL (rlpt.train.sft); 0 steps = none.
  # Batches are padded to a multiple of length_multiple tokens (one compile per length).
  c.sft = ml_collections.ConfigDict(dict(steps=0, batch_size=8, lr=1e-4, max_len=256,
                                         warmup_steps=0, length_multiple=64))

  c.eval = ml_collections.ConfigDict(dict(every=10))
  c.eval.base_tasks = -1             # base model's holdout, tasks per domain (-1 = all, 0 = none)
  # Domains evaluated at each intermediate evaluation, in rotation (0 = every domain);
  # step 0 and the last step evaluate all of them.
  c.eval.domains_per_eval = 0
  # Where holdouts are decoded: "rollout" (the run's rollout engine; with the fleet, its
  # members) or "learner" (an embedded engine in the learner's process, on the learner's
  # parameters, no publish); the same engine when rollout.engine = "jax".
  c.eval.engine = "rollout"
  c.checkpoint = ml_collections.ConfigDict(dict(every=10, keep=3))
  c.ray = ml_collections.ConfigDict(dict(address=""))  # "" = start a local Ray (fleet only)
  return c
