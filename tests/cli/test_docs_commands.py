"""Every `batchtop ...` command the README and the docs show exists, with options it accepts.

The commands are read from the fenced code blocks of README.md and docs/*.md, split as a shell would
split them, and parsed against batchtop's click commands without running anything: the subcommand
must exist, every option must be one the command declares, an option that takes a value must get one
and a flag must not, and no stray arguments may be left over. Placeholders (FILE, DIR, URL, N) are
fine: values are not converted.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from batchtop.tui.cli import main

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~)\s*([\w-]*)")
SHELL_BLOCKS = {"", "bash", "sh", "shell", "console", "zsh"}  # a ```text tree or ```json is no command line
SHELL_OPERATORS = {"&&", "||", ";", "|", "&"}
REDIRECT = re.compile(r"^(&?[<>]+&?)$")  # `>`, `>>`, `<`, `>&`, `&>`: the next word is their target
FD_BEFORE_REDIRECT = re.compile(r"(?<=\s)\d+(?=[<>])")  # the 2 of `2> err.txt`
PROCESS_SUBSTITUTION = re.compile(r"[<>]\([^)]*\)")


@dataclass(frozen=True)
class Shown:
    """One batchtop command line as a page shows it."""

    page: str
    line: int
    args: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: batchtop {' '.join(self.args)}"


def fenced_lines(text: str) -> list[tuple[int, str]]:
    """(line number, logical line) inside fenced shell blocks, continuation lines joined."""
    out: list[tuple[int, str]] = []
    inside, shell, pending, start = False, False, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line.strip())
        if fence:
            inside, pending = not inside, ""
            shell = inside and fence.group(2).lower() in SHELL_BLOCKS
            continue
        if not shell:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    return out


def shell_words(line: str) -> list[str]:
    """The words of one shell line, comments dropped, with operators as words of their own."""
    line = FD_BEFORE_REDIRECT.sub("", PROCESS_SUBSTITUTION.sub("FILE", line))
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError:  # not shell (an unbalanced quote in prose or JSON): nothing to check
        return []


def batchtop_commands(words: list[str]) -> list[list[str]]:
    """The argument lists of every batchtop invocation in the words, quoted ones included
    (`asciinema rec -c "batchtop --script teaching"`)."""
    found: list[list[str]] = []
    current: list[str] | None = None
    skip_next = False
    for word in words:
        if skip_next:
            skip_next = False
            continue
        if word in SHELL_OPERATORS:
            current = None
            continue
        if REDIRECT.match(word):
            skip_next = True
            continue
        if current is not None:
            current.append(word)
        elif word == "batchtop" or word.endswith("/batchtop"):
            current = []
            found.append(current)
        elif word.startswith("batchtop ") and word.count(" ") >= 1:
            found.extend(batchtop_commands(shell_words(word)))
    return found


def shown_commands() -> list[Shown]:
    out: list[Shown] = []
    for page in PAGES:
        for number, line in fenced_lines(page.read_text(encoding="utf-8")):
            for args in batchtop_commands(shell_words(line)):
                out.append(Shown(str(page.relative_to(ROOT)), number, tuple(args)))
    return out


def resolve(args: tuple[str, ...]) -> tuple[click.Command, str, list[str]]:
    """The command an argument list runs, its name, and the arguments left for it."""
    if args and args[0] in main.commands:
        return main.commands[args[0]], args[0], list(args[1:])
    return main, "batchtop", list(args)


def problems(shown: Shown) -> list[str]:
    """What is wrong with one shown command line; empty when click would accept it.

    Only click's parser runs: option names, values present or absent, positional arguments. No value
    is converted and no callback runs, so placeholders pass and nothing is executed."""
    command, name, rest = resolve(shown.args)
    if rest and not rest[0].startswith("-") and command is main:
        return [f"no such command {rest[0]!r} (commands: {', '.join(sorted(main.commands))})"]
    ctx = click.Context(command, info_name=name)
    try:
        values, leftover, _ = command.make_parser(ctx).parse_args(args=list(rest))
    except click.UsageError as exc:  # an unknown option, a flag given a value, an option missing its value
        return [exc.format_message()]
    found: list[str] = []
    if leftover:
        found.append(f"unexpected argument(s) {' '.join(leftover)}")
    options = declared_options(command)
    for param in command.params:
        value = values.get(param.name)
        if isinstance(param, click.Argument) and param.required and (value is None or param.value_is_missing(value)):
            found.append(f"missing argument {param.human_readable_name}")
        if isinstance(param, click.Option) and not param.is_flag:
            for word, following in zip(rest, rest[1:]):  # an option name where its value should be
                if word in param.opts and following in options:
                    found.append(f"{word} takes a value, got the option {following}")
    return found


def declared_options(command: click.Command) -> set[str]:
    names = {"--help", "-h"}
    for param in command.params:
        if isinstance(param, click.Option):
            names.update(param.opts, param.secondary_opts)
    return names


SHOWN = shown_commands()


def test_the_pages_show_every_batchtop_command():
    """The checks below see every command: the pages show each subcommand, and the dashboard."""
    used = {resolve(s.args)[1] for s in SHOWN}
    assert used >= {"batchtop", *main.commands}, f"never shown: {sorted({'batchtop', *main.commands} - used)}"


@pytest.mark.parametrize("name", ["batchtop", *sorted(main.commands)])
def test_every_command_the_pages_name_answers_help(name):
    args = ["--help"] if name == "batchtop" else [name, "--help"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


@pytest.mark.parametrize("shown", SHOWN, ids=str)
def test_every_command_line_the_pages_show_parses(shown):
    assert problems(shown) == [], str(shown)


@pytest.mark.parametrize("line, wrong", [
    ("batchtop compare --no-such-flag", "no such option"),
    ("batchtop --headless --max-num-seqs", "requires an argument"),
    ("batchtop frobnicate --headless", "no such command"),
    ("batchtop replay", "missing argument"),
    ("batchtop export-checkpoint DIR extra", "unexpected argument"),
    ("batchtop --record --headless", "takes a value"),
])
def test_a_wrong_command_line_is_caught(line, wrong):
    (args,) = batchtop_commands(shell_words(line))
    found = problems(Shown("test", 1, tuple(args)))
    assert any(wrong in p.lower() for p in found), found


def test_commands_are_found_inside_shell_lines():
    words = shell_words('flock /tmp/l batchtop compare -o c.json 2> err.txt && zcat x | batchtop replay - # note')
    assert batchtop_commands(words) == [["compare", "-o", "c.json"], ["replay", "-"]]
    assert batchtop_commands(shell_words('asciinema rec -c "batchtop --script teaching" t.cast')) == [
        ["--script", "teaching"]]
    assert batchtop_commands(shell_words("batchtop --workload <(zcat w.jsonl.gz) --headless")) == [
        ["--workload", "FILE", "--headless"]]
