"""Our engine against Hugging Face transformers on the same model, weights, workload and max batch.

Measures generated tokens per second (wall clock of the whole workload, every request arriving at
t=0) for three systems, side by side in one run:

1. ours: core_engine.Engine in continuous mode (paged KV cache, chunked prefill);
2. HF continuous batching: transformers' ContinuousBatchingManager (`init_continuous_batching`),
   sdpa attention over its paged cache, per-request max_new_tokens, EOS disabled, sized like ours
   (same block size, KV pool, per-step token budget and max requests per step);
3. HF static: `model.generate()` on consecutive batches of max-batch requests (left padding); each
   batch runs to its longest request and only the tokens each request asked for are counted.

All three run the same model dims in bfloat16 with identical weights (our state_dict loaded into
transformers' LlamaForCausalLM), greedy decoding, exactly max_tokens per request, torch's default
thread count. Each system first runs the whole workload once, untimed (kernels for every step shape
are built on first use), and HF's manager thread runs only during HF's own passes; the timed runs are
interleaved round by round (--repeats) so background load hits all systems alike, and the table
reports the best and the median round. It also reports how often our greedy tokens equal HF's over
the first few tokens of every request (same weights, but bf16 rounding may flip near-ties).

Run (about five minutes on 2 CPU cores with the defaults):

    python bench/peer_hf.py
    python bench/peer_hf.py --num-requests 32 --repeats 1 --skip-static --profile
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, ContinuousBatchingConfig, GenerationConfig, LlamaConfig  # noqa: E402

from batchtop.core_engine.config import EngineConfig, preset  # noqa: E402
from batchtop.core_engine.engine.engine import Engine  # noqa: E402
from batchtop.core_engine.perf.metrics import MetricsCollector  # noqa: E402
from batchtop.core_engine.run.headless import run_workload  # noqa: E402
from batchtop.core_engine.sched.request import Request  # noqa: E402
from batchtop.core_engine.workload.spec import WorkloadSpec, load_workload  # noqa: E402

DTYPE = "bfloat16"
NO_EOS = -1  # transformers' continuous batching: a negative id means "no end-of-sequence token"
PAD_ID = 0  # any valid id: padded positions are masked out of attention
WARMUP_MAX_TOKENS = 8

Outputs = dict[str, list[int]]


@dataclass
class Timed:
    """One timed pass over the workload."""

    wall_s: float
    outputs: Outputs
    steps: int | None = None  # forward steps, where the system exposes them


@dataclass
class RunStats:
    """All timed passes of one system; tokens are the useful generated tokens of one pass."""

    name: str
    tokens: int
    note: str
    passes: list[Timed] = field(default_factory=list)

    @property
    def best_s(self) -> float:
        return min(p.wall_s for p in self.passes)

    @property
    def median_s(self) -> float:
        return statistics.median(p.wall_s for p in self.passes)

    @property
    def outputs(self) -> Outputs:
        return self.passes[0].outputs


# -- setup --------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="cpu-demo", help="core_engine preset (model dims)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--json", help="also write the results here (tok/s per system, best and median)")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--max-batch", type=int, default=16,
                   help="max sequences per step: our max_num_seqs, HF max_requests_per_batch, static batch size")
    p.add_argument("--max-batched-tokens", type=int, default=256,
                   help="token budget of one forward step (ours: max_num_batched_tokens, HF: max_batch_tokens)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (HF: page_size)")
    p.add_argument("--num-kv-blocks", type=int, default=2048, help="KV pool size in blocks (HF: num_blocks)")
    p.add_argument("--prompt-mean", type=float, default=64.0, help="lognormal mean prompt length")
    p.add_argument("--output-mean", type=float, default=64.0, help="lognormal mean output length")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=2, help="timed passes per system, interleaved")
    p.add_argument("--match-tokens", type=int, default=8, help="compare greedy outputs over this many tokens")
    p.add_argument("--skip-static", action="store_true", help="do not run HF static generate()")
    p.add_argument("--profile", action="store_true",
                   help="then profile one more pass of ours and of HF continuous batching (ms per step by op)")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.num_requests < 1 or args.max_batch < 1:
        p.error("--repeats, --num-requests and --max-batch must be >= 1")
    return args


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(model=preset(args.model), device=args.device, dtype=DTYPE, mode="continuous",
                        max_num_seqs=args.max_batch, max_num_batched_tokens=args.max_batched_tokens,
                        block_size=args.block_size, num_kv_blocks=args.num_kv_blocks, seed=args.seed)


def make_workload(args: argparse.Namespace, vocab_size: int) -> list[Request]:
    spec = WorkloadSpec(path="synthetic", num_requests=args.num_requests, prompt_mean=args.prompt_mean,
                        output_mean=args.output_mean, seed=args.seed)
    return load_workload(spec, vocab_size)


def warmup_requests(workload: list[Request], count: int = 2) -> list[Request]:
    """A couple of short requests (prompts borrowed from the workload) to warm a system up."""
    return [Request(f"warm{i}", r.prompt_token_ids, min(WARMUP_MAX_TOKENS, r.max_tokens))
            for i, r in enumerate(workload[:count])]


def renamed(requests: list[Request], tag: str) -> list[Request]:
    """The same requests under fresh ids (HF's manager keeps one id space for its whole life)."""
    return [Request(f"{tag}-{r.id}", r.prompt_token_ids, r.max_tokens) for r in requests]


def hf_model_from(engine: Engine) -> torch.nn.Module:
    """transformers' LlamaForCausalLM with our dims, dtype and exact weights; sdpa attention; no EOS."""
    m = engine.config.model
    config = LlamaConfig(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
        num_hidden_layers=m.num_hidden_layers, num_attention_heads=m.num_attention_heads,
        num_key_value_heads=m.num_key_value_heads, max_position_embeddings=m.max_position_embeddings,
        rope_theta=m.rope_theta, rms_norm_eps=m.rms_norm_eps, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False, bos_token_id=None, eos_token_id=None, pad_token_id=PAD_ID)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.load_state_dict(engine.runner.model.state_dict(), strict=True)  # rotary buffers are not persistent
    model.to(engine.config.device)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = PAD_ID
    return model.eval()


# -- ours ---------------------------------------------------------------------------------------
def timed_run(engine: Engine, requests: list[Request]) -> tuple[Timed, MetricsCollector]:
    """The whole workload through a fresh engine that shares the (warm) model and KV pool; also
    returns the run's metrics (its finished requests' latencies, its steps on the roofline)."""
    fresh = Engine(engine.config, runner=engine.runner)
    t0 = time.perf_counter()
    result = run_workload(fresh, requests)
    wall = time.perf_counter() - t0
    if not result.complete:
        raise RuntimeError(f"our engine did not complete: {result.error!r}")
    outputs = {f.request_id: list(f.output_token_ids) for f in result.collector.finished}
    return Timed(wall, outputs, result.collector.steps), result.collector


def ours_pass(engine: Engine, requests: list[Request]) -> Timed:
    return timed_run(engine, requests)[0]


# -- Hugging Face continuous batching -------------------------------------------------------------
def hf_cb_config(args: argparse.Namespace) -> ContinuousBatchingConfig:
    """Sized like our engine: same block size, pool capacity, per-step token budget and max batch."""
    wanted = dict(
        page_size=args.block_size,
        num_blocks=args.num_kv_blocks,
        max_batch_tokens=args.max_batched_tokens,
        max_requests_per_batch=args.max_batch,
        allow_block_sharing=False,  # random prompts share no prefix: block hashing would be pure overhead
        auto_switch_to_flash=False,  # keep sdpa (no flash-attn on CPU anyway)
        scheduler_type="fifo",
        seed=0,
    )
    # the fields' names move between releases: pass those this one has, and say which were left out
    have = set(getattr(ContinuousBatchingConfig, "__dataclass_fields__", {})) or set(
        inspect.signature(ContinuousBatchingConfig).parameters)
    missing = sorted(set(wanted) - have)
    if missing:
        print(f"note: this transformers' ContinuousBatchingConfig has no {', '.join(missing)}; left at its defaults")
    return ContinuousBatchingConfig(**{k: v for k, v in wanted.items() if k in have})


def hf_cb_manager(model: torch.nn.Module, args: argparse.Namespace):
    """A started ContinuousBatchingManager: greedy, no EOS; max_new_tokens is set per request."""
    gen = GenerationConfig(do_sample=False, eos_token_id=NO_EOS, pad_token_id=PAD_ID, max_new_tokens=1)
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=hf_cb_config(args))
    manager.start()
    return manager


def hf_cb_pass(manager, requests: list[Request]) -> Timed:
    """Submit every request at once (its own max_new_tokens, no EOS); wall clock until the last one ends."""
    first_step = getattr(manager, "current_batch", 0)  # set by the loop thread once it runs
    with manager.pause():  # every request is queued before the loop takes its first step
        for r in requests:
            manager.add_request(list(r.prompt_token_ids), request_id=r.id, max_new_tokens=r.max_tokens,
                                eos_token_id=NO_EOS)
        t0 = time.perf_counter()
    outputs: Outputs = {}
    while len(outputs) < len(requests):
        result = manager.get_result(timeout=120)
        if result is None:
            raise RuntimeError(f"HF continuous batching stalled after {len(outputs)}/{len(requests)} requests")
        if result.error is not None:
            raise RuntimeError(f"HF request {result.request_id} failed: {result.error}")
        if result.is_finished():
            outputs[result.request_id] = list(result.generated_tokens)
    return Timed(time.perf_counter() - t0, outputs, getattr(manager, "current_batch", 0) - first_step)


# -- Hugging Face static generate() ---------------------------------------------------------------
def left_padded(batch: list[Request]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(r.prompt_len for r in batch)
    ids = torch.full((len(batch), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, r in enumerate(batch):
        ids[row, width - r.prompt_len:] = torch.tensor(r.prompt_token_ids)
        mask[row, width - r.prompt_len:] = 1
    return ids, mask


def static_generate(model: torch.nn.Module, batch: list[Request]) -> Outputs:
    """One generate() call: the batch runs until its longest request is done; each keeps what it asked for."""
    ids, mask = left_padded(batch)
    max_new = max(r.max_tokens for r in batch)
    gen = GenerationConfig(do_sample=False, max_new_tokens=max_new, eos_token_id=None, pad_token_id=PAD_ID)
    new = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)[:, ids.shape[1]:]
    if new.shape[1] != max_new:
        raise RuntimeError(f"generate() stopped after {new.shape[1]} of {max_new} tokens")
    return {r.id: new[row, :r.max_tokens].tolist() for row, r in enumerate(batch)}


def static_pass(model: torch.nn.Module, requests: list[Request], max_batch: int) -> Timed:
    outputs: Outputs = {}
    steps = 0
    t0 = time.perf_counter()
    for start in range(0, len(requests), max_batch):
        batch = requests[start:start + max_batch]
        outputs.update(static_generate(model, batch))
        steps += max(r.max_tokens for r in batch)
    return Timed(time.perf_counter() - t0, outputs, steps)


# -- checks and report ----------------------------------------------------------------------------
def check_lengths(stats: RunStats, requests: list[Request]) -> None:
    for i, p in enumerate(stats.passes):
        short = [r.id for r in requests if len(p.outputs.get(r.id, ())) != r.max_tokens]
        if short:
            raise RuntimeError(f"{stats.name}, pass {i}: {len(short)} requests did not get exactly max_tokens, "
                               f"e.g. {short[:3]}")


def agreement(ours: Outputs, theirs: Outputs, requests: list[Request], n: int) -> tuple[int, float]:
    """(requests whose first n tokens all match, share of those first-n tokens that match)."""
    exact = same = total = 0
    for r in requests:
        a, b = ours[r.id][:n], theirs[r.id][:n]
        exact += a == b
        same += sum(x == y for x, y in zip(a, b))
        total += len(a)
    return exact, same / total if total else 0.0


def print_report(args: argparse.Namespace, requests: list[Request], runs: list[RunStats]) -> None:
    prompts = [r.prompt_len for r in requests]
    outs = [r.max_tokens for r in requests]
    print(f"\nworkload: {len(requests)} synthetic requests (lognormal lengths, seed {args.seed}), all arriving "
          f"at t=0; prompt mean {statistics.mean(prompts):.1f} max {max(prompts)}, "
          f"output mean {statistics.mean(outs):.1f} max {max(outs)} ({sum(outs)} tokens)")
    print(f"model: {args.model}, {DTYPE}, identical weights; max batch {args.max_batch}; "
          f"token budget/step {args.max_batched_tokens}; KV {args.num_kv_blocks} blocks x {args.block_size}; "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads), transformers {transformers.__version__}")
    print(f"timed passes per system: {args.repeats}, interleaved; 1-min load average at the end "
          f"{os.getloadavg()[0]:.2f} (this run counts for about {torch.get_num_threads()}; more means "
          "other processes shared the cores)\n")
    print(f"{'system':<24}{'steps':>7}{'best s':>9}{'median s':>10}{'tok/s best':>12}{'tok/s median':>14}  passes (s)")
    for s in runs:
        walls = " ".join(f"{p.wall_s:.2f}" for p in s.passes)
        steps = s.passes[0].steps if s.passes[0].steps is not None else "-"
        print(f"{s.name:<24}{steps:>7}{s.best_s:>9.2f}{s.median_s:>10.2f}{s.tokens / s.best_s:>12.1f}"
              f"{s.tokens / s.median_s:>14.1f}  {walls}")
    ours = runs[0]
    print()
    for other in runs[1:]:
        print(f"ours / {other.name:<22} {other.best_s / ours.best_s:5.2f}x (best)  "
              f"{other.median_s / ours.median_s:5.2f}x (median)")
    print()
    for other in runs[1:]:
        exact, share = agreement(ours.outputs, other.outputs, requests, args.match_tokens)
        print(f"greedy vs {other.name}: first {args.match_tokens} tokens identical for {exact}/{len(requests)} "
              f"requests; {share:.1%} of those tokens equal")
    print()
    for s in runs:
        print(f"{s.name}: {s.note}")


# -- profiling ------------------------------------------------------------------------------------
def op_times(prof: torch.profiler.profile) -> dict[str, float]:
    """Self CPU seconds per operator, over every thread the profiler saw."""
    return {e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages()}


def profiled(fn: Callable[[], Timed], all_threads: bool = False) -> tuple[dict[str, float], int]:
    """Run one pass under torch.profiler; HF's steps run on its manager's thread, hence all_threads."""
    extra = {"experimental_config": torch._C._profiler._ExperimentalConfig(profile_all_threads=True)} \
        if all_threads else {}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], **extra) as prof:
        timed = fn()
    return op_times(prof), timed.steps or 1


def print_profiles(profiles: dict[str, tuple[dict[str, float], int]], rows: int = 14) -> None:
    """Top operators by self CPU time, as milliseconds per forward step, side by side."""
    per_step = {n: {op: 1e3 * t / steps for op, t in ops.items()} for n, (ops, steps) in profiles.items()}
    top = sorted({op for table in per_step.values() for op in table},
                 key=lambda op: -max(table.get(op, 0.0) for table in per_step.values()))[:rows]
    print("\nprofile: one more pass of each under torch.profiler; self CPU ms per forward step "
          "(profiler overhead included)")
    print(f"{'operator':<52}" + "".join(f"{n:>24}" for n in per_step))
    print(f"{'(steps)':<52}" + "".join(f"{profiles[n][1]:>24d}" for n in per_step))
    for op in top:
        print(f"{op:<52}" + "".join(f"{per_step[n].get(op, 0.0):>24.2f}" for n in per_step))
    print(f"{'all operators':<52}" + "".join(f"{sum(per_step[n].values()):>24.2f}" for n in per_step))


# -- main ---------------------------------------------------------------------------------------
def hf_cb_isolated_pass(model: torch.nn.Module, args: argparse.Namespace, warm: list[Request],
                        requests: list[Request], tag: str, profile: bool = False):
    """Start a manager, warm it, time one pass, stop it: its idle loop thread must not run beside
    the other systems' passes (measured here: an idle manager slows our engine by ~15% on 2 cores)."""
    manager = hf_cb_manager(model, args)
    try:
        hf_cb_pass(manager, renamed(warm, f"warm-{tag}"))
        if profile:
            return profiled(lambda: hf_cb_pass(manager, renamed(requests, tag)), True)
        return hf_cb_pass(manager, renamed(requests, tag)), manager.continuous_batching_config
    finally:
        manager.stop(block=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    transformers.logging.set_verbosity_error()
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.CRITICAL)
    with torch.inference_mode():
        engine = Engine(engine_config(args))
        requests = make_workload(args, engine.config.model.vocab_size)
        warm = warmup_requests(requests)
        model = hf_model_from(engine)
        print("warming up: one untimed pass of each system over the whole workload ...", flush=True)
        ours_pass(engine, requests)  # every step shape once: oneDNN builds its kernels on first use
        _, cfg = hf_cb_isolated_pass(model, args, warm, requests, "warm")
        if not args.skip_static:
            static_pass(model, requests, args.max_batch)

        useful = sum(r.max_tokens for r in requests)
        runs = [RunStats("ours (continuous)", useful, "core_engine.Engine, mode=continuous, "
                         f"max_num_seqs={args.max_batch}, max_num_batched_tokens={args.max_batched_tokens}"),
                RunStats("HF continuous batching", useful,
                         f"init_continuous_batching, sdpa, page_size={cfg.page_size}, num_blocks="
                         f"{cfg.num_blocks}, max_batch_tokens={cfg.max_batch_tokens}, max_requests_per_batch="
                         f"{cfg.max_requests_per_batch}, fifo, no prefix sharing, per-request max_new_tokens, "
                         "eos_token_id=-1; its manager runs only during its own pass")]
        passes: list[Callable[[int], Timed]] = [
            lambda i: ours_pass(engine, requests),
            lambda i: hf_cb_isolated_pass(model, args, warm, requests, f"r{i}")[0],
        ]
        if not args.skip_static:
            runs.append(RunStats("HF static generate()", useful,
                                 f"generate() per batch of {args.max_batch}, left padding, one max_new_tokens "
                                 "per batch (its longest request), eos_token_id=None; useful tokens counted; "
                                 "steps = decode steps summed over batches"))
            passes.append(lambda i: static_pass(model, requests, args.max_batch))

        for i in range(args.repeats):
            for stats, run in zip(runs, passes):
                timed = run(i)
                timed.outputs = {k.removeprefix(f"r{i}-"): v for k, v in timed.outputs.items()}
                stats.passes.append(timed)
                print(f"  pass {i + 1}/{args.repeats} {stats.name}: {timed.wall_s:.2f} s, "
                      f"{stats.tokens / timed.wall_s:.1f} tok/s", flush=True)
        for stats in runs:
            check_lengths(stats, requests)
        print_report(args, requests, runs)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({r.name: {"tok_s_best": r.tokens / r.best_s, "tok_s_median": r.tokens / r.median_s,
                                    "note": r.note} for r in runs} | {"device": args.device, "model": args.model,
                                                                      "requests": args.num_requests}, f, indent=2)

        if args.profile:
            print_profiles({
                "ours": profiled(lambda: ours_pass(engine, requests)),
                "HF continuous": hf_cb_isolated_pass(model, args, warm, requests, "prof", profile=True),
            })


if __name__ == "__main__":
    main()
