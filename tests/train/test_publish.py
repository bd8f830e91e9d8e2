"""WeightPublisher: versions as Orbax checkpoints (restorable by JaxEngine), HF
safetensors beside them, immutability, and garbage collection."""

import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rlpt.models import load_model
from rlpt.train.publish import WeightPublisher, hf_path, published_versions, version_path
from tests.rollout import serving


@pytest.fixture(scope="module")
def tok():
  return serving.smollm2_tokenizer()


def test_publish_restores_exactly_and_gc_keeps_in_use(tok, tmp_path):
  model = serving.tiny_model(tok)
  pub = WeightPublisher(str(tmp_path / "weights"), keep=2)
  infos = [pub.publish(serving.perturbed(model.arrays(), seed=v), v) for v in (1, 2, 3, 4)]
  assert [i.path for i in infos] == [version_path(pub.root, v) for v in (1, 2, 3, 4)]
  assert infos[0].bytes == sum(x.nbytes for x in jax.tree.leaves(model.arrays()))
  assert published_versions(pub.root) == [1, 2, 3, 4]
  assert not [n for n in os.listdir(pub.root) if n.startswith(".tmp")]
  # Chunks are written uncompressed (zstd was most of a publish's time): the version
  # holds at least the params' bytes.
  on_disk = sum(os.path.getsize(os.path.join(d, f))
                for d, _, files in os.walk(infos[2].path) for f in files)
  assert on_disk >= infos[2].bytes, (on_disk, infos[2].bytes)
  restored = ocp.StandardCheckpointer().restore(infos[2].path)
  for a, b in zip(jax.tree.leaves(restored),
                  jax.tree.leaves(serving.perturbed(model.arrays(), seed=3))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(FileExistsError, match="version 3 already published"):
    pub.publish(model.arrays(), 3)
  assert pub.gc(in_use=[1]) == [2]  # newest two kept, v1 still served somewhere
  assert published_versions(pub.root) == [1, 3, 4]
  assert pub.gc() == [1]


def test_publish_hf_is_loadable(tok, tmp_path):
  model = serving.tiny_model(tok, seed=5)
  pub = WeightPublisher(str(tmp_path / "weights"), hf=True)
  with pytest.raises(ValueError, match="tokenizer"):
    pub.publish(model, 1)
  info = pub.publish(model, 2, tokenizer=tok)
  assert info.hf_path == hf_path(pub.root, 2)
  loaded, loaded_tok = load_model(info.hf_path)
  for a, b in zip(jax.tree.leaves(loaded.arrays()), jax.tree.leaves(model.arrays())):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert loaded_tok.encode("hello world") == tok.encode("hello world")
  pub.gc(in_use=[])
  assert os.path.isdir(info.hf_path)  # the newest version stays, with its HF copy
