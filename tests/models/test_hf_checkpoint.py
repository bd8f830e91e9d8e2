"""HF checkpoint directories: tiny random Llama / Qwen2 / Qwen3 built and saved by HF
transformers load with the same logits; save_hf round-trips bit-exactly and HF reads it."""

import json
import os

import jax
import numpy as np
import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from rlpt.models import load_model
from rlpt.models.hf_checkpoint import save_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 300
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

COMMON = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_hidden_layers=3,
              num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128,
              rms_norm_eps=1e-6)
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(
        **COMMON, tie_word_embeddings=False, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8}),
    "llama_tied": lambda: transformers.LlamaConfig(**COMMON, tie_word_embeddings=True),
    "qwen2": lambda: transformers.Qwen2Config(**COMMON, tie_word_embeddings=False),
    "qwen3": lambda: transformers.Qwen3Config(**COMMON, head_dim=16, tie_word_embeddings=True),
}


def _tokenizer_files(path):
  """A small byte-level BPE (<= VOCAB ids) trained here, with a chat template."""
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|im_start|>", "<|im_end|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(["hello world, the quick brown fox jumps over the lazy dog"] * 20 +
                          ["def f(x): return x * 2", "1 + 2 = 3"] * 10, trainer)
  tok.save(os.path.join(path, "tokenizer.json"))
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump({"eos_token": "<|im_end|>", "pad_token": "<|im_end|>", "chat_template": TEMPLATE,
               "tokenizer_class": "PreTrainedTokenizerFast"}, f)


def _hf_checkpoint(kind, path):
  torch.manual_seed(0)
  hf = transformers.AutoModelForCausalLM.from_config(CONFIGS[kind](), dtype=torch.float32)
  with torch.no_grad():  # every parameter random, so biases and norm weights matter too
    for p in hf.parameters():
      p.copy_(torch.randn_like(p) * 0.1 + (1.0 if p.ndim == 1 else 0.0))
  hf.save_pretrained(path, max_shard_size="100KB")  # several shards + index
  _tokenizer_files(path)
  return hf.eval()


def _batch(rng):
  B, T = 3, 12
  tokens = rng.integers(0, VOCAB, size=(B, T)).astype(np.int32)
  mask = np.ones((B, T), bool)
  mask[1, :4] = False
  mask[2, :9] = False
  return tokens, mask, np.maximum(np.cumsum(mask, 1) - 1, 0)


def _hf_logits(hf, tokens, mask, pos):
  with torch.no_grad():
    return hf(input_ids=torch.tensor(tokens, dtype=torch.long),
              attention_mask=torch.tensor(mask, dtype=torch.long),
              position_ids=torch.tensor(pos, dtype=torch.long)).logits.numpy()


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_hf_dir_logit_parity_and_save_round_trip(kind, tmp_path):
  src = tmp_path / "hf"
  hf = _hf_checkpoint(kind, str(src))
  assert os.path.isfile(src / "model.safetensors.index.json")
  model, tok = load_model(str(src))
  assert model.config.arch == kind.split("_")[0]
  tokens, mask, pos = _batch(np.random.default_rng(0))
  want = _hf_logits(hf, tokens, mask, pos)
  got = np.asarray(model(tokens, positions=pos, attention_mask=mask))
  diff = np.abs(got[mask] - want[mask]).max()
  print(f"\n{kind}: max|dlogits| vs HF {diff:.3g}")
  assert diff <= 1e-4

  # save_hf -> load_model is bit-exact; HF reads the saved directory with the same logits.
  out = tmp_path / "saved"
  save_hf(model, tok, str(out), max_shard_bytes=64 * 1024)
  assert os.path.isfile(out / "model.safetensors.index.json")
  model2, tok2 = load_model(str(out))
  assert model2.config == model.config
  jax.tree.map(np.testing.assert_array_equal, model.arrays(), model2.arrays())
  hf2 = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
  np.testing.assert_allclose(_hf_logits(hf2, tokens, mask, pos)[mask], want[mask], atol=1e-5)
  for s in ("hello world", "def f(x): return 42", "<|im_start|>user\nhi<|im_end|>"):
    assert tok2.encode(s) == tok.encode(s)
  msgs = [{"role": "user", "content": "hello"}]
  assert tok2.apply_chat_template(msgs) == tok.apply_chat_template(msgs)
  hf_tok = transformers.AutoTokenizer.from_pretrained(str(out))
  assert hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
      tok.apply_chat_template(msgs)
  assert hf_tok.encode("hello world") == tok.encode("hello world")
