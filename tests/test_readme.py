"""README keeps exactly two set-up commands at its top, and CI runs the second one verbatim."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def setup_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.strip().splitlines()]


def test_readme_opens_with_an_install_and_run_command_and_a_test_command():
    commands = setup_commands()
    assert len(commands) == 2
    assert commands[0].startswith("pip install") and commands[0].endswith("batchtop")
    assert "[dev]" in commands[1] and "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    assert setup_commands()[1] in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_every_picture_and_recording_the_readme_shows_is_in_the_repo():
    import re
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([^)#:]+)\)", text)) | set(re.findall(r"`(examples/recordings/[^`\s]+)`", text))
    assert any(p.endswith(".gif") for p in linked) and any(p.endswith(".svg") for p in linked)
    assert [p for p in linked if not (ROOT / p).is_file()] == []
