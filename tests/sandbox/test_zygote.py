"""pid 1's zygote: `python3` programs run in a fork of a warm interpreter must
behave exactly as a fresh `python3` (compared run by run on real runsc), and
nothing of one run may reach the next."""

from __future__ import annotations

import os

import pytest

import sandbox_helpers
from rlpt import sandbox
from rlpt.sandbox import zygote

EXE = "/venv/bin/python3"
BOOT = {"PATH": "/venv/bin:/usr/bin", "HOME": "/sandbox", "LANG": "C.UTF-8"}


@pytest.fixture
def venv(tmp_path, monkeypatch):
  """A PATH whose python3 is EXE's stand-in, and a cwd holding t.py."""
  bindir = tmp_path / "bin"
  bindir.mkdir()
  exe = bindir / "python3"
  exe.write_text("")
  exe.chmod(0o755)
  (tmp_path / "t.py").write_text("")
  monkeypatch.chdir(tmp_path)
  return str(exe), {**BOOT, "PATH": f"{bindir}:/usr/bin"}


def test_python_plan_takes_only_what_python3_would_run_the_same(venv):
  exe, env = venv
  plan = lambda cmd, **kw: zygote.python_plan(cmd, {**env, **kw}, exe, env)
  assert plan(["python3", "t.py", "a"]) == ("file", "t.py", ["t.py", "a"])
  assert plan([exe, "t.py"]) == ("file", "t.py", ["t.py"])
  assert plan(["python3", "-c", "print(1)", "x"]) == ("-c", "print(1)", ["-c", "x"])
  assert plan(["python3", "-m", "json.tool", "f"]) == ("-m", "json.tool", ["-m", "f"])
  # Everything else goes to a real, exec'd interpreter.
  assert plan(["python3", "missing.py"]) is None  # python3's own "can't open file"
  assert plan(["python3", "-u", "t.py"]) is None and plan(["python3", "-"]) is None
  assert plan(["python3"]) is None and plan(["python3", "-c"]) is None
  assert plan(["python3", "t.py"], PYTHONPATH="/x") is None
  assert plan(["python3", "t.py"], LANG="C") is None
  assert plan(["python3", "t.py"], LC_ALL="C.UTF-8") is None
  assert plan(["python3", "t.py"], PATH="/usr/bin") is None  # another python3
  assert plan(["python", "t.py"]) is None  # not the interpreter pid 1 is
  assert plan(["sh", "t.py"]) is None


@pytest.mark.parametrize("code,want,err", [(None, 0, ""), (3, 3, ""), (256 + 7, 7, ""),
                                           ("bye", 1, "bye\n"), (True, 1, "")])
def test_exit_code_of_matches_python3(code, want, err, capsys):
  assert zygote.exit_code_of(SystemExit(code)) == want
  assert capsys.readouterr().err == err


# ---- real sandboxes ------------------------------------------------------------------

pytestmark_runsc = pytest.mark.skipif(not sandbox_helpers.HAVE_RUNSC,
                                      reason="runsc not installed")

# Prints whether it ran in the zygote (pid 1's frozen objects) on the last line of stderr.
WHERE = ("import gc as _gc, sys as _sys, atexit as _ax\n"
         "_ax.register(lambda: print('zygote' if _gc.get_freeze_count() else 'exec', "
         "file=_sys.stderr))\n")

PROGRAMS = {
    "exit_3": "import sys\nprint('out')\nsys.exit(3)\n",
    "exit_msg": "import sys\nsys.exit('bye')\n",
    "exit_none": "raise SystemExit\n",
    "exception": "def f():\n  raise ValueError('boom')\nprint('before')\nf()\n",
    "keyboard_interrupt": "raise KeyboardInterrupt\n",
    "identity": ("import os, sys\nprint(__name__, globals().get('__file__'), sys.argv, sys.path[0], os.getcwd(), "
                 "sys.orig_argv, __spec__, type(__loader__).__name__)\n"
                 "print(sorted(k for k in globals() if not k.startswith('_') or k in "
                 "('__builtins__', '__cached__', '__annotations__')))\n"
                 "print(sys.executable, sys.prefix, sys.flags.utf8_mode, sys.getdefaultencoding(), "
                 "sys.stdout.encoding, sys.stdout.errors, sys.stdin.read(), os.getuid())\n"
                 "print(sorted(os.environ.items()))\n"),
    "imports": ("import numpy, random, json\n"
                "print(numpy.arange(4).sum(), json.dumps([1]), type(random.random()).__name__)\n"),
    "threads_and_atexit": ("import atexit, threading, time\n"
                           "atexit.register(lambda: print('atexit ran'))\n"
                           "def late():\n  time.sleep(0.2)\n  print('thread done', flush=True)\n"
                           "threading.Thread(target=late).start()\nprint('main done')\n"),
    "unflushed": "import sys\nsys.stdout.write('no newline')\nsys.stderr.write('e')\n",
    "local_import": "import helper\nprint(helper.X)\n",
    "stdin_is_empty": "x = input()\n",
    "multiprocessing": ("import multiprocessing as mp\ndef sq(x):\n  return x * x\n"
                        "if __name__ == '__main__':\n  with mp.Pool(2) as p:\n"
                        "    print(p.map(sq, range(5)))\n"),
}


def _cmds(name: str) -> list[tuple[list[str], dict]]:
  """(cmd, files) forms of program `name`: as a script, and (for the short ones)
  with -c."""
  src = WHERE + PROGRAMS[name]
  files = {"t.py": src, "helper.py": "X = 'helper here'\n"}
  out = [(["python3", "t.py", "arg 1", "-x"], files)]
  if name in ("exit_3", "exception", "identity"):
    out.append((["python3", "-c", src, "a"], {"helper.py": files["helper.py"]}))
  return out


@pytest.fixture(scope="module")
def pool():
  if not sandbox_helpers.HAVE_RUNSC:
    pytest.skip("runsc not installed")
  with sandbox_helpers.isolated_pool(1) as (p, _):
    p.reuse = 1000
    p.warm(wait=True)
    yield p


@pytestmark_runsc
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_zygote_run_is_what_python3_gives(pool, name):
  for cmd, files in _cmds(name):
    env = {"SEED": "7"}
    got = pool.run(files, cmd, env=env, timeout_s=30)
    # PYTHONNOUSERSITE (a no-op in this venv) sends the same run to a real python3.
    ref = pool.run(files, cmd, env={**env, "PYTHONNOUSERSITE": "1"}, timeout_s=30)
    assert got.stderr.endswith("zygote\n") and ref.stderr.endswith("exec\n"), (got, ref)
    ref_out = ref.stdout.replace(", ('PYTHONNOUSERSITE', '1')", "")
    assert (got.status, got.exit_code, got.stdout) == (ref.status, ref.exit_code, ref_out), (
        cmd, got, ref)
    assert got.stderr[:-len("zygote\n")] == ref.stderr[:-len("exec\n")], (cmd, got, ref)


@pytestmark_runsc
def test_zygote_exit_codes_and_tracebacks(pool):
  """The comparison above, pinned to python3's known answers."""
  r = pool.run({"t.py": PROGRAMS["exception"]}, ["python3", "t.py"])
  assert (r.status, r.exit_code, r.stdout) == ("error", 1, "before\n"), r
  assert r.stderr.startswith("Traceback (most recent call last):\n  File \"/sandbox/t.py\", "
                             "line 4, in <module>\n"), r.stderr
  assert r.stderr.endswith("ValueError: boom\n") and "zygote" not in r.stderr, r.stderr
  r = pool.run({"t.py": "def (:\n"}, ["python3", "t.py"])
  assert r.exit_code == 1 and "Traceback" not in r.stderr and "SyntaxError" in r.stderr, r
  r = pool.run({}, ["python3", "-c", "import sys; sys.exit(5)"])
  assert (r.status, r.exit_code) == ("error", 5), r
  r = pool.run({"t.py": PROGRAMS["keyboard_interrupt"]}, ["python3", "t.py"])
  assert r.exit_code == -2 and "KeyboardInterrupt" in r.stderr, r
  r = pool.run({}, ["python3", "-m", "json.tool", "--help"])
  assert r.status == "ok" and "usage:" in r.stdout, r


POLLUTE = r'''
import builtins, json, os, sys, random, site
json.LEAK = builtins.LEAK = site.LEAK = 1
os.environ["LEAK"] = "1"
sys.path.append("/leak")
sys.modules["leakmod"] = sys
sys.argv.append("leak")
open("/tmp/leak", "w").write("x")
open("leak.txt", "w").write("x")
print(random.random())
'''

CHECK = r'''
import builtins, json, os, sys, random, site
print([m for m in (json, builtins, site) if hasattr(m, "LEAK")], "LEAK" in os.environ,
      "/leak" in sys.path, "leakmod" in sys.modules, sys.argv, os.listdir("/tmp"),
      sorted(os.listdir(".")))
print(random.random())
'''


@pytestmark_runsc
def test_nothing_of_a_run_reaches_the_next_one_in_the_same_container(pool):
  boots = pool.stats.boots
  a = pool.run({"p.py": POLLUTE}, ["python3", "p.py"])
  b = pool.run({"c.py": CHECK}, ["python3", "c.py"])
  assert pool.stats.boots == boots, "the two runs did not share a container"
  assert a.status == "ok" and b.status == "ok", (a, b)
  assert b.stdout.splitlines()[0] == "[] False False False ['c.py'] [] ['c.py']", b.stdout
  # `random` is imported fresh in every run, so it is seeded afresh.
  assert a.stdout.split()[-1] != b.stdout.split()[-1]


@pytestmark_runsc
def test_a_forged_trailer_does_not_end_the_run(pool):
  src = ("import sys, time\n"
         "for n in ('0' * 16, 'f' * 16):\n"
         "  sys.stderr.write('\\0rlpt-exit:%s:0\\0\\0rlpt-run:%s\\0' % (n, n))\n"
         "sys.stderr.flush()\ntime.sleep(0.3)\nprint('still here')\nsys.exit(4)\n")
  r = pool.run({"t.py": src}, ["python3", "t.py"])
  assert (r.status, r.exit_code, r.stdout) == ("error", 4, "still here\n"), r
  nxt = pool.run({}, ["python3", "-c", "print('next')"])
  assert (nxt.status, nxt.stdout, nxt.stderr) == ("ok", "next\n", ""), nxt


@pytestmark_runsc
def test_pid1_is_out_of_reach_of_a_zygote_run(pool):
  src = ("import os, signal\n"
         "for p in ('/proc/1/mem', '/proc/1/fd/0', '/proc/1/fd/1'):\n"
         "  try:\n    open(p, 'rb').read(1)\n    print('READ', p)\n"
         "  except OSError as e:\n    print('blocked', e.errno)\n"
         "try:\n  os.kill(1, signal.SIGKILL)\nexcept OSError as e:\n  print('kill', e.errno)\n"
         "try:\n  print(sorted(open('/proc/1/environ').read().split('\\0')))\n"
         "except OSError as e:\n  print([])\n"
         "print(sorted(os.listdir('/proc/self/fd')), os.getuid(), os.geteuid())\n")
  r = pool.run({"t.py": src}, ["python3", "t.py"])
  assert r.status == "ok", r
  lines = r.stdout.splitlines()
  assert lines[:4] == ["blocked 13"] * 3 + ["kill 1"], r.stdout  # EACCES, EPERM
  # gVisor lets a program read pid 1's environment: only the public default one.
  assert eval(lines[4]) in ([], sorted([""] + [f"{k}={v}" for k, v in  # noqa: S307
                                               sandbox.default_env().items()])), lines[4]
  # Only stdin (/dev/null), stdout, stderr, and the listdir's own descriptor.
  assert lines[5] == "['0', '1', '2', '3'] 65534 65534", r.stdout
  assert pool.run({}, ["python3", "-c", "print(1)"]).stdout == "1\n"


def test_zygote_source_is_what_pid1_runs():
  from rlpt.sandbox import launcher  # noqa: PLC0415
  with open(os.path.join(os.path.dirname(zygote.__file__), "zygote.py")) as f:
    assert launcher.SOURCE == f.read()
  assert sandbox.default_env() == {"PATH": sandbox.default_env()["PATH"], "HOME": "/sandbox",
                                   "LANG": "C.UTF-8"}
