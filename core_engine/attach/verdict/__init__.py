"""What bounds the batch of a live server, from the monitor's recent ticks: the verdict, how it holds
over time, the arrival pattern behind CLIENT, and the queue's side of it (the Waiting panel's words)."""
