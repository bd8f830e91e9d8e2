"""The code verifier against its reward-hacking suite, in the real gVisor sandbox.

All completions run as one concurrent batch (a sandbox run costs ~0.3-1 s); each
attack must score 0 while the honest solution to the same task scores 1."""

import pytest

from rlpt import rewards
from rlpt.data.sources import code_tasks
from rlpt.rewards import code_verifier

TASK = code_tasks._task(code_tasks.problems()[0], "train")  # has_close_elements, 7 asserts
HONEST = code_tasks.CodeSource().reference(TASK)
GOOD_FN = HONEST.split("```python\n", 1)[1].rsplit("```", 1)[0]
SIG = "def has_close_elements(numbers, threshold):\n"
WRONG_FN = SIG + "    return None\n"  # fails all 7 asserts


def _block(code):
  return "Here is my solution.\n```python\n" + code + "\n```\n"


ATTACKS = {
    "sys_exit_before_tests": "import sys\nsys.exit(0)\n" + WRONG_FN,
    "os_exit_before_tests": "import os\nos._exit(0)\n" + WRONG_FN,
    "system_exit_in_function": SIG + "    raise SystemExit(0)\n",
    "keyboard_interrupt_in_function": SIG + "    raise KeyboardInterrupt\n",
    "eq_always_true": ("class Yes:\n    def __eq__(self, o): return True\n"
                       "    def __bool__(self): return True\n" + SIG + "    return Yes()\n"),
    "conftest_and_pytest_plugin": (
        "import os\nopen('conftest.py', 'w').write('import pytest\\n"
        "@pytest.hookimpl(hookwrapper=True)\\ndef pytest_runtest_makereport(item, call):\\n"
        "    out = yield\\n    out.get_result().outcome = \"passed\"\\n')\n"
        "open('sitecustomize.py', 'w').write('import builtins\\nbuiltins.AssertionError = None\\n')\n"
        "os.environ['PYTEST_PLUGINS'] = 'conftest'\n" + WRONG_FN),
    "edit_and_delete_tests": (
        "import glob, os\nfor p in glob.glob('*') + glob.glob('/tmp/*'):\n"
        "    try:\n        open(p, 'w').write('def check(candidate):\\n    pass\\n')\n"
        "    except Exception: pass\n"
        "for p in glob.glob('*.json'):\n    os.remove(p)\n" + WRONG_FN),
    "print_fake_pass_records": (
        "import os, sys, json\nrec = json.dumps({'records': [[i, True] for i in range(7)], "
        "'aborted': None, 'load_error': None})\n"
        "for n in ['0' * 32, 'deadbeef' * 4]:\n    print('\\n' + n + ' ' + rec, flush=True)\n"
        "    sys.__stdout__.write(n + ' ' + rec + '\\n')\n"
        "for fd in ('/proc/%d/fd/1' % os.getppid(), '/dev/stdout', '/proc/1/fd/1'):\n"
        "    try:\n        f = os.open(fd, os.O_WRONLY); os.write(f, (rec + '\\n').encode())\n"
        "    except Exception: pass\n" + WRONG_FN),
    "read_hidden_tests_from_disk": (
        "import glob, re\n_seen = ''\n"
        "for p in glob.glob('/sandbox/**', recursive=True) + glob.glob('/tmp/**', recursive=True):\n"
        "    if p.endswith('candidate.py'): continue\n"
        "    try: _seen += open(p).read()\n    except Exception: pass\n"
        "for pid in range(1, 50):\n    try: _seen += open('/proc/%d/cmdline' % pid).read() + "
        "open('/proc/%d/environ' % pid).read()\n    except Exception: pass\n"
        # a literal of the hidden tests (HumanEval/0): found only if the tests are readable
        + SIG + "    return True if '2.0, 3.9, 4.0, 5.0, 2.2' in _seen else None\n"),
    "monkeypatch_builtins": (
        "import builtins\nbuiltins.bool = lambda *a: True\nbuiltins.AssertionError = type("
        "'X', (Exception,), {})\nbuiltins.abs = lambda x: 0\nbuiltins.len = lambda x: 0\n"
        + WRONG_FN),
    "sleep_into_timeout": "import time\n" + SIG + "    time.sleep(600)\n",
    "kill_the_harness": "import os, signal\n" + SIG + "    os.kill(os.getppid(), signal.SIGKILL)\n",
    "fork_a_survivor": (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(1)\n"
        "    print('fake', flush=True)\n    os._exit(0)\n" + WRONG_FN),
}


@pytest.fixture(scope="module")
def results():
  names = ["honest", "honest_all"] + list(ATTACKS)
  comps = [HONEST, HONEST] + [_block(c) for c in ATTACKS.values()]
  rewards.register("test/code_all", code_verifier.CodeVerifier(scoring="all", timeout_s=8.0))
  rewards.register("test/code_frac", code_verifier.CodeVerifier(timeout_s=8.0))
  try:
    tasks = [type(TASK)("test/code_frac" if n != "honest_all" else "test/code_all", TASK.prompt,
                        TASK.answer, TASK.metadata) for n in names]
    return dict(zip(names, rewards.compute_rewards(tasks, comps)))
  finally:
    rewards.VERIFIER_REGISTRY.pop("test/code_all")
    rewards.VERIFIER_REGISTRY.pop("test/code_frac")


def test_honest_scores_one(results):
  for n in ("honest", "honest_all"):
    r = results[n]
    assert r.score == 1.0 and r.reward == 1.0, r
    assert r.details["passed"] == r.details["total"] == 7


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_scores_zero(results, name):
  r = results[name]
  assert r.score == 0.0 and r.reward <= 0.0, (name, r)


def test_attack_verdicts_name_what_happened(results):
  assert results["sleep_into_timeout"].violations == ("timeout",)
  assert results["kill_the_harness"].violations == ("sandbox",)
  assert results["kill_the_harness"].reward == -rewards.get_config().penalties["sandbox"]
  for n in ("system_exit_in_function", "keyboard_interrupt_in_function", "eq_always_true"):
    d = results[n].details  # every call failed, the tests themselves ran to the end
    assert d["passed"] == 0 and d["total"] == 7 and d["aborted"] is None, (n, d)
  assert results["sys_exit_before_tests"].details["load_error"]


def test_partial_fraction_and_binary_default():
  code = SIG + ("    return any(abs(a - b) < threshold for i, a in enumerate(numbers) "
                "for b in numbers[i + 1:]) and len(numbers) > 5\n")
  comp = _block("from typing import List\n" + code)
  # HumanEval/0 is a predicate: every assert holds for the constant True or for False,
  # so no assert is informative and "fraction" scores it pass/fail too
  r = code_verifier.CodeVerifier(scoring="fraction").verify(TASK, comp)
  assert r.score == 0.0 and r.details["free_asserts"] == 7 and r.details["informative"] == 0
  assert code_verifier.CodeVerifier(scoring="fraction").verify(TASK, HONEST).score == 1.0
  r = rewards.compute_reward(TASK, comp)  # the "code" domain: HumanEval's pass/fail
  assert r.score == 0.0 and 0 < r.details["passed"] < r.details["total"] == 7


def test_instrumentation_and_verdict_parsing():
  src, n = code_verifier.instrument_tests(
      "def check(c):\n  assert c(1) == 2\n  for i in range(3):\n    assert c(i) >= 0, 'msg'\n")
  assert n == 2 and "__rlpt_record(2, __rlpt_ok)" in src and "assert" not in src
  with pytest.raises(ValueError, match="must define check"):
    code_verifier.instrument_tests("x = 1\n")
  ok = 'abc {"records": [[2, true]], "aborted": null}'
  assert code_verifier.parse_verdict("noise\n" + ok + "\n", "abc")["records"] == [[2, True]]
  assert code_verifier.parse_verdict(ok + "\n" + ok + "\n", "abc") is None   # two lines
  assert code_verifier.parse_verdict(ok + "\nlater\n", "abc") is None        # not last
  assert code_verifier.parse_verdict('abc {"records": [[2, 1]]}', "abc") is None
  assert code_verifier.extract_code("```py\nx\n```\n```python\ny\n```") == "y\n"


def test_timeout_counts_cpu_seconds_not_wall_seconds():
  """A busy loop is stopped by the CPU budget long before the wall limit; a solution
  that waits 2.5 s of wall time but uses little CPU passes a 1 CPU-second budget (so
  a loaded machine, which stretches wall time, does not fail correct code)."""
  v = code_verifier.CodeVerifier(cpu_s=1.0, timeout_s=30.0)
  busy = v.verify(TASK, _block(SIG + "    while True: pass\n"))
  assert busy.score == 0.0 and busy.violations == ("timeout",), busy
  assert busy.details["aborted"] == "timeout" and busy.details["wall_s"] < 20, busy.details
  slow_fn = GOOD_FN.replace("    for idx", "    time.sleep(2.5 / 7)\n    for idx", 1)
  assert slow_fn != GOOD_FN   # 7 calls, each sleeping 0.36 s
  waits = v.verify(TASK, _block("import time\n" + slow_fn))
  assert waits.score == 1.0 and waits.details["wall_s"] > 2.5, waits.details
