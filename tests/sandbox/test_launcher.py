"""The launcher's wire format: request validation and the exit trailer."""

import json

import pytest

from rlpt.sandbox import launcher


@pytest.mark.parametrize("name", ["/etc/passwd", "../x", "a/../../x", "", "a//b", "d/", "a\x00b"])
def test_check_files_rejects_paths_outside_the_workdir(name):
  with pytest.raises(ValueError, match="sandbox file name"):
    launcher.check_files({name: "x"})


def test_check_files_rejects_non_text_and_accepts_subdirs():
  with pytest.raises(ValueError, match="'a.py' must be str, got bytes"):
    launcher.check_files({"a.py": b"x"})
  with pytest.raises(ValueError, match="dict"):
    launcher.check_files([("a", "b")])
  launcher.check_files({"pkg/mod.py": "x = 1", "a.py": ""})


def test_encode_request_validates_cmd_and_env():
  with pytest.raises(ValueError, match="cmd must be a non-empty list"):
    launcher.encode_request({}, [], {}, {})
  with pytest.raises(ValueError, match="cmd must be a non-empty list"):
    launcher.encode_request({}, "python3 a.py", {}, {})
  with pytest.raises(ValueError, match="env entry 'A=B'"):
    launcher.encode_request({}, ["true"], {"A=B": "1"}, {})
  frame = launcher.encode_request({"a": "b"}, ["true"], {"K": "v"}, {"RLIMIT_CPU": 3}, uid=7)
  assert int(frame[:16], 16) == len(frame) - 16
  assert json.loads(frame[16:]) == {
      "files": {"a": "b"}, "cmd": ["true"], "env": {"K": "v"}, "rlimits": {"RLIMIT_CPU": 3},
      "uid": 7, "session": False, "reset": False}
  body = json.loads(launcher.encode_request({}, ["true"], {}, {}, session=True, reset=True)[16:])
  assert body["session"] is True and body["reset"] is True


def test_launcher_args_run_the_zygote_source():
  args = launcher.launcher_args("/venv/bin/python3", disk_mb=16)
  assert args[:2] == ["/venv/bin/python3", "-c"] and "def serve(conf)" in args[2]
  assert json.loads(args[3]) == {"disk_mb": 16, "workdir": "/sandbox",
                                 "tmpfs": ["/sandbox", "/tmp", "/dev/shm"]}


NONCE = b"0123456789abcdef"


def test_run_stderr_ends_at_the_trailer_with_the_markers_nonce():
  stream = (b"runsc says hi\n\x00rlpt-run:" + NONCE + b"\x00Traceback...\n"
            b"\x00rlpt-exit:" + NONCE + b":-9\x00\x00rlpt-run:fedcba9876543210\x00")
  r = launcher.RunStderr(stream)
  assert (r.nonce, r.code, bytes(r.err)) == (NONCE, -9, b"runsc says hi\nTraceback...\n")
  nxt = launcher.RunStderr(r.rest)  # the next run starts from what followed
  assert nxt.nonce == b"fedcba9876543210" and nxt.code is None and nxt.err == b""


def test_run_stderr_ignores_forged_trailers_and_takes_bytes_one_at_a_time():
  body = (b"\x00rlpt-exit:" + b"f" * 16 + b":0\x00"  # a trailer with a guessed nonce
          b"\x00rlpt-run:" + b"e" * 16 + b"\x00"  # a second marker: program output
          b"more\x00rlpt-exit:" + NONCE + b":3\x00")
  r = launcher.RunStderr()
  for i, b in enumerate(b"\x00rlpt-run:" + NONCE + b"\x00" + body):
    assert r.code is None, i
    r.feed(bytes([b]))
  assert r.code == 3 and bytes(r.err) == body[:-len(b"\x00rlpt-exit:" + NONCE + b":3\x00")]
  assert launcher.RunStderr(b"no marker\x00rlpt-exit:" + NONCE + b":0\x00").code is None
