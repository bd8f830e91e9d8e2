"""ExecResult and Limits: statuses, retryability, validation."""

import pytest

from rlpt.sandbox import ExecResult, Limits, STATUSES


def test_only_infra_error_is_retryable():
  retry = {s: ExecResult(s, None, "", "", 0.0).retryable for s in STATUSES}
  assert retry == {"ok": False, "error": False, "timeout": False, "oom": False,
                   "output_limit": False, "infra_error": True}


def test_unknown_status_is_refused():
  with pytest.raises(ValueError, match="status must be one of"):
    ExecResult("crashed", None, "", "", 0.0)


@pytest.mark.parametrize("field,value", [("timeout_s", 0), ("memory_mb", -1), ("max_pids", True),
                                         ("max_output_bytes", "10")])
def test_limits_name_the_bad_field(field, value):
  with pytest.raises(ValueError, match=f"sandbox limit {field} must be a positive number"):
    Limits(**{field: value})


def test_spec_key_ignores_per_run_limits():
  a = Limits(timeout_s=1, max_output_bytes=10)
  b = Limits(timeout_s=99, max_output_bytes=1 << 20)
  assert a.spec_key == b.spec_key
  assert Limits(memory_mb=256).spec_key != a.spec_key
