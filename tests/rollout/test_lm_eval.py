"""lm-evaluation-harness (PyPI `lm-eval`) drives a `launch.serve` process through its
`local-completions` (loglikelihood and generate_until, the server's own tokenizer over
/tokenize) and `local-chat-completions` model types, on tasks defined in local files;
its numbers are checked against the server's SGLang routes. Nothing is downloaded."""

import json

import pytest

from tests.rollout import serving

MODEL = "smollm2-135m-instruct"
MC = [{"question": "The capital of France is", "choices": [" Paris", " a banana", " blue"],
       "answer": 0},
      {"question": "Two plus two equals", "choices": [" four", " seven", " green"], "answer": 0},
      {"question": "The opposite of hot is", "choices": [" purple", " cold", " seven"],
       "answer": 1}]
GEN = [{"question": "Question: What is the capital of France?\nAnswer:", "answer": " Paris"},
       {"question": "Question: What is 2 + 2?\nAnswer:", "answer": " 4"}]
TASKS = {
    "rlpt_mc": "output_type: multiple_choice\ndoc_to_choice: \"{{choices}}\"\n"
               "metric_list:\n  - metric: acc\n",
    "rlpt_gen": "output_type: generate_until\ngeneration_kwargs:\n  until: [\"\\n\"]\n"
                "  max_gen_toks: 8\n  do_sample: false\n  temperature: 0\n"
                "metric_list:\n  - metric: exact_match\n",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
  log = tmp_path_factory.mktemp("serve") / "serve.log"
  proc, url = serving.start_serve(["--config=configs/serve.py", "--config.serve.warmup=false"],
                                  log_path=str(log))
  yield url
  serving.stop(proc)


@pytest.fixture()
def tasks(tmp_path, monkeypatch):
  monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  for name, rows in (("rlpt_mc", MC), ("rlpt_gen", GEN)):
    data = tmp_path / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\ndoc_to_text: \"{{question}}\"\ndoc_to_target: \"{{answer}}\"\n"
        + TASKS[name])
  from lm_eval.tasks import TaskManager
  return TaskManager(include_path=str(tmp_path))


def _greedy_text(url, ids, max_new=8):
  status, out = serving.post(url, "/generate", {"input_ids": ids, "sampling_params": {
      "max_new_tokens": max_new, "temperature": 0, "stop": ["\n"]}})
  assert status == 200, out
  return out["text"]


def _tokenize(url, text):
  return serving.post(url, "/tokenize", {"prompt": text, "add_special_tokens": False})[1]["tokens"]


@pytest.mark.slow
def test_local_completions_loglikelihood_and_generation(server, tasks):
  import lm_eval
  res = lm_eval.simple_evaluate(
      model="local-completions",
      model_args=f"base_url={server}/v1/completions,model={MODEL},tokenizer_backend=remote,"
                 "tokenized_requests=True,num_concurrent=1,max_retries=1",
      tasks=["rlpt_mc", "rlpt_gen"], task_manager=tasks, log_samples=True)
  assert res["results"]["rlpt_mc"]["acc,none"] == 1.0    # Paris, four, cold
  for s in res["samples"]["rlpt_mc"]:
    (context, _), lls = s["arguments"][0], [r[0][0] for r in s["resps"]]
    assert max(range(len(lls)), key=lls.__getitem__) == s["doc"]["answer"]
    # each choice's loglikelihood, from the SGLang route's prompt logprobs of the same ids
    for (ctx, cont), ll in zip(s["arguments"], lls):
      ids, n_ctx = _tokenize(server, ctx + cont), len(_tokenize(server, ctx))
      status, out = serving.post(server, "/generate", {
          "input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
          "logprob_start_len": 0})
      assert status == 200, out
      want = sum(e[0] for e in out["meta_info"]["input_token_logprobs"][n_ctx:])
      assert ll == pytest.approx(want, abs=1e-3)
  for s in res["samples"]["rlpt_gen"]:
    assert s["resps"][0][0] == _greedy_text(server, _tokenize(server, s["arguments"][0][0]))
  assert res["results"]["rlpt_gen"]["exact_match,none"] == pytest.approx(
      sum(s["resps"][0][0] == s["doc"]["answer"] for s in res["samples"]["rlpt_gen"]) / len(GEN))


@pytest.mark.slow
def test_local_chat_completions_generation(server, tasks):
  import lm_eval
  res = lm_eval.simple_evaluate(
      model="local-chat-completions",
      model_args=f"base_url={server}/v1/chat/completions,model={MODEL},num_concurrent=1,"
                 "max_retries=1",
      tasks=["rlpt_gen"], task_manager=tasks, log_samples=True, apply_chat_template=True)
  assert "exact_match,none" in res["results"]["rlpt_gen"]
  for s in res["samples"]["rlpt_gen"]:
    messages = json.loads(s["arguments"][0][0][0])   # ((chat JSON,), generation kwargs)
    status, tok = serving.post(server, "/tokenize", {"messages": messages})
    assert status == 200, tok
    assert s["resps"][0][0] == _greedy_text(server, tok["tokens"])
    assert s["resps"][0][0]        # the model answered something
