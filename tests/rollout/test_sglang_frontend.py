"""SGLang's own frontend (`sglang.lang`, RuntimeEndpoint) runs @sgl.function programs
against a real `python -m launch.serve` process serving SmolLM2 (the default config)."""

import pytest

from tests.rollout import serving

CHAT = "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
QUESTION = "Write one sentence about the sea."


@pytest.fixture(scope="module")
def server(tmp_path_factory):
  log = str(tmp_path_factory.mktemp("serve") / "serve.log")
  proc, url = serving.start_serve(
      ["--config=configs/serve.py", "--config.serve.warmup=false"], log_path=log)
  yield url
  serving.stop(proc)


@pytest.fixture(scope="module")
def sgl(server):
  sgl = pytest.importorskip("sglang")
  from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint
  backend = RuntimeEndpoint(server)
  assert backend.get_model_name() == "smollm2-135m-instruct"
  sgl.set_default_backend(backend)
  return sgl


def _raw_greedy(url, text, max_new_tokens):
  status, out = serving.post(url, "/generate", {
      "text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}})
  assert status == 200, out
  return out["text"]


def test_gen_greedy_stop_and_max_tokens(server, sgl):
  @sgl.function
  def answer(s, question, stop_at, max_tokens):
    s += CHAT.format(q=question)
    s += sgl.gen("answer", max_tokens=max_tokens, stop=stop_at, temperature=0)

  greedy = _raw_greedy(server, CHAT.format(q=QUESTION), 24)
  assert len(greedy.split()) >= 3, greedy
  state = answer.run(question=QUESTION, stop_at=[], max_tokens=24)
  assert state["answer"] == greedy
  assert state.get_meta_info("answer")["completion_tokens"] <= 24

  stop = " " + greedy.split()[2]  # the third word ends the answer before it
  state = answer.run(question=QUESTION, stop_at=stop, max_tokens=24)
  assert state["answer"] == greedy[:greedy.find(stop)]
  assert stop not in state["answer"]

  state = answer.run(question=QUESTION, stop_at=[], max_tokens=4)
  meta = state.get_meta_info("answer")
  assert meta["completion_tokens"] == 4 and meta["finish_reason"]["type"] == "length"
  assert greedy.startswith(state["answer"])


def test_gen_temperature(server, sgl):
  @sgl.function
  def sample(s, temp):  # (run() keeps `temperature` for itself)
    s += CHAT.format(q="Name a random animal.")
    s += sgl.gen("animal", max_tokens=12, temperature=temp)

  # one at a time: every request then reuses the batch-of-one programs compiled above
  hot = [sample.run(temp=1.5) for _ in range(4)]
  cold = [sample.run(temp=0.0) for _ in range(3)]
  assert len({s["animal"] for s in hot}) > 1  # fresh randomness per request
  assert len({s["animal"] for s in cold}) == 1  # greedy is deterministic


def test_select_uses_input_token_logprobs(server, sgl):
  @sgl.function
  def capital(s):
    s += CHAT.format(q="What is the capital of France?") + "The capital of France is"
    s += sgl.select("city", choices=[" Paris", " Tokyo", " a banana"])

  state = capital.run()
  assert state["city"] == " Paris"
  meta = state.get_meta_info("city")
  scores = meta["normalized_prompt_logprobs"]
  assert scores.index(max(scores)) == 0
  for entries in meta["input_token_logprobs"]:
    assert all(e[0] is not None and e[0] <= 0 for e in entries)
  # the frontend's numbers are the server's scoring of the same text
  text = CHAT.format(q="What is the capital of France?") + "The capital of France is Paris"
  status, out = serving.post(server, "/generate", {
      "text": text, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
      "logprob_start_len": 0})
  paris = meta["input_token_logprobs"][0]
  tail = [e[0] for e in out["meta_info"]["input_token_logprobs"][-len(paris):]]
  assert tail == pytest.approx([e[0] for e in paris], abs=1e-5)
