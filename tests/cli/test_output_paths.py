"""Output paths (docs/headless.md, "Output files"): what the user names is written into, never replaced, and
every output is checked before any work starts."""

from __future__ import annotations

import json
import os
import resource
import stat
import subprocess
import sys
import threading

import pytest
from click.testing import CliRunner

from batchtop.tui.cli import main

RUN = ["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--workload", "synthetic",
       "--num-requests", "4", "--prompt-mean", "4", "--output-mean", "4"]


def invoke(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def test_a_symlinked_output_is_followed_and_stays_a_symlink(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    result = invoke(["--headless", *RUN, "-o", str(link)])
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["schema"] == "batchtop.metrics/1"


def test_an_existing_files_permission_bits_survive_the_atomic_replace(tmp_path):
    out = tmp_path / "m.json"
    out.write_text("old")
    out.chmod(0o640)
    assert invoke(["--headless", *RUN, "-o", str(out)]).exit_code == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o640 and json.loads(out.read_text())["complete"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]  # no temporary file left behind


def _read_fifo(path, into: list) -> threading.Thread:
    def read():
        with open(path, encoding="utf-8") as f:
            into.append(f.read())
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("option", ["-o", "--record"])
def test_a_fifo_is_written_into_not_replaced(tmp_path, option):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = _read_fifo(fifo, got)
    args = ["--headless", *RUN, option, str(fifo)] + (["-o", str(tmp_path / "m.json")] if option == "--record" else [])
    result = invoke(args)
    reader.join(timeout=30)
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced by a regular file"
    first = got[0].splitlines()[0] if option == "--record" else got[0]
    assert "batchtop" in json.loads(first).get("schema", json.loads(first).get("format", ""))


def test_process_substitution_style_dev_fd_paths_are_written_into(tmp_path):
    read_end, write_end = os.pipe()
    proc = subprocess.run([sys.executable, "-m", "batchtop.tui", "--headless", *RUN, "-o", f"/dev/fd/{write_end}"],
                          pass_fds=(write_end,), capture_output=True, text=True, timeout=120)
    os.close(write_end)
    with os.fdopen(read_end, encoding="utf-8") as f:
        doc = json.loads(f.read())
    assert proc.returncode == 0, proc.stderr
    assert doc["schema"] == "batchtop.metrics/1" and proc.stdout == ""


@pytest.mark.parametrize("option", ["-o", "--record"])
def test_a_read_only_file_is_refused_before_the_run_and_kept(tmp_path, option):
    path = tmp_path / "keep.json"
    path.write_text("precious")
    path.chmod(0o444)  # refused even for root, who could write it
    result = invoke(["--headless", *RUN, option, str(path)])
    assert result.exit_code == 2
    assert f"{'--output' if option == '-o' else '--record'}: {path} is read-only" in result.output
    assert "building" not in result.output  # refused before the model was built
    assert path.read_text() == "precious"


@pytest.mark.parametrize("args, clash", [
    (["-o", "{d}/same", "--record", "{d}/same"], "--record"),
    (["-o", "{d}/w.jsonl", "--workload", "{d}/w.jsonl"], "--output"),
    (["-o", "{d}/link", "--workload", "{d}/w.jsonl"], "--output"),  # the same file through a symlink
    (["--record", "{d}/./w.jsonl", "--workload", "{d}/w.jsonl"], "--record"),
])
def test_an_output_that_is_another_output_or_an_input_is_refused_before_the_run(tmp_path, args, clash):
    workload = tmp_path / "w.jsonl"
    workload.write_text('{"prompt_len": 3, "max_tokens": 2}\n')
    (tmp_path / "link").symlink_to(workload)
    base = [a for a in RUN if a not in ("--workload", "synthetic")] if "--workload" in args else RUN
    result = invoke(["--headless", *base, *(a.format(d=tmp_path) for a in args)])
    assert result.exit_code == 2, result.output
    assert f"Error: {clash}:" in result.output and "is the same file as" in result.output
    assert workload.read_text() == '{"prompt_len": 3, "max_tokens": 2}\n'


def test_dev_null_takes_every_output(tmp_path):
    result = invoke(["--headless", *RUN, "-o", os.devnull, "--record", os.devnull])
    assert result.exit_code == 0, result.output
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_replay_refuses_to_write_its_metrics_over_the_trace_it_reads(tmp_path):
    trace = tmp_path / "t.jsonl"
    assert invoke(["--headless", *RUN, "--record", str(trace), "-o", str(tmp_path / "m.json")]).exit_code == 0
    before = trace.read_bytes()
    result = invoke(["replay", str(trace), "--headless", "-o", str(trace)])
    assert result.exit_code == 2 and "is the same file as TRACE" in result.output
    assert trace.read_bytes() == before


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))  # writes past 1 KiB fail with EFBIG


def test_a_write_that_fails_after_the_run_names_the_path_exits_1_and_keeps_the_metrics(tmp_path):
    out = tmp_path / "m.json"
    proc = subprocess.run([sys.executable, "-m", "batchtop.tui", "--headless", *RUN, "-o", str(out)],
                          capture_output=True, text=True, timeout=120, preexec_fn=_limit_file_size,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert proc.returncode == 1, proc.stderr
    assert f"Error: cannot write {out}" in proc.stderr
    start = proc.stderr.index("{\n")
    doc, _ = json.JSONDecoder().raw_decode(proc.stderr[start:])  # the whole document, on stderr
    assert doc["schema"] == "batchtop.metrics/1" and doc["requests"]["completed"] == 4
    assert not out.exists()  # nothing half-written where the user looks


def test_a_closed_stdout_pipe_keeps_the_metrics_on_stderr():
    proc = subprocess.Popen([sys.executable, "-m", "batchtop.tui", "--headless", *RUN],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the reader is gone before the run ends, as in `batchtop --headless | head -0`
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 1, err
    assert "Error: cannot write stdout" in err and '"schema": "batchtop.metrics/1"' in err
    assert "Exception ignored" not in err and "Traceback" not in err


async def test_a_screenshot_is_a_new_file_never_one_already_there(tmp_path, monkeypatch):
    from tests.tui.test_dashboard import make_app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("batchtop.tui.screenshot.time.strftime", lambda fmt: "STAMP")
    os.mkfifo(tmp_path / "batchtop_STAMP.svg")  # a FIFO with the name the screenshot would take
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("p")
        await pilot.pause()
    assert stat.S_ISFIFO(os.lstat(tmp_path / "batchtop_STAMP.svg").st_mode)
    assert (tmp_path / "batchtop_STAMP-1.svg").read_text().startswith("<svg")


def test_stdout_takes_one_output_whatever_it_is_called(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "batchtop.tui", "--headless", *RUN, "--record", "/dev/stdout"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--record: /dev/stdout is the same file as --output -" in proc.stderr
    result = invoke(["--headless", *RUN, "--record", "-"])
    assert result.exit_code == 2 and "--record: '-' would mix the trace into stdout" in result.output
    assert not (tmp_path / "-").exists()


@pytest.fixture(scope="module")
def a_trace(tmp_path_factory) -> str:
    trace = tmp_path_factory.mktemp("trace") / "t.jsonl"
    assert invoke(["--headless", *RUN, "--record", str(trace), "-o", os.devnull]).exit_code == 0
    return str(trace)


def _commands(trace: str) -> dict[str, list[str]]:
    """Every command with an output option, before its own output options (issue 29: each of these ran
    its whole job, then failed on an empty path)."""
    return {"headless": ["--headless", *RUN], "compare": ["compare", *RUN],
            "replay": ["replay", trace, "--headless"], "calibrate": ["calibrate", "--from-trace", trace],
            "attach": ["attach", "http://127.0.0.1:9", "--headless", "--duration", "0.2", "--interval", "0.1"]}


@pytest.mark.parametrize("command,option", [("headless", "-o"), ("headless", "--record"), ("compare", "-o"),
                                            ("replay", "-o"), ("calibrate", "-o"), ("attach", "-o"),
                                            ("attach", "--record")])
@pytest.mark.parametrize("path", ["", "{d}/new-folder/"], ids=["empty", "trailing-slash"])
def test_an_empty_path_or_one_naming_a_missing_folder_exits_2_before_any_work(tmp_path, a_trace, command, option,
                                                                             path):
    args = _commands(a_trace)[command]
    result = CliRunner().invoke(main, [*args, option, path.format(d=tmp_path)])
    assert result.exit_code == 2, result.output
    long_option = "--output" if option == "-o" else option
    says = "the path is empty: name a file" if not path else "names a directory (it ends in /) that does not exist"
    assert f"Error: {long_option}: " in result.output and says in result.output
    assert "building" not in result.output and "measuring" not in result.output
    assert not (tmp_path / "new-folder").exists()
