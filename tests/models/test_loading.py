"""load_model on bad input (clear errors naming file and tensor, nothing half-built) and a
GGUF written with the `gguf` package's writer (llama.cpp's Q/K permutation) round-tripping."""

import json
import os
import shutil

import gguf
import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import rlpt.models.loading as loading
from rlpt.models import LoadError, ModelConfig, Tokenizer, load_model, random_model, save_hf
from rlpt.models.checkpoint_tensors import LAYER_TENSORS, to_checkpoint

CFG = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8, tie_word_embeddings=False,
                  rms_norm_eps=1e-5, rope_theta=10000.0)
TOKENS = [chr(0x21 + i) for i in range(90)]


def _tokenizer(n=90):
  return Tokenizer.from_gguf_metadata(
      {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": TOKENS[:n] if n <= 90 else
       [chr(0x100 + i) for i in range(n)], "tokenizer.ggml.merges": []}, source="test")


@pytest.fixture(scope="module")
def model():
  return random_model(CFG, seed=3)


@pytest.fixture()
def ckpt(model, tmp_path):
  save_hf(model, _tokenizer(), str(tmp_path / "ok"))
  return tmp_path / "ok"


@pytest.fixture()
def never_built(monkeypatch):
  calls = []
  real = loading.build_model
  monkeypatch.setattr(loading, "build_model", lambda *a, **k: calls.append(1) or real(*a, **k))
  yield calls
  assert not calls, "a model was built from a bad checkpoint"


def _edit_config(path, **changes):
  with open(path / "config.json") as f:
    conf = json.load(f)
  conf.update(changes)
  with open(path / "config.json", "w") as f:
    json.dump(conf, f)


def test_missing_paths(tmp_path, ckpt, never_built):
  with pytest.raises(FileNotFoundError, match="nope"):
    load_model(str(tmp_path / "nope"))
  with pytest.raises(FileNotFoundError, match="nope.gguf"):
    load_model(str(tmp_path / "nope.gguf"))
  os.remove(ckpt / "config.json")
  with pytest.raises(FileNotFoundError, match="config.json"):
    load_model(str(ckpt))


def test_missing_tokenizer_and_weights(ckpt, never_built):
  os.remove(ckpt / "tokenizer.json")
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    load_model(str(ckpt))
  save_file({}, str(ckpt / "model.safetensors"))
  _tokenizer().save(str(ckpt))
  with pytest.raises(LoadError, match=r"ok: tensor 'model\..*' is missing from the checkpoint"):
    load_model(str(ckpt))


def test_unsupported_architecture_and_rope(ckpt, never_built):
  _edit_config(ckpt, model_type="gpt2")
  with pytest.raises(LoadError, match=r"config.json: unsupported architecture model_type='gpt2'"):
    load_model(str(ckpt))
  _edit_config(ckpt, model_type="llama", rope_scaling={"rope_type": "yarn", "factor": 4.0})
  with pytest.raises(LoadError, match=r"config.json: unsupported rope type 'yarn'"):
    load_model(str(ckpt))


def test_shape_and_dtype_mismatch_name_file_and_tensor(ckpt, never_built):
  f = str(ckpt / "model.safetensors")
  tensors = load_file(f)
  name = "model.layers.1.mlp.up_proj.weight"
  bad = dict(tensors)
  bad[name] = np.zeros((47, 32), np.float32)
  save_file(bad, f)
  with pytest.raises(LoadError, match=rf"model.safetensors: tensor '{name}' has shape \(47, 32\), "
                                      r"expected \(48, 32\)"):
    load_model(str(ckpt))
  bad[name] = np.zeros((48, 32), np.int32)
  save_file(bad, f)
  with pytest.raises(LoadError, match=rf"model.safetensors: tensor '{name}' has dtype I32"):
    load_model(str(ckpt))


def test_vocab_mismatch(ckpt, never_built):
  _tokenizer(n=120).save(str(ckpt))
  with pytest.raises(LoadError, match="vocabulary mismatch: the tokenizer has 120 ids but the "
                                      "model's embedding .* 96 rows"):
    load_model(str(ckpt))


def test_bf16_checkpoint_loads(model, ckpt):
  f = str(ckpt / "model.safetensors")
  tensors = load_file(f)
  import ml_dtypes
  save_file({k: v.astype(ml_dtypes.bfloat16) for k, v in tensors.items()}, f)
  loaded, _ = load_model(str(ckpt))
  want = np.asarray(model.layers.wq[...]).astype(ml_dtypes.bfloat16).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(loaded.layers.wq[...]), want)


def _write_gguf(model, path, arch="llama", drop=None):
  """A float32 GGUF the way llama.cpp's converter lays it out (Q/K rows permuted)."""
  cfg = model.config
  w = gguf.GGUFWriter(str(path), arch)
  w.add_block_count(cfg.num_layers)
  w.add_context_length(cfg.max_position_embeddings)
  w.add_embedding_length(cfg.hidden_size)
  w.add_feed_forward_length(cfg.intermediate_size)
  w.add_head_count(cfg.num_heads)
  w.add_head_count_kv(cfg.num_kv_heads)
  w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
  w.add_rope_freq_base(cfg.rope_theta)
  w.add_tokenizer_model("gpt2")
  w.add_token_list(TOKENS + [f"<x{i}>" for i in range(6)])
  w.add_token_types([1] * 90 + [3] * 6)
  w.add_token_merges([])
  w.add_eos_token_id(90)

  def perm(a, n):
    return a.reshape(n, 2, a.shape[0] // n // 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)

  arrays = jax.tree.map(np.asarray, model.arrays())
  out = {"token_embd.weight": arrays["embed"], "output_norm.weight": arrays["final_norm"],
         "output.weight": arrays["lm_head"].T}
  for name, stacked in arrays["layers"].items():
    _, gname, kind = LAYER_TENSORS[name]
    for i in range(cfg.num_layers):
      a = to_checkpoint(kind, stacked[i])
      if name == "wq":
        a = perm(a, cfg.num_heads)
      elif name == "wk":
        a = perm(a, cfg.num_kv_heads)
      out[gname.format(i=i)] = a
  for k, v in out.items():
    if k != drop:
      w.add_tensor(k, np.ascontiguousarray(v, np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def test_gguf_round_trip_undoes_qk_permutation(model, tmp_path):
  path = tmp_path / "tiny.gguf"
  _write_gguf(model, path)
  loaded, tok = load_model(str(path))
  assert loaded.config.replace(bos_token_id=None, eos_token_id=None, pad_token_id=None,
                               rms_norm_eps=CFG.rms_norm_eps,  # GGUF stores it as float32
                               max_position_embeddings=CFG.max_position_embeddings) == CFG
  assert loaded.config.rms_norm_eps == float(np.float32(CFG.rms_norm_eps))
  jax.tree.map(np.testing.assert_array_equal, model.arrays(), loaded.arrays())
  assert tok.encode("abc<x1>") == [64, 65, 66, 91]
  assert tok.eos_token_id == 90


def test_bad_gguf_files(model, tmp_path, never_built):
  p = tmp_path / "bad.gguf"
  p.write_bytes(b"NOPE" + b"\0" * 64)
  with pytest.raises(LoadError, match=r"bad.gguf: not a GGUF file"):
    load_model(str(p))
  good = tmp_path / "good.gguf"
  _write_gguf(model, good)
  cut = tmp_path / "cut.gguf"
  cut.write_bytes(good.read_bytes()[:4000])
  with pytest.raises(LoadError, match=r"cut.gguf: (truncated|tensor .* runs past the end)"):
    load_model(str(cut))
  _write_gguf(model, tmp_path / "gpt2.gguf", arch="gpt2")
  with pytest.raises(LoadError, match=r"gpt2.gguf: unsupported architecture 'gpt2'"):
    load_model(str(tmp_path / "gpt2.gguf"))
  _write_gguf(model, tmp_path / "hole.gguf", drop="blk.1.ffn_up.weight")
  with pytest.raises(LoadError, match=r"hole.gguf: tensor 'blk.1.ffn_up.weight' is missing"):
    load_model(str(tmp_path / "hole.gguf"))
  shutil.copy(good, tmp_path / "not_a_model")
  with pytest.raises(LoadError, match="not a checkpoint directory or .gguf file"):
    load_model(str(tmp_path / "not_a_model"))
