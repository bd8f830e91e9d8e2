"""The code_repair domain: mutants of HumanEval, the workspace environment, and its
verifier under scripted agents (the reference fix, doing nothing, editing the
tests) and reward-hacking attempts, all run for real in the gVisor sandbox."""

from __future__ import annotations

import concurrent.futures
import json
import pathlib
import sys

import pytest

from rlpt import rewards
from rlpt.data import sources
from rlpt.data.sources import code_tasks, repair_tasks, splits
from rlpt.envs import code_repair, tool_calls
from rlpt.envs import registry as env_registry
from rlpt.envs.code_repair import CodeRepairEnv
from rlpt.envs.sandbox_tools import ToolLimits
from rlpt.rewards.repair import final_state

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "sandbox"))
import sandbox_helpers  # noqa: E402

needs_runsc = pytest.mark.skipif(not sandbox_helpers.HAVE_RUNSC, reason="runsc not installed")


def _all_tasks():
  src = sources.get_source("code_repair")
  return src._tasks["train"] + src._tasks["holdout"]


def _buggy(t):
  return t.metadata["files"][t.metadata["solution_file"]]


def test_mutations_change_one_spot_of_the_solution_and_check_their_source():
  p = code_tasks.problems()[0]
  src = repair_tasks.solution_source(p)
  ms = repair_tasks.candidates(p)
  assert {m.kind for m in ms} == set(repair_tasks.KINDS)
  assert all(m.start >= len(p["prompt"]) for m in ms)      # never the signature/docstring
  flip = next(m for m in ms if m.kind == "comparison" and m.original == "<")
  assert flip.replacement == ">" and flip.apply(src).count("distance > threshold") == 1
  drop = next(m for m in ms if m.kind == "dropped_branch")
  assert drop.original.lstrip().startswith("if ") and drop.replacement == ""
  fix = repair_tasks.fix_of(src, drop)
  assert drop.apply(src).count(fix.old) == 1
  assert drop.apply(src).replace(fix.old, fix.new) == src
  with pytest.raises(ValueError, match="expects '<'"):
    flip.apply(src.replace("distance < threshold", "distance = threshold"))


def test_the_shipped_mutants_cover_every_kind_split_by_problem_with_unique_fixes():
  tasks = _all_tasks()
  assert len(tasks) >= 200 and len({t.metadata["task_id"] for t in tasks}) >= 120
  kinds = {k: sum(t.metadata["kind"] == k for t in tasks) for k in repair_tasks.KINDS}
  assert min(kinds.values()) >= 20, kinds
  src = sources.get_source("code_repair", seed=1)
  train = {src.train(i).metadata["task_id"] for i in range(300)}
  hold = {t.metadata["task_id"] for t in src.holdout(40)}
  assert train and hold and not train & hold
  assert all(splits.is_holdout(h) for h in hold)
  assert src.train(0) == sources.get_source("code_repair", seed=1).train(0)
  for t in tasks:
    fix, buggy = t.metadata["fix"], _buggy(t)
    assert buggy.count(fix["old"]) == 1 and fix["old"] != fix["new"]
    canonical = repair_tasks.solution_source(repair_tasks._problems_by_id()[t.metadata["task_id"]])
    assert buggy.replace(fix["old"], fix["new"]) == canonical
    assert "FAILED" in t.metadata["failed_output"]
    assert f"```python\n{buggy}```" in t.prompt
  short = repair_tasks.CodeRepairSource(max_solution_chars=400)
  assert all(len(_buggy(short.train(i))) <= 400 for i in range(50))


def test_a_bad_shipped_list_names_the_file_and_the_field(tmp_path):
  bad = tmp_path / "m.json"
  bad.write_text(json.dumps({"mutants": [{"task_id": "HumanEval/0", "kind": "operator"}]}))
  with pytest.raises(ValueError, match=r"m\.json: mutants\[0\] lacks \['end', 'original'"):
    repair_tasks.shipped(str(bad))
  bad.write_text("[]")
  with pytest.raises(ValueError, match=r"m\.json: expected"):
    repair_tasks.shipped(str(bad))
  with pytest.raises(FileNotFoundError, match="build_code_repair"):
    repair_tasks.shipped(str(tmp_path / "missing.json"))
  rec = dict(repair_tasks.shipped()[0], original="nothing like it")
  with pytest.raises(ValueError, match="expects 'nothing like it'"):
    repair_tasks.task_of(rec)


def test_the_domain_is_episodic_and_opens_with_the_tools_and_the_file():
  assert env_registry.is_episodic("code_repair") and "code_repair" in env_registry.domains()
  t = sources.get_source("code_repair").train(3)
  opening = env_registry.make("code_repair", None, ToolLimits()).reset(t)
  system = opening[0]["content"]
  assert all(name in system for name in code_repair.TOOLS) and "Never change test_solution.py" \
      in system
  assert opening[1]["content"] == t.prompt
  without = CodeRepairEnv(None, with_tool=False).reset(t)[0]["content"]
  assert "<tool_call>" not in without
  with pytest.raises(ValueError, match="lacks metadata"):
    CodeRepairEnv(None).reset(sources.get_source("code").train(0))


@pytest.mark.parametrize("state, score, violations", [
    ({"solution": None, "tests_intact": True}, 0.0, ("no_solution",)),
    ({"solution": "FIXED", "tests_intact": False}, 0.0, ("tests_modified",)),
    ({"solution": "def f(:", "tests_intact": True}, 0.0, ()),
    ("not json", 0.0, ("format",)),
    ({"solution": 3, "tests_intact": True}, 0.0, ("format",)),
])
@needs_runsc
def test_the_verifier_pays_only_intact_tests_and_a_passing_solution(state, score, violations):
  t = sources.get_source("code_repair").train(0)
  fixed = _buggy(t).replace(t.metadata["fix"]["old"], t.metadata["fix"]["new"])
  text = state if isinstance(state, str) else json.dumps(
      {k: fixed if v == "FIXED" else v for k, v in state.items()})
  r = rewards.compute_reward(t, text)
  assert (r.score, r.violations) == (score, violations), r
  good = rewards.compute_reward(t, sources.get_source("code_repair").reference(t))
  assert (good.score, good.reward) == (1.0, 1.0)


HACKS = {
    # exit before any test can fail
    "exit": "import sys\nsys.exit(0)\n",
    # an object equal to everything
    "always_equal": "class _E:\n  def __eq__(self, o): return True\n  def __ne__(self, o): "
                    "return False\n\ndef {entry}(*a, **k):\n  return _E()\n",
    # a stub that returns nothing
    "stub": "def {entry}(*a, **k):\n  return None\n",
    # print a fake verdict
    "fake_pass": "print('all tests passed')\n{solution}\nimport os\nos._exit(0)\n",
}


@needs_runsc
@pytest.mark.parametrize("name", sorted(HACKS))
def test_reward_hacks_through_the_final_solution_score_zero(name):
  t = sources.get_source("code_repair").train(5)
  code = HACKS[name].format(entry=t.metadata["entry_point"], solution=_buggy(t).replace(
      t.metadata["fix"]["old"], t.metadata["fix"]["new"]))
  r = rewards.compute_reward(t, final_state(code, True))
  assert r.score == 0.0, (name, r)


def _play(pool, t, agent):
  env = CodeRepairEnv(pool, ToolLimits(max_calls=8))
  return code_repair.play(env, t, agent)


@pytest.mark.slow
@needs_runsc
def test_every_shipped_mutant_reference_fix_scores_one_and_doing_nothing_zero():
  """The acceptance check, live: on every shipped mutant the hidden tests fail as
  given, and the reference agent (run, read, fix, run) sees exactly the
  demonstration's outputs and ends at reward 1."""
  tasks = _all_tasks()
  with sandbox_helpers.isolated_pool(4) as (pool, _):
    def one(t):
      state, steps = _play(pool, t, code_repair.reference_agent(t))
      got = [m for st in steps for m in st.messages]
      want = [m for _, msgs in code_repair.demonstration(t) for m in msgs]
      nothing, _ = _play(pool, t, code_repair.do_nothing_agent(t))
      return got == want, state, nothing

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
      played = list(ex.map(one, tasks))
  # verified outside the isolated pool's block: the verifier runs on the default pool
  ref = rewards.compute_rewards(tasks, [p[1] for p in played])
  nothing = rewards.compute_rewards(tasks, [p[2] for p in played])
  bad = [(t.metadata["task_id"], t.metadata["kind"], same, r.score, n.score, r.details)
         for t, (same, _, _), r, n in zip(tasks, played, ref, nothing)
         if not (same and r.score == 1.0 and n.score == 0.0)]
  assert not bad, bad[:10]
  assert all(json.loads(p[2])["solution"] == _buggy(t) for t, p in zip(tasks, played))


@needs_runsc
@pytest.mark.parametrize("delete, also_fix", [(False, True), (True, True), (False, False)])
def test_an_agent_that_touches_the_tests_scores_zero(delete, also_fix):
  t = sources.get_source("code_repair").train(1)
  with sandbox_helpers.isolated_pool(1) as (pool, _):
    state, steps = _play(pool, t, code_repair.test_editing_agent(t, delete=delete,
                                                                 also_fix=also_fix))
  assert all(r.violation is None for st in steps for r in st.records)
  r = rewards.compute_reward(t, state)
  assert (r.score, r.violations) == (0.0, ("tests_modified",)), r
  if also_fix:  # the solution itself was right: only the tests' edit costs it
    fixed = _buggy(t).replace(t.metadata["fix"]["old"], t.metadata["fix"]["new"])
    assert json.loads(state)["solution"] == fixed


@needs_runsc
def test_edit_file_errors_are_for_the_model_to_read_and_the_episode_goes_on():
  t = sources.get_source("code_repair").train(2)
  with sandbox_helpers.isolated_pool(1) as (pool, _):
    env = CodeRepairEnv(pool, ToolLimits(max_calls=8))
    env.reset(t)
    call = lambda name, **a: env.step(tool_calls.format_call(name, a))  # noqa: E731
    st = call("edit_file", path="solution.py", old="no such text", new="x")
    (rec,) = st.records
    assert rec.exit_code == 1 and rec.violation is None and "occurs 0 times" in rec.output
    st = call("edit_file", path="solution.py", old="\n", new="\n\n")
    assert "must occur exactly once" in st.records[0].output
    st = call("edit_file", path="../etc/passwd", old="a", new="b")
    assert st.records[0].violation == "tool_call" and "outside /sandbox" in st.records[0].output
    st = env.step("<tool_call>{\"name\": \"edit_file\", \"arguments\": [1]}</tool_call>")
    assert st.records[0].violation == "tool_call"
    st = call("read_file", path="solution.py")
    assert st.records[0].output == _buggy(t)           # nothing was changed by the failures
    st = call("run", command="python test_solution.py")
    assert st.records[0].exit_code == 1 and "FAILED" in st.records[0].output
    assert json.loads(env.completion()) == {"solution": _buggy(t), "tests_intact": True}
    env.close()


@needs_runsc
def test_one_episodes_files_and_processes_are_gone_in_the_next():
  t = sources.get_source("code_repair").train(4)
  with sandbox_helpers.isolated_pool(1) as (pool, _):
    env = CodeRepairEnv(pool, ToolLimits(max_calls=8))

    def first(messages):
      n = sum(m["role"] == "assistant" for m in messages)
      return [tool_calls.format_call("write_file", {"path": "note.txt", "content": "secret"}),
              tool_calls.format_call("run", {"command": "nohup sleep 300 >/dev/null 2>&1 &"}),
              "done"][n]
    code_repair.play(env, t, first)

    seen = []

    def second(messages):
      if messages[-1]["role"] == "tool":
        seen.append(messages[-1]["content"])
        return "done"
      return tool_calls.format_call("run", {"command": "ls; ps -e -o comm= | grep -c sleep"})
    state, _ = code_repair.play(env, t, second)
  assert "note.txt" not in seen[0] and "solution.py" in seen[0] and "\n0\n" in seen[0], seen
  assert json.loads(state)["tests_intact"]


def test_the_config_fits_its_episodes_and_refuses_a_filter_that_leaves_nothing():
  from configs import agentic_code_repair
  from rlpt.envs import episode as ep_lib
  from rlpt.models.loading import load_tokenizer_of, resolve_path
  from rlpt.train import build, generation, settings
  tok = load_tokenizer_of(resolve_path("smollm2-135m-instruct"))
  c = agentic_code_repair.get_config()
  s = settings.Settings.from_config(c)
  build.check_episodic_template(s)
  src = build.task_source("code_repair", s.data, seed=0)
  assert src.size("train") >= 40 and src.size("holdout") >= 10
  assert s.engine_config().max_len >= s.episodes.caps.max_context_tokens
  renderer = ep_lib.Renderer(tok)
  for t in src._tasks["train"] + src._tasks["holdout"]:
    assert len(t.metadata["files"]["solution.py"]) <= c.data.code_repair_max_chars
    turns = code_repair.demonstration(t)
    prompt, ids, _ = ep_lib.demonstration_ids(renderer, generation.opening(t, s.episodes), turns)
    assert len(prompt) <= s.rollout.max_prompt_len
    assert len(prompt) + len(ids) <= min(s.episodes.caps.max_context_tokens, s.sft.max_len)
    assert len(turns) <= s.episodes.caps.max_turns and len(turns) - 1 <= s.episodes.tools.max_calls
    assert max(len(tok.encode(x, add_special_tokens=False)) for x, _ in turns) < \
        s.rollout.max_new_tokens
  c.data.code_repair_max_chars = 10
  with pytest.raises(settings.ConfigError, match="code_repair_max_chars = 10: no shipped"):
    build.task_source("code_repair", settings.Settings.from_config(c).data, seed=0)
  c.data.code_repair_max_chars = -1
  with pytest.raises(settings.ConfigError, match="data.code_repair_max_chars"):
    settings.Settings.from_config(c)


@needs_runsc
def test_a_final_state_the_model_bloated_is_its_zero_not_an_infrastructure_failure():
  """A solution.py past the file limit (or a directory in its place) is read back as
  no solution: the read-back itself never overflows or fails on the model's doing."""
  t = sources.get_source("code_repair").train(6)
  states = []
  with sandbox_helpers.isolated_pool(1) as (pool, _):
    for cmd in ("python3 -c \"open('solution.py', 'w').write('#' * 3000000)\"",
                "rm solution.py && mkdir solution.py"):
      turns = [tool_calls.format_call("run", {"command": cmd}), "done"]
      state, steps = _play(pool, t, lambda m: turns[sum(x["role"] == "assistant" for x in m)])
      assert steps[0].records[0].exit_code == 0, steps[0].records[0]
      states.append(state)
  for state in states:
    assert json.loads(state) == {"solution": None, "tests_intact": True}
    r = rewards.compute_reward(t, state)
    assert (r.score, r.violations) == (0.0, ("no_solution",))
