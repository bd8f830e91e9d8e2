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
    launcher.encode_request({}, [], {}, {}, "00")
  with pytest.raises(ValueError, match="cmd must be a non-empty list"):
    launcher.encode_request({}, "python3 a.py", {}, {}, "00")
  with pytest.raises(ValueError, match="env entry 'A=B'"):
    launcher.encode_request({}, ["true"], {"A=B": "1"}, {}, "00")
  frame = launcher.encode_request({"a": "b"}, ["true"], {"K": "v"}, {"RLIMIT_CPU": 3}, "ab",
                                  uid=7, disk_mb=5)
  assert int(frame[:16], 16) == len(frame) - 16
  assert json.loads(frame[16:]) == {
      "files": {"a": "b"}, "cmd": ["true"], "env": {"K": "v"}, "rlimits": {"RLIMIT_CPU": 3},
      "uid": 7, "nonce": "ab", "disk_mb": 5, "workdir": "/sandbox",
      "tmpfs": ["/sandbox", "/tmp", "/dev/shm"]}


def test_split_trailer_needs_the_right_nonce_at_the_very_end():
  err = b"Traceback...\n" + b"\x00rlpt-exit:beef:-9\x00"
  assert launcher.split_trailer(err, "beef") == (b"Traceback...\n", -9)
  assert launcher.split_trailer(err, "cafe") == (err, None)  # forged by the program
  assert launcher.split_trailer(err + b"more", "beef") == (err + b"more", None)
  assert launcher.split_trailer(b"\x00rlpt-exit:beef:3\x00", "beef") == (b"", 3)
