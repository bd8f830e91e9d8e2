"""SFT: demonstrations in the rewarded format, NLL goes down, the model learns the
task, and a finished SFT is restored rather than rerun."""

import jax
import numpy as np
import pytest
from flax import nnx

from rlpt.data import synthetic
from rlpt.models import decoder
from rlpt.models.logprobs import token_logprobs
from rlpt.train import sft
from rlpt.types import Task


def test_demonstration_formats():
  assert sft.demonstration(Task("synthetic", "47=", "47")) == "47"
  assert sft.demonstration(Task("math", "1+1?", "2")) == "<answer>2</answer>"
  t = Task("rg/chain_sum", "3+4=?", "7", metadata={"rg_entry": {"answer": "7"}})
  assert sft.demonstration(t) == "<answer>7</answer>"


def test_encode_and_pack():
  tok = synthetic.tokenizer()
  p, c = sft.encode_demo(tok, Task("synthetic", "47=", "47"), "47")
  assert p == [tok.bos_token_id] + tok.encode("47=") and c == tok.encode("47") + [2]
  tokens, attn, loss = sft.pack_demos([(p, c), ([1, 5], [6, 2])], pad_id=0)
  assert tokens.shape == (2, 16)
  assert tokens[0, :len(p) + len(c)].tolist() == p + c
  assert loss[0].tolist() == [False] * len(p) + [True] * len(c) + [False] * (16 - len(p) - len(c))
  assert attn[1].sum() == 4 and loss[1].sum() == 2


def test_config_validation():
  with pytest.raises(ValueError, match="config.sft"):
    sft.SFTConfig(steps=-1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  tok = synthetic.tokenizer()
  cfg = decoder.ModelConfig(vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=128,
                            num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                            eos_token_id=2, bos_token_id=1, pad_token_id=0)
  model = decoder.Decoder(cfg, rngs=nnx.Rngs(0))
  src = {"synthetic": synthetic.SyntheticSource(length=(1, 1), seed=0)}
  d = str(tmp_path_factory.mktemp("sft"))
  scfg = sft.SFTConfig(steps=60, batch_size=32, lr=1e-2, max_len=16)
  res = sft.run_sft(model, tok, src, scfg, d)
  return dict(model=model, tok=tok, src=src, dir=d, cfg=scfg, res=res, mcfg=cfg)


def test_loss_falls_and_task_is_learned(trained):
  res, model, tok = trained["res"], trained["model"], trained["tok"]
  assert not res["restored"] and len(res["losses"]) == 60
  assert res["losses"][0] > 2.0 and np.mean(res["losses"][-5:]) < 0.2, res["losses"][::10]
  # The demonstrations' probability under the trained model: answer then EOS.
  tasks = [trained["src"]["synthetic"].train(i) for i in range(16)]
  demos = [sft.encode_demo(tok, t, sft.demonstration(t)) for t in tasks]
  tokens, attn, loss = sft.pack_demos(demos, pad_id=0)
  lp = np.asarray(token_logprobs(model, tokens, loss, attention_mask=attn))
  per_token = lp[loss]
  assert np.exp(per_token).min() > 0.5  # every demo token is the model's likeliest


def test_finished_sft_is_restored(trained):
  fresh = decoder.Decoder(trained["mcfg"], rngs=nnx.Rngs(1))
  res = sft.run_sft(fresh, trained["tok"], trained["src"], trained["cfg"], trained["dir"])
  assert res["restored"] and res["losses"] == trained["res"]["losses"]
  for a, b in zip(jax.tree.leaves(nnx.state(fresh)), jax.tree.leaves(nnx.state(trained["model"]))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_sft_on_a_sequence_sharded_mesh_equals_one_device(tmp_path, monkeypatch):
  """With config.mesh seq=4 (and data=2) each demonstration runs through ring attention;
  three SFT steps give the losses and parameters of one device."""
  from rlpt.models import sharding
  tok = synthetic.tokenizer()
  cfg = decoder.ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64,
                            num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                            eos_token_id=2, bos_token_id=1, pad_token_id=0)
  src = {"synthetic": synthetic.SyntheticSource(length=(1, 3), seed=0)}
  scfg = sft.SFTConfig(steps=3, batch_size=8, lr=1e-2, max_len=16)
  mesh = sharding.make_mesh(data=2, seq=4)
  rings = []
  ring = decoder.ring_attention
  monkeypatch.setattr(decoder, "ring_attention", lambda *a, **k: rings.append(1) or ring(*a, **k))
  out = []
  for m in (None, mesh):
    model = decoder.Decoder(cfg, rngs=nnx.Rngs(0))
    if m is not None:
      nnx.update(model, jax.device_put(nnx.state(model), sharding.state_shardings(
          nnx.state(model), m)))
    res = sft.run_sft(model, tok, src, scfg, str(tmp_path / str(m is None)), mesh=m)
    out.append((res["losses"], model))
  (l1, m1), (l2, m2) = out
  assert rings                                  # the sharded run went through the ring
  np.testing.assert_allclose(l2, l1, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(nnx.state(m1)), jax.tree.leaves(nnx.state(m2))):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-5)
