"""Sessions around the engine: workloads, scripted demos, recorded traces and the no-screen driver."""
