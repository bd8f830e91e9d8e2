"""Shared by the sandbox tests: a pool on its own runsc state root, and the
host-side leftover check (processes, containers, bundles) for that root."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile

from rlpt import sandbox
from rlpt.sandbox import bundle

try:
  bundle.runsc_path()
  HAVE_RUNSC = True
except sandbox.RunscNotFound:
  HAVE_RUNSC = False


def leftovers(state: str) -> list[str]:
  """Everything of ours still on the host for state dir `state`: processes whose
  command line names it, containers runsc still lists, bundle directories."""
  out = []
  ps = subprocess.run(["pgrep", "-fa", state], capture_output=True, text=True)
  out += [f"process: {line}" for line in ps.stdout.splitlines() if "pgrep" not in line]
  root = os.path.join(state, "state")
  if os.path.isdir(root):
    ls = subprocess.run(bundle.runsc_argv("list", "-quiet", root=root), capture_output=True,
                        text=True)
    out += [f"container: {c}" for c in ls.stdout.split()]
  bundles = os.path.join(state, "bundles")
  if os.path.isdir(bundles):
    out += [f"bundle: {b}" for b in os.listdir(bundles)]
  return out


@contextlib.contextmanager
def isolated_pool(size: int):
  """A SandboxPool whose containers live under a fresh state dir; on exit the pool
  is closed and the host must hold nothing of it (asserted)."""
  state = tempfile.mkdtemp(prefix="rlpt-sbx-test-")
  old = os.environ.get("RLPT_SANDBOX_DIR")
  os.environ["RLPT_SANDBOX_DIR"] = state
  pool = sandbox.SandboxPool(size)
  try:
    yield pool, state
  finally:
    pool.close()
    if old is None:
      os.environ.pop("RLPT_SANDBOX_DIR", None)
    else:
      os.environ["RLPT_SANDBOX_DIR"] = old
    left = leftovers(state)
    shutil.rmtree(state, ignore_errors=True)
    assert not left, f"sandbox left things behind on the host: {left}"


def crash_sandbox(cid: str) -> None:
  """SIGKILLs the host processes of container `cid` behind runsc's back, as a
  crashed sentry would die."""
  for d in bundle.cgroup_dirs(cid):
    if "/pids/" in d:
      with open(os.path.join(d, "cgroup.procs")) as f:
        for pid in f.read().split():
          try:
            os.kill(int(pid), signal.SIGKILL)
          except ProcessLookupError:
            pass
