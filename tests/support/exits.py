"""What every bad-input test checks of a CLI result: exit code 2, the message naming the thing that is
wrong, and no traceback."""

from __future__ import annotations


def assert_exit_2(result, *fragments: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
    for fragment in fragments:
        assert fragment in result.output, (fragment, result.output)
    assert "Traceback" not in result.output
