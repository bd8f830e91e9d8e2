"""launch.serve: one JaxEngine behind SGLang's native HTTP API.

  python -m launch.serve --config=configs/serve.py [--config.key=value ...] --port=PORT
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0

  # `name` is a load_model path: HF dir, .gguf file or "smollm2-135m-instruct".
  c.model = ml_collections.ConfigDict()
  c.model.name = "smollm2-135m-instruct"
  c.model.dtype = "float32"          # compute dtype; params stay float32

  # JaxEngineConfig fields.
  c.engine = ml_collections.ConfigDict()
  c.engine.max_batch = 32            # decode slots
  c.engine.max_len = 2048            # prompt + max_new_tokens, tokens
  c.engine.kv_cache_mib = 1024.0
  c.engine.min_prompt_bucket = 32
  c.engine.length_multiple = 64
  c.engine.refill = True

  # The HTTP side.
  c.serve = ml_collections.ConfigDict()
  c.serve.served_model_name = ""     # "" = model.name
  c.serve.default_max_new_tokens = 128
  c.serve.max_batch_prompts = 64     # prompts per engine.generate batch
  c.serve.warmup = True              # compile the common shapes before answering /health

  # Weights to load at start (an Orbax params checkpoint, e.g. WORKDIR/weights/vN).
  c.weights = ml_collections.ConfigDict()
  c.weights.path = ""
  c.weights.version = 0
  return c
