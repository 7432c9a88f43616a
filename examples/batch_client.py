"""Sends its requests in batches of 16 and waits for each whole batch before sending the next.

    python examples/batch_client.py [--url http://127.0.0.1:8000] [--requests 96] [--concurrency 16]

This is how much client code is written (a list, asyncio.gather, the next list), and it is static
batching by accident: each batch is as slow as its longest answer, so the engine's slots empty one by
one and stay empty until the last answer of the batch is done. Run it against `batchtop serve` and
press `v`: the slot timeline shows the staircase. Compare examples/in_flight_client.py.
"""

from __future__ import annotations

import asyncio
import time

from client_workload import complete, connect, make_requests, parse_args, report  # examples/ is on sys.path


async def main() -> None:
    args = parse_args(__doc__)
    client, model = await connect(args)
    requests = make_requests(args.requests, args.output_mean, args.seed)
    started = time.perf_counter()
    tokens: list[int] = []
    for i in range(0, len(requests), args.concurrency):
        batch = requests[i:i + args.concurrency]
        tokens += await asyncio.gather(*(complete(client, model, prompt, n) for prompt, n in batch))
    report(f"batches of {args.concurrency}", tokens, started)


if __name__ == "__main__":
    asyncio.run(main())
