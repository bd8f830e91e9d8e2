"""The geometry harness: the sandbox's main process (stdlib only).

    python3 -I harness.py

Reads job.json (nonce, time budget, output file name) and deletes it, makes
itself non-dumpable, runs the model's script.py in a separate process (its
output to /dev/null) until it exits or the budget runs out, SIGKILLs every
other process of its uid, and only then looks at the output file: a regular
file (not a link) of at most `max_bytes` is printed base64-encoded in one line
"<nonce> <json>". The verifier loads and checks the mesh outside the sandbox.
"""

import base64 as _b64
import ctypes as _ctypes
import json as _json
import os as _os
import signal as _signal
import stat as _stat
import subprocess as _subprocess
import sys as _sys


def _main():
  with open("job.json") as f:
    job = _json.load(f)
  _os.unlink("job.json")
  try:
    _ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
  except Exception:  # noqa: BLE001
    pass
  out = {"exit_code": None, "timed_out": False, "file": None, "size": 0, "error": None}
  null = _os.open(_os.devnull, _os.O_RDWR)
  try:
    child = _subprocess.Popen([_sys.executable, "-I", "script.py"], stdin=null, stdout=null,
                              stderr=null, start_new_session=True)
    try:
      out["exit_code"] = child.wait(timeout=float(job["budget_s"]))
    except _subprocess.TimeoutExpired:
      out["timed_out"] = True
  except Exception as e:  # noqa: BLE001
    out["error"] = type(e).__name__ + ": " + str(e)[:200]
  try:
    _os.kill(-1, _signal.SIGKILL)
  except OSError:
    pass
  try:
    st = _os.lstat(job["output"])
    if not _stat.S_ISREG(st.st_mode):
      out["error"] = "output is not a regular file"
    elif st.st_size > int(job["max_bytes"]):
      out["error"] = "output larger than %d bytes" % int(job["max_bytes"])
      out["size"] = st.st_size
    else:
      fd = _os.open(job["output"], _os.O_RDONLY | _os.O_NOFOLLOW)
      with _os.fdopen(fd, "rb") as f:
        data = f.read(int(job["max_bytes"]) + 1)
      out["size"] = len(data)
      out["file"] = _b64.b64encode(data).decode()
  except FileNotFoundError:
    out["error"] = "no output file"
  except Exception as e:  # noqa: BLE001
    out["error"] = type(e).__name__ + ": " + str(e)[:200]
  _sys.stdout.write("\n" + job["nonce"] + " " + _json.dumps(out) + "\n")
  _sys.stdout.flush()


_main()
