"""The server's OpenAI-compatible routes, driven by the official `openai` client (tiny
random model with SmolLM2's real tokenizer and chat template, served in-process)."""

import json
import urllib.request

import numpy as np
import openai
import pytest

from rlpt.models import token_logprobs
from rlpt.rollout import GenerateRequest, JaxEngine, SamplingParams
from tests.rollout import serving

MODEL = "tiny-random"


@pytest.fixture(scope="module")
def tok():
  return serving.smollm2_tokenizer()


@pytest.fixture(scope="module")
def srv(tok):
  model = serving.tiny_model(tok)
  engine = JaxEngine(model, tok, serving.tiny_engine_config())
  s = serving.InProcessServer(engine, tok)
  s.model = model
  yield s
  s.close()


@pytest.fixture(scope="module")
def client(srv):
  return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)


def _greedy(srv, ids, n_tokens):
  return srv.engine.generate([GenerateRequest(prompt_ids=tuple(ids), sampling=SamplingParams(
      max_new_tokens=n_tokens, temperature=0.0))])[0]


def test_models_lists_the_served_model(client, srv):
  models = client.models.list().data
  assert [m.id for m in models] == [MODEL]


def test_completion_greedy_equals_the_engine_with_token_ids_and_usage(client, srv, tok):
  r = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=10,
                                temperature=0)
  ids = tok.encode("The quick brown fox")
  want = _greedy(srv, ids, 10)
  ch = r.choices[0]
  assert ch.text == want.text and ch.finish_reason in ("stop", "length")
  assert ch.model_extra["token_ids"] == want.token_ids       # the documented extension
  assert ch.model_extra["prompt_token_ids"] == ids
  assert r.usage.prompt_tokens == len(ids)
  assert r.usage.completion_tokens == len(want.token_ids)
  assert r.object == "text_completion" and r.model == MODEL


def test_completion_batches_token_id_prompts_and_n(client, srv, tok):
  prompts = [tok.encode("Hello"), tok.encode("Paris is the capital of")]
  r = client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, n=3,
                                temperature=1.0, seed=7)
  assert sorted(c.index for c in r.choices) == list(range(6))
  for c in r.choices:
    assert c.model_extra["prompt_token_ids"] == prompts[c.index // 3]
    assert len(c.model_extra["token_ids"]) <= 6
  again = client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, n=3,
                                    temperature=1.0, seed=7)
  assert [c.text for c in again.choices] == [c.text for c in r.choices]   # seeded


def test_echo_with_zero_max_tokens_scores_the_prompt_like_the_learner(client, srv, tok):
  """What lm-eval's loglikelihood sends: echo, max_tokens 0, logprobs 1."""
  text = "Paris is the capital of France"
  r = client.completions.create(model=MODEL, prompt=text, max_tokens=0, echo=True,
                                logprobs=1, temperature=0)
  lp = r.choices[0].logprobs
  ids = tok.encode(text)
  assert r.choices[0].text == tok.decode(ids)
  assert lp.tokens == [tok.decode([t]) for t in ids]
  assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
  want = np.asarray(token_logprobs(srv.model, np.array([ids]), np.ones((1, len(ids)), bool)))[0]
  np.testing.assert_allclose(lp.token_logprobs[1:], want[1:], atol=2e-5)
  for j in range(1, len(ids)):
    top = lp.top_logprobs[j]
    assert lp.tokens[j] in top and top[lp.tokens[j]] == lp.token_logprobs[j]
    assert max(top.values()) >= lp.token_logprobs[j]


def test_a_greedy_token_is_its_own_top_logprob_exactly(client, srv, tok):
  """lm-eval's is_greedy compares the token's logprob with max(top_logprobs) with ==."""
  r = client.completions.create(model=MODEL, prompt="One two three", max_tokens=4, echo=True,
                                logprobs=2, temperature=0)
  lp = r.choices[0].logprobs
  n_prompt = len(tok.encode("One two three"))
  for j in range(n_prompt, len(lp.tokens)):      # the greedy continuation
    assert lp.token_logprobs[j] == max(lp.top_logprobs[j].values())
    assert len(lp.top_logprobs[j]) <= 3


def test_chat_uses_the_chat_template_and_returns_logprobs(client, srv, tok):
  msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}]
  r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0,
                                     logprobs=True, top_logprobs=3)
  ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
  want = _greedy(srv, ids, 8)
  ch = r.choices[0]
  assert ch.message.role == "assistant" and ch.message.content == want.text
  assert ch.model_extra["token_ids"] == want.token_ids
  content = ch.logprobs.content
  assert [c.token for c in content] == [tok.decode([t]) for t in want.token_ids]
  np.testing.assert_allclose([c.logprob for c in content], want.logprobs, atol=2e-5)
  assert all(len(c.top_logprobs) == 3 and c.top_logprobs[0].logprob == c.logprob
             for c in content)                     # greedy: the top-1 is the token
  assert r.usage.prompt_tokens == len(ids) and r.object == "chat.completion"


def test_streaming_chunks_join_to_the_whole_answer(client, srv, tok):
  msgs = [{"role": "user", "content": "Count to five"}]
  whole = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12,
                                         temperature=0)
  stream = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12,
                                          temperature=0, stream=True,
                                          stream_options={"include_usage": True})
  chunks = list(stream)
  text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
  assert text == whole.choices[0].message.content
  assert chunks[0].choices[0].delta.role == "assistant"
  finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
  assert finals == [whole.choices[0].finish_reason]
  assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
  pieces = client.completions.create(model=MODEL, prompt="a b c", max_tokens=8,
                                     temperature=0, stream=True)
  assert "".join(c.choices[0].text for c in pieces) == client.completions.create(
      model=MODEL, prompt="a b c", max_tokens=8, temperature=0).choices[0].text


def test_streamed_text_arrives_while_the_engine_is_still_decoding(client, srv):
  stats = srv.server.stats
  done, early = stats["prompts"], stats["stream_chunks_early"]
  stream = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=400,
                                     temperature=0, stream=True, extra_body={"ignore_eos": True})
  chunks, finished_at_first = [], None
  for c in stream:
    if finished_at_first is None and c.choices[0].text:
      finished_at_first = stats["prompts"] - done   # requests the server had finished
    chunks.append(c)
  assert finished_at_first == 0          # the first text came before the request finished
  assert stats["stream_chunks_early"] - early >= 10    # 400 tokens, 16 decode steps a chunk
  whole = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=400,
                                    temperature=0, extra_body={"ignore_eos": True})
  assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
  assert chunks[-1].choices[0].finish_reason == "length"
  assert chunks[-1].choices[0].model_extra["token_ids"] == whole.choices[0].model_extra[
      "token_ids"]


def test_tokenize_detokenize_and_tokenizer_info(srv, tok):
  def post(path, body):
    req = urllib.request.Request(srv.url + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
      return json.load(r)
  out = post("/tokenize", {"prompt": "Hello world", "add_special_tokens": False})
  assert out["tokens"] == tok.encode("Hello world", add_special_tokens=False)
  assert post("/detokenize", {"tokens": out["tokens"]})["prompt"] == "Hello world"
  chat = post("/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
  assert chat["tokens"] == tok.apply_chat_template([{"role": "user", "content": "hi"}],
                                                    add_generation_prompt=True, tokenize=True)
  with urllib.request.urlopen(srv.url + "/tokenizer_info") as r:
    info = json.load(r)
  assert info["eos_token"] == tok.special_tokens["eos_token"]
  assert info["chat_template"] == tok.chat_template


@pytest.mark.parametrize("kwargs, param, status", [
    (dict(model="gpt-4"), "model", 404),
    (dict(max_tokens=0), "max_tokens", 400),
    (dict(logprobs=99), "logprobs", 400),
    (dict(temperature=-1), "temperature", 400),
    (dict(n=0), "n", 400),
    (dict(presence_penalty=1.0), "presence_penalty", 400),
    (dict(extra_body={"frobnicate": 1}), "frobnicate", 400),
    (dict(prompt=[[1, 2], "x"]), "prompt", 400),
    (dict(prompt=[10**9]), "prompt", 400),
    (dict(max_tokens=10**6), "prompt", 400),
])
def test_bad_requests_get_openais_error_body_and_the_server_lives_on(client, kwargs, param,
                                                                     status):
  args = dict(model=MODEL, prompt="hi", max_tokens=4)
  args.update(kwargs)
  with pytest.raises(openai.APIStatusError) as e:
    client.completions.create(**args)
  assert e.value.status_code == status
  err = e.value.body if "message" in e.value.body else e.value.body["error"]
  assert err["param"] == param and param.split("[")[0] in err["message"]
  assert client.completions.create(model=MODEL, prompt="ok", max_tokens=2).choices


def test_bad_chat_requests(client):
  with pytest.raises(openai.BadRequestError, match="top_logprobs"):
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                   top_logprobs=2)
  with pytest.raises(openai.BadRequestError, match=r"messages\[0\]"):
    client.chat.completions.create(model=MODEL, messages=[{"role": "robot", "content": "x"}])
  with pytest.raises(openai.BadRequestError, match="tools"):
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                   tools=[{"type": "function",
                                           "function": {"name": "f", "parameters": {}}}])
