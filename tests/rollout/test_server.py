"""EngineServer: SGLang's native API over a real JaxEngine (tiny random model, SmolLM2's
tokenizer), served in-process on 127.0.0.1 and spoken to with plain urllib."""

import concurrent.futures
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rlpt.models import token_logprobs
from rlpt.rollout import GenerateRequest, JaxEngine, SamplingParams
from rlpt.train.publish import WeightPublisher
from tests.rollout import serving


@pytest.fixture(scope="module")
def tok():
  return serving.smollm2_tokenizer()


@pytest.fixture(scope="module")
def srv(tok):
  model = serving.tiny_model(tok)
  engine = JaxEngine(model, tok, serving.tiny_engine_config())
  s = serving.InProcessServer(engine, tok)
  yield s
  s.close()


PROMPT = "The quick brown fox"


def test_generate_greedy_matches_engine_and_logprobs(srv, tok):
  status, out = serving.post(srv.url, "/generate", {
      "text": PROMPT, "sampling_params": {"max_new_tokens": 12, "temperature": 0},
      "return_logprob": True})
  assert status == 200, out
  meta = out["meta_info"]
  ids = tok.encode(PROMPT)
  want = srv.engine.generate([GenerateRequest(prompt_ids=tuple(ids), sampling=SamplingParams(
      max_new_tokens=12, temperature=0.0))])[0]
  assert out["output_ids"] == want.token_ids
  assert out["text"] == want.text
  assert meta["prompt_tokens"] == len(ids)
  assert meta["completion_tokens"] == len(want.token_ids)
  assert meta["weight_version"] == "0"
  assert meta["finish_reason"]["type"] in ("length", "stop")
  assert meta["input_token_logprobs"] == []  # logprob_start_len defaults to -1
  lps = meta["output_token_logprobs"]
  assert [e[1] for e in lps] == want.token_ids and all(e[2] is None for e in lps)
  np.testing.assert_allclose([e[0] for e in lps], want.logprobs, atol=1e-5)


def test_input_token_logprobs_equal_token_logprobs(srv, tok):
  texts = ["Hello there, how are you", "Paris is the capital of"]
  status, out = serving.post(srv.url, "/generate", {
      "text": texts, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
      "logprob_start_len": 0, "return_text_in_logprobs": True})
  assert status == 200, out
  assert isinstance(out, list) and len(out) == 2
  for text, o in zip(texts, out):
    ids = tok.encode(text)
    assert o["output_ids"] == [] and o["meta_info"]["completion_tokens"] == 0
    entries = o["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in entries] == ids
    assert [e[2] for e in entries] == [tok.decode([t]) for t in ids]
    assert entries[0][0] is None
    ref = token_logprobs(_Model(srv.engine), np.asarray([ids], np.int32),
                         np.ones((1, len(ids)), bool))
    np.testing.assert_allclose([e[0] for e in entries[1:]], np.asarray(ref)[0, 1:], atol=1e-5)
  # logprob_start_len = k: entries for positions k.., the first one scored too.
  ids = tok.encode(texts[0])
  status, o = serving.post(srv.url, "/generate", {
      "input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
      "logprob_start_len": 2})
  full = out[0]["meta_info"]["input_token_logprobs"]
  assert [e[:2] for e in o["meta_info"]["input_token_logprobs"]] == [e[:2] for e in full[2:]]


class _Model:
  """The engine's current weights in the shape token_logprobs reads."""

  def __init__(self, engine):
    self.config = engine.model_config
    self._p = engine.params

  def arrays(self):
    return self._p


def test_batch_and_n_samples(srv, tok):
  status, out = serving.post(srv.url, "/generate", {
      "input_ids": [tok.encode("one two"), tok.encode("three four five")],
      "sampling_params": {"max_new_tokens": 6, "temperature": 1.0, "n": 3, "sampling_seed": 7},
      "rid": ["a", "b"]})
  assert status == 200, out
  assert len(out) == 6
  assert [o["meta_info"]["id"] for o in out] == ["a_0", "a_1", "a_2", "b_0", "b_1", "b_2"]
  assert [o["meta_info"]["prompt_tokens"] for o in out] == [2] * 3 + [3] * 3
  # the same seed reproduces the samples; sample j of a prompt differs from sample k
  status2, again = serving.post(srv.url, "/generate", {
      "input_ids": [tok.encode("one two"), tok.encode("three four five")],
      "sampling_params": {"max_new_tokens": 6, "temperature": 1.0, "n": 3, "sampling_seed": 7}})
  assert [o["output_ids"] for o in again] == [o["output_ids"] for o in out]
  assert len({tuple(o["output_ids"]) for o in out[:3]}) > 1


def test_requests_without_seed_get_fresh_samples(srv, tok):
  body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 1.0}}
  outs = [serving.post(srv.url, "/generate", body)[1]["output_ids"] for _ in range(3)]
  assert len({tuple(o) for o in outs}) > 1


def test_stop_strings_and_stop_tokens(srv, tok):
  status, free = serving.post(srv.url, "/generate", {
      "text": PROMPT, "sampling_params": {"max_new_tokens": 24, "temperature": 0,
                                          "ignore_eos": True}})
  text = free["text"]
  stop = text[3:5]
  assert stop.strip(), f"the greedy text {text!r} is too short for this test"
  status, out = serving.post(srv.url, "/generate", {
      "text": PROMPT, "sampling_params": {"max_new_tokens": 24, "temperature": 0, "stop": [stop],
                                          "ignore_eos": True}})
  assert out["text"] == text[:text.find(stop)]
  assert out["meta_info"]["finish_reason"]["type"] == "stop"
  first = free["output_ids"][2]
  status, out = serving.post(srv.url, "/generate", {
      "text": PROMPT, "sampling_params": {"max_new_tokens": 24, "temperature": 0,
                                          "stop_token_ids": [first], "ignore_eos": True}})
  assert out["output_ids"][-1] == first and len(out["output_ids"]) <= 3
  assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": first}


@pytest.mark.parametrize("body, needle", [
    ({"text": "x", "sampling_params": {"temperature": -1}}, "temperature"),
    ({"text": "x", "sampling_params": {"top_p": 0}}, "top_p"),
    ({"text": "x", "sampling_params": {"max_new_tokens": -2}}, "max_new_tokens"),
    ({"text": "x", "sampling_params": {"regex": "[a-z]+"}}, "regex"),
    ({"text": "x", "sampling_params": {"max_tokens": 3}}, "unknown sampling parameter"),
    ({"text": "x", "input_ids": [1, 2]}, "text or input_ids"),
    ({"sampling_params": {}}, "text or input_ids"),
    ({"input_ids": [1, 10 ** 9]}, "outside the vocabulary"),
    ({"text": "x", "sampling_params": {"max_new_tokens": 10 ** 6}}, "context length"),
    ({"text": "x", "stream": True}, "stream"),
    ({"text": ["a", "b"], "sampling_params": [{}]}, "entries"),
])
def test_bad_requests_get_sglang_400(srv, body, needle):
  status, out = serving.post(srv.url, "/generate", body)
  assert status == 400
  assert set(out) == {"error"} and needle in out["error"]["message"], out


def test_malformed_json_gets_400(srv):
  import urllib.request
  req = urllib.request.Request(srv.url + "/generate", data=b"{not json",
                               headers={"Content-Type": "application/json"})
  with pytest.raises(urllib.error.HTTPError) as e:
    urllib.request.urlopen(req, timeout=30)
  assert e.value.code == 400
  import json
  body = json.loads(e.value.read())
  assert body["object"] == "error" and body["code"] == 400 and "JSON" in body["message"]


def test_info_health_flush(srv):
  assert serving.get(srv.url, "/health")[0] == 200
  status, info = serving.get(srv.url, "/get_model_info")
  assert status == 200 and info["model_path"] == "tiny-random" and info["is_generation"] is True
  assert info["weight_version"] == str(srv.engine.weight_version)
  status, sinfo = serving.get(srv.url, "/server_info")
  assert status == 200 and sinfo["context_length"] == 512 and "internal_states" in sinfo
  status, text = serving.post(srv.url, "/flush_cache", {})
  assert status == 200 and "Cache flushed" in str(text)


def test_update_weights_from_disk(srv, tok, tmp_path):
  pub = WeightPublisher(str(tmp_path / "weights"))
  body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 10, "temperature": 0,
                                              "ignore_eos": True}}
  before = serving.post(srv.url, "/generate", body)[1]
  v = srv.engine.weight_version + 1
  new_params = serving.perturbed(srv.engine.params)
  info = pub.publish(new_params, v)
  status, out = serving.post(srv.url, "/update_weights_from_disk",
                             {"model_path": info.path, "weight_version": str(v)})
  assert status == 200 and out["success"] is True, out
  assert serving.get(srv.url, "/get_model_info")[1]["weight_version"] == str(v)
  after = serving.post(srv.url, "/generate", body)[1]
  assert after["meta_info"]["weight_version"] == str(v)
  assert after["output_ids"] != before["output_ids"]
  leaves = jax.tree.leaves(srv.engine.params)
  np.testing.assert_array_equal(np.asarray(leaves[0]), np.asarray(jax.tree.leaves(new_params)[0]))

  # missing path: refused, still serving v
  status, out = serving.post(srv.url, "/update_weights_from_disk",
                             {"model_path": str(tmp_path / "nope"), "weight_version": "99"})
  assert status == 400 and out["success"] is False and "does not exist" in out["message"]
  # incompatible shapes (another model's checkpoint): refused, still serving v
  other = str(tmp_path / "other")
  ocp.StandardCheckpointer().save(other, {"embed": np.zeros((10, 4), np.float32)})
  ocp.StandardCheckpointer().wait_until_finished()
  status, out = serving.post(srv.url, "/update_weights_from_disk",
                             {"model_path": other, "weight_version": "100"})
  assert status == 400 and out["success"] is False, out
  assert "still serving weight version" in out["message"]
  assert serving.get(srv.url, "/get_model_info")[1]["weight_version"] == str(v)
  assert serving.post(srv.url, "/generate", body)[1]["output_ids"] == after["output_ids"]
  status, out = serving.post(srv.url, "/update_weights_from_disk",
                             {"model_path": info.path, "weight_version": "v-two"})
  assert status == 400 and "weight_version" in out["message"]
  # the same tree with another vocabulary: refused, naming the tensor
  bad = dict(srv.engine.params)
  V, D = bad["embed"].shape
  bad["embed"] = np.zeros((V + 8, D), np.float32)
  status, out = serving.post(srv.url, "/update_weights_from_disk", {
      "model_path": pub.publish(bad, v + 10).path, "weight_version": str(v + 10)})
  assert status == 400 and "embed" in out["message"] and str((V + 8, D)) in out["message"], out
  assert serving.get(srv.url, "/get_model_info")[1]["weight_version"] == str(v)

  # an HF directory (what a real SGLang server loads) is accepted too
  from rlpt.models.hf_checkpoint import save_hf
  hf_model = serving.tiny_model(tok, seed=9)
  save_hf(hf_model, tok, str(tmp_path / "hf"))
  status, out = serving.post(srv.url, "/update_weights_from_disk",
                             {"model_path": str(tmp_path / "hf"), "weight_version": str(v + 1)})
  assert status == 200 and out["success"], out
  assert serving.get(srv.url, "/get_model_info")[1]["weight_version"] == str(v + 1)
  for a, b in zip(jax.tree.leaves(srv.engine.params), jax.tree.leaves(hf_model.arrays())):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_abort_all_requests_answers_inflight_with_abort(srv, tok, tmp_path):
  pub = WeightPublisher(str(tmp_path / "weights"))
  v = srv.engine.weight_version + 1
  info = pub.publish(srv.engine.params, v)
  long_body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 400, "temperature": 1.0,
                                                   "ignore_eos": True, "n": 8}}
  with concurrent.futures.ThreadPoolExecutor(2) as ex:
    fut = ex.submit(serving.post, srv.url, "/generate", long_body)
    deadline = time.monotonic() + 60
    while serving.get(srv.url, "/server_info")[1]["internal_states"][0]["running"] == 0:
      assert time.monotonic() < deadline
      time.sleep(0.02)
    status, out = serving.post(srv.url, "/update_weights_from_disk", {
        "model_path": info.path, "weight_version": str(v), "abort_all_requests": True})
    assert status == 200 and out["num_paused_requests"] == 1, out
    status, aborted = fut.result(120)
  assert status == 200 and len(aborted) == 8
  assert all(o["meta_info"]["finish_reason"]["type"] == "abort" for o in aborted)
  assert serving.get(srv.url, "/get_model_info")[1]["weight_version"] == str(v)


def test_update_without_abort_lets_inflight_finish_on_old_version(srv, tok, tmp_path):
  pub = WeightPublisher(str(tmp_path / "weights"))
  old = srv.engine.weight_version
  info = pub.publish(serving.perturbed(srv.engine.params, seed=old + 20), old + 1)
  long_body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 400, "temperature": 1.0,
                                                   "ignore_eos": True, "n": 8}}
  with concurrent.futures.ThreadPoolExecutor(2) as ex:
    fut = ex.submit(serving.post, srv.url, "/generate", long_body)
    deadline = time.monotonic() + 60
    while serving.get(srv.url, "/server_info")[1]["internal_states"][0]["running"] == 0:
      assert time.monotonic() < deadline
      time.sleep(0.02)
    status, out = serving.post(srv.url, "/update_weights_from_disk", {
        "model_path": info.path, "weight_version": str(old + 1)})
    assert status == 200 and out["num_paused_requests"] == 0, out
    status, done = fut.result(120)
  assert status == 200 and len(done) == 8
  assert all(o["meta_info"]["finish_reason"]["type"] == "length" for o in done)
  assert all(o["meta_info"]["weight_version"] == str(old) for o in done)
  assert all(o["meta_info"]["completion_tokens"] == 400 for o in done)
  assert serving.get(srv.url, "/get_model_info")[1]["weight_version"] == str(old + 1)


def _batch_spy(tok):
  """A tiny JaxEngine whose generate calls are recorded: (engine, [[n of each request]
  per engine batch])."""
  engine = JaxEngine(serving.tiny_model(tok), tok, serving.tiny_engine_config())
  seen = []
  real = engine.generate

  def spy(reqs, **kw):
    seen.append([r.n for r in reqs])
    return real(reqs, **kw)
  engine.generate = spy
  return engine, seen


def test_batches_are_capped_in_samples_so_n1_prompts_fill_a_round(tok):
  """max_batch_samples caps a batch at prompts x n: queued n=1 prompts fill it eight at
  a time, n=4 prompts two at a time (a fleet member's holdout and RL batches alike)."""
  import threading
  engine, seen = _batch_spy(tok)
  # no gathering window: the queue order alone decides the batches
  s = serving.InProcessServer(engine, tok, max_batch_prompts=16, max_batch_samples=8,
                              gather_quiet_s=0.0, gather_max_s=0.0)
  gate = threading.Event()
  try:
    s.server._device.submit(gate.wait)          # the device is busy: requests queue
    ns = [1] * 9 + [4, 4, 1]
    outs = [None] * len(ns)

    def send(i):
      outs[i] = serving.post(s.url, "/generate", {
          "input_ids": tok.encode(f"word {i}"),
          "sampling_params": {"max_new_tokens": 2, "temperature": 1.0, "n": ns[i]}})
    threads = []
    for i in range(len(ns)):   # one at a time, so the queue order is the send order
      threads.append(threading.Thread(target=send, args=(i,)))
      threads[-1].start()
      deadline = time.monotonic() + 30
      while (len(s.server._pending) + bool(s.server._running) < i + 1
             and time.monotonic() < deadline):
        time.sleep(0.01)
    gate.set()
    for t in threads:
      t.join(60)
    assert all(o is not None and o[0] == 200 for o in outs), outs
    # the first request went alone (taken before the rest queued); then 8 n=1 prompts,
    # the two n=4 prompts, and the last n=1
    assert seen == [[1], [1] * 8, [4, 4], [1]]
  finally:
    gate.set()
    s.close()


def test_a_burst_of_requests_is_gathered_into_one_batch(tok):
  """An RL round reaches a fleet member as one HTTP request per prompt, a few ms apart.
  With the gathering window the worker waits while they keep arriving and runs them
  as one engine batch (without it the first request runs alone, its batch mostly
  empty slots, and the rest wait for it: the first batch of
  test_batches_are_capped_in_samples_so_n1_prompts_fill_a_round)."""
  import threading
  engine, seen = _batch_spy(tok)
  s = serving.InProcessServer(engine, tok, max_batch_prompts=64, max_batch_samples=64,
                              gather_quiet_s=2.0, gather_max_s=20.0)  # loaded CI hosts
  try:
    outs = [None] * 6

    def send(i):
      outs[i] = serving.post(s.url, "/generate", {
          "input_ids": tok.encode(f"word {i}"),
          "sampling_params": {"max_new_tokens": 2, "temperature": 1.0, "n": 2}})
    threads = []
    for i in range(6):   # a burst: each request 50 ms after the one before
      threads.append(threading.Thread(target=send, args=(i,)))
      threads[-1].start()
      time.sleep(0.05)
    for t in threads:
      t.join(60)
    assert all(o is not None and o[0] == 200 for o in outs), outs
    assert seen == [[2] * 6]
    assert s.server.stats["batches"] == len(seen)
    assert s.server.stats["batch_requests"] == 6
  finally:
    s.close()


def test_an_abort_while_a_batch_gathers_leaves_the_worker_serving(tok):
  """Requests aborted while the worker waits for more of their burst are answered
  "abort", and the worker goes on: the next request is served."""
  import threading
  engine = JaxEngine(serving.tiny_model(tok), tok, serving.tiny_engine_config())
  s = serving.InProcessServer(engine, tok, gather_quiet_s=1.0, gather_max_s=5.0)
  body = {"input_ids": tok.encode("word"),
          "sampling_params": {"max_new_tokens": 2, "temperature": 1.0}}
  try:
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", serving.post(s.url, "/generate", body)))
    t.start()
    deadline = time.monotonic() + 30
    while not s.server._pending and time.monotonic() < deadline:
      time.sleep(0.01)
    time.sleep(0.3)                                    # the worker is in its 1 s wait
    s.loop.call_soon_threadsafe(s.server._abort_all)
    t.join(30)
    status, answer = out["r"]
    assert status == 200 and answer["meta_info"]["finish_reason"]["type"] == "abort", answer
    time.sleep(2.5)                                    # past the wait's end
    t = threading.Thread(target=lambda: out.setdefault("r2", serving.post(s.url, "/generate", body)),
                         daemon=True)
    t.start()
    t.join(30)
    assert "r2" in out, "the worker stopped serving after the abort"
    status, answer = out["r2"]
    assert status == 200 and answer["meta_info"]["finish_reason"]["type"] == "length", answer
    assert s.server.stats["batches"] == 1
  finally:
    s.close()
