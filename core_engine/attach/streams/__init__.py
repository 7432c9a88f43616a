"""What a server streams beyond /metrics (KV-cache events, per-step log lines), read without a scrape."""
