"""Keeps 16 requests in flight: each time one answer comes back, the next request goes out.

    python examples/in_flight_client.py [--url http://127.0.0.1:8000] [--requests 96] [--concurrency 16]

The same requests as examples/batch_client.py, sent so that the engine's continuous batching can do
its job: a slot freed by a short answer is refilled at the next step, so all of them stay busy. Run it
against `batchtop serve` and press `v`: the slot timeline shows full bands.
"""

from __future__ import annotations

import asyncio
import time

from client_workload import complete, connect, make_requests, parse_args, report  # examples/ is on sys.path


async def main() -> None:
    args = parse_args(__doc__)
    client, model = await connect(args)
    queue = list(reversed(make_requests(args.requests, args.output_mean, args.seed)))
    tokens: list[int] = []

    async def worker() -> None:
        while queue:
            prompt, n = queue.pop()
            tokens.append(await complete(client, model, prompt, n))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    report(f"{args.concurrency} in flight", tokens, started)


if __name__ == "__main__":
    asyncio.run(main())
