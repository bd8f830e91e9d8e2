"""The code harness: the sandbox's main process (stdlib only; the codec is prepended).

    python3 -I harness.py

Reads job.json (the instrumented tests, the trusted prelude, the entry point,
the run's nonce, the CPU and wall budgets) and deletes it before any candidate code
exists, makes itself non-dumpable (no /proc/<pid>/mem or ptrace from the
candidate's uid), and starts the candidate in a separate process
(`python3 -I runner.py`). The tests run here, calling the candidate through a
proxy that only ever receives plain data; every executed assert appends a
(line, passed) record here. At the end every other process this uid owns is
SIGKILLed, and one line "<nonce> <json>" is printed: the only line the
verifier reads.

The tests are stopped ("timeout") when the candidate process and the harness
together have used `budget_s` CPU seconds, or when `wall_s` seconds have passed
(a candidate that sleeps or blocks). CPU time makes the verdict a property of the
program, not of how loaded the machine is: a solution that needs 4 CPU seconds
passes whether it gets one core or a tenth of one.
"""

import ctypes as _ctypes
import json as _json
import os as _os
import select as _select
import signal as _signal
import subprocess as _subprocess
import sys as _sys
import time as _time


class CandidateError(Exception):
  """The candidate raised, returned something unencodable, died or overran."""


class _Timeout(BaseException):
  pass


def _main():
  with open("job.json") as f:
    job = _json.load(f)
  _os.unlink("job.json")
  try:
    _ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
  except Exception:  # noqa: BLE001
    pass
  nonce = job["nonce"]
  cpu_budget = float(job["budget_s"])
  deadline = _time.monotonic() + float(job.get("wall_s", cpu_budget))
  tick = float(_os.sysconf("SC_CLK_TCK"))
  records = []
  out = {"records": records, "aborted": None, "load_error": None}
  child = _subprocess.Popen([_sys.executable, "-I", "runner.py", job["entry_point"]],
                            stdin=_subprocess.PIPE, stdout=_subprocess.PIPE,
                            stderr=_subprocess.DEVNULL, start_new_session=True)

  def cpu_used():
    """CPU seconds of this process and the candidate process (its reaped children too)."""
    try:
      with open("/proc/%d/stat" % child.pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
      child_s = sum(int(x) for x in fields[11:15]) / tick  # utime stime cutime cstime
    except (OSError, ValueError, IndexError):
      child_s = 0.0
    return _time.process_time() + child_s

  def read_reply():
    while True:
      left = deadline - _time.monotonic()
      if left <= 0 or cpu_used() >= cpu_budget:
        raise _Timeout()
      if _select.select([child.stdout], [], [], min(left, 0.05))[0]:
        break
    try:
      return recv_line(child.stdout)
    except Exception as e:  # noqa: BLE001 -- EOF (the candidate died) or garbage
      raise CandidateError("candidate process: " + type(e).__name__ + ": " + str(e)[:200])

  def candidate(*args, **kwargs):
    try:
      send(child.stdin, {"args": encode(list(args)), "kwargs": encode(dict(kwargs))})
    except (BrokenPipeError, OSError) as e:
      raise CandidateError("candidate process is gone: " + str(e))
    reply = read_reply()
    if type(reply) is not dict:
      raise CandidateError("bad reply")
    if reply.get("ok") is True:
      try:
        return decode(reply.get("value"))
      except CodecError as e:
        raise CandidateError("bad value: " + str(e))
    raise CandidateError(str(reply.get("error"))[:500])

  def record(line, passed):
    records.append([int(line), bool(passed)])

  try:
    ready = read_reply()
    if not (type(ready) is dict and ready.get("ready") is True):
      out["load_error"] = str(ready.get("error") if type(ready) is dict else ready)[:500]
    else:
      ns = {"__name__": "__rlpt_tests__", "__rlpt_record": record}
      exec(compile(job["prelude"], "<prelude>", "exec"), ns)
      exec(compile(job["tests"], "<tests>", "exec"), ns)
      ns[job["entry_point"]] = candidate  # tests that call the function by name get the proxy
      ns["check"](candidate)
  except _Timeout:
    out["aborted"] = "timeout"
  except CandidateError as e:
    out["aborted"] = "candidate: " + str(e)[:300]
  except BaseException as e:  # noqa: BLE001 -- a test statement outside the asserts failed
    out["aborted"] = type(e).__name__ + ": " + str(e)[:300]
  try:
    _os.kill(-1, _signal.SIGKILL)  # every process of this uid but this one
  except OSError:
    pass
  _sys.stdout.write("\n" + nonce + " " + _json.dumps(out) + "\n")
  _sys.stdout.flush()


_main()
