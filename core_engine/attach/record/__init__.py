"""What an attach watch leaves behind: the recording of every scrape (and its checks, for a replay),
and the workload drawn from the traffic it saw."""
