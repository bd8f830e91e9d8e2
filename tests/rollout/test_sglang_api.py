"""Parsing SGLang's native /generate body into rlpt requests (no model needed: a real
tokenizer, SmolLM2's, encodes the text prompts)."""

import pytest

from rlpt.rollout.engine import Completion
from rlpt.rollout.sglang_api import ApiError, answer, parse_generate
from tests.rollout import serving


@pytest.fixture(scope="module")
def tok():
  return serving.smollm2_tokenizer()


def parse(tok, body, **kw):
  return parse_generate(body, tok, vocab_size=tok.vocab_size, max_context=256, **kw)


def test_single_text_defaults(tok):
  jobs, single = parse(tok, {"text": "Hello"})
  assert single and len(jobs) == 1
  r = jobs[0].request
  assert r.prompt_ids == tuple(tok.encode("Hello")) and r.n == 1
  s = r.sampling
  assert (s.max_new_tokens, s.temperature, s.top_p, s.top_k, s.seed) == (128, 1.0, 1.0, 0, None)
  assert not jobs[0].return_logprob and jobs[0].logprob_start_len == -1


def test_sglang_sampling_conventions(tok):
  jobs, _ = parse(tok, {"input_ids": [1, 2, 3], "sampling_params": {
      "temperature": 1e-9, "top_k": -1, "stop": "\n", "stop_token_ids": [5],
      "sampling_seed": 9, "max_new_tokens": None, "skip_special_tokens": True,
      "stop_regex": [], "regex": None, "min_p": 0.0}}, default_max_new_tokens=33)
  s = jobs[0].request.sampling
  assert s.temperature == 0.0  # (near) zero temperature is greedy, as in SGLang
  assert s.top_k == 0 and s.stop == ("\n",) and s.stop_token_ids == (5,) and s.seed == 9
  assert s.max_new_tokens == 33
  jobs, _ = parse(tok, {"input_ids": [1], "sampling_params": {"top_k": 10 ** 9}})
  assert jobs[0].request.sampling.top_k == 0  # larger than the vocabulary = all tokens


def test_batch_forms(tok):
  jobs, single = parse(tok, {"input_ids": [[1, 2], [3]], "rid": "x",
                             "sampling_params": [{"n": 2}, {"n": 1, "max_new_tokens": 4}],
                             "return_logprob": [True, False], "logprob_start_len": [0, -1]})
  assert not single and [j.rid for j in jobs] == ["x_0", "x_1"]
  assert [j.request.n for j in jobs] == [2, 1]
  assert jobs[1].request.sampling.max_new_tokens == 4
  assert [j.wants_input_logprobs for j in jobs] == [True, False]
  # one prompt with n > 1 answers a list
  assert parse(tok, {"text": "a", "sampling_params": {"n": 3}})[1] is False


def test_answer_shape(tok):
  jobs, _ = parse(tok, {"input_ids": [4, 5, 6], "return_logprob": True, "logprob_start_len": 1,
                        "return_text_in_logprobs": True, "return_prompt_token_ids": True})
  c = Completion(request_id="r", sample_index=0, prompt_ids=[4, 5, 6], token_ids=[7, 8], text="xy",
                 logprobs=[-1.0, -2.0], sampling_logprobs=[-0.5, -0.25], finish_reason="length",
                 weight_version=3)
  (out,) = answer(jobs[0], [c], tok, [0.0, -0.1, -0.2], 0.5)
  meta = out["meta_info"]
  assert out["output_ids"] == [7, 8] and out["text"] == "xy"
  assert out["prompt_token_ids"] == [4, 5, 6]
  assert meta["weight_version"] == "3" and meta["finish_reason"] == {"type": "length", "length": 2}
  assert meta["input_token_logprobs"] == [[-0.1, 5, tok.decode([5])], [-0.2, 6, tok.decode([6])]]
  assert meta["output_token_logprobs"] == [[-1.0, 7, tok.decode([7])], [-2.0, 8, tok.decode([8])]]
  assert meta["output_token_sampling_logprobs"] == [-0.5, -0.25]


@pytest.mark.parametrize("body, needle", [
    ({"text": "a", "sampling_params": {"top_k": 0}}, "top_k"),
    ({"text": "a", "sampling_params": {"n": 0}}, ".n must be >= 1"),
    ({"text": "a", "sampling_params": {"stop": [""]}}, "stop"),
    ({"text": "a", "sampling_params": {"temperature": "hot"}}, "must be a number"),
    ({"text": "a", "sampling_params": {"frequency_penalty": 0.5}}, "not supported"),
    ({"text": "a", "sampling_params": {"max_wall_s": 0}}, "max_wall_s must be a positive"),
    ({"text": "a", "top_logprobs_num": 5}, "top_logprobs_num"),
    ({"text": "a", "image_data": "x.png"}, "image_data"),
    ({"input_ids": [[1], "x"]}, "input_ids[1]"),
    ({"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 2}, "logprob_start_len"),
    ([1, 2], "JSON object"),
])
def test_refusals_name_the_field(tok, body, needle):
  with pytest.raises(ApiError) as e:
    parse(tok, body)
  assert needle in str(e.value) and e.value.status == 400
