"""Value codec between the code harness and the candidate process (stdlib only).

Shipped as source into the sandbox and prepended to harness_parent.py and
harness_runner.py (which run under `python3 -I`, so they cannot import it).
Only plain data crosses: None, bool, int, float (nan/inf too), str, bytes,
list, tuple, dict, set, frozenset, nested up to MAX_DEPTH. Anything else (an
object with a rigged __eq__, a generator, ...) cannot be encoded, so the call
fails instead of handing the tests an object that lies.
"""

import base64 as _b64
import json as _json
import math as _math

MAX_DEPTH = 64
MAX_MESSAGE = 16 << 20


class CodecError(Exception):
  pass


def encode(x, depth=0):
  if depth > MAX_DEPTH:
    raise CodecError("value nested too deeply")
  t = type(x)
  if x is None or t is bool or t is int or t is str:
    return x
  if t is float:
    return x if _math.isfinite(x) else {"$f": repr(x)}
  if t is list:
    return [encode(v, depth + 1) for v in x]
  if t is tuple:
    return {"$t": [encode(v, depth + 1) for v in x]}
  if t is dict:
    return {"$d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in x.items()]}
  if t is set:
    return {"$s": [encode(v, depth + 1) for v in x]}
  if t is frozenset:
    return {"$fs": [encode(v, depth + 1) for v in x]}
  if t is bytes:
    return {"$b": _b64.b64encode(x).decode()}
  raise CodecError("cannot pass a value of type " + t.__name__)


def decode(x, depth=0):
  if depth > MAX_DEPTH:
    raise CodecError("value nested too deeply")
  t = type(x)
  if x is None or t in (bool, int, float, str):
    return x
  if t is list:
    return [decode(v, depth + 1) for v in x]
  if t is dict and len(x) == 1:
    (k, v), = x.items()
    if k == "$f" and v in ("nan", "inf", "-inf"):
      return float(v)
    if k == "$t" and type(v) is list:
      return tuple(decode(e, depth + 1) for e in v)
    if k == "$d" and type(v) is list:
      out = {}
      for pair in v:
        if type(pair) is not list or len(pair) != 2:
          raise CodecError("bad dict item")
        out[decode(pair[0], depth + 1)] = decode(pair[1], depth + 1)
      return out
    if k == "$s" and type(v) is list:
      return set(decode(e, depth + 1) for e in v)
    if k == "$fs" and type(v) is list:
      return frozenset(decode(e, depth + 1) for e in v)
    if k == "$b" and type(v) is str:
      return _b64.b64decode(v)
  raise CodecError("bad encoded value")


def send(f, obj):
  f.write(_json.dumps(obj).encode() + b"\n")
  f.flush()


def recv_line(f):
  line = f.readline(MAX_MESSAGE + 1)
  if not line:
    raise EOFError("peer closed")
  if len(line) > MAX_MESSAGE:
    raise CodecError("message too large")
  return _json.loads(line)
