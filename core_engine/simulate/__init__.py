"""What-if mode: the real scheduler and block allocator on a simulated device.

No model runs: a SimulatedRunner stands in for the ModelRunner, returns synthetic tokens, and moves a
virtual clock by the roofline time of each step (calibrated by measured constants).
"""
