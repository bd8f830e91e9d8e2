"""Runs inside the candidate process (stdlib only; the codec is prepended).

    python3 -I runner.py ENTRY_POINT

Loads candidate.py, then answers call requests from the harness over its
original stdin/stdout, one JSON line each. The candidate's own prints go to
/dev/null. Nothing here is trusted after the candidate's code has run: the
harness only accepts plain data back (see the codec) and checks every verdict
itself.
"""

import os as _os
import sys as _sys


def _main():
  proto_in = _os.fdopen(_os.dup(0), "rb")
  proto_out = _os.fdopen(_os.dup(1), "wb")
  null = _os.open(_os.devnull, _os.O_RDWR)
  for fd in (0, 1, 2):
    _os.dup2(null, fd)
  _sys.stdout = _sys.stderr = open(_os.devnull, "w")
  entry = _sys.argv[1]
  ns = {"__name__": "__main__", "__builtins__": __builtins__}
  try:
    with open("candidate.py") as f:
      src = f.read()
    exec(compile(src, "candidate.py", "exec"), ns)
    fn = ns[entry]
    if not callable(fn):
      raise TypeError(entry + " is not callable")
  except BaseException as e:  # noqa: BLE001 -- report, then stop
    send(proto_out, {"ready": False, "error": type(e).__name__ + ": " + str(e)[:500]})
    return
  send(proto_out, {"ready": True})
  while True:
    try:
      req = recv_line(proto_in)
    except EOFError:
      return
    try:
      args = decode(req["args"])
      kwargs = decode(req["kwargs"])
      value = fn(*args, **kwargs)
      reply = {"ok": True, "value": encode(value)}
    except BaseException as e:  # noqa: BLE001 -- SystemExit, KeyboardInterrupt included
      reply = {"ok": False, "error": type(e).__name__ + ": " + str(e)[:500]}
    send(proto_out, reply)


_main()
