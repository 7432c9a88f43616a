"""Paged attention backends, in one place: one class per implementation (torch_reference, triton_cuda,
cpu_kernels), each with decode, one prefill call per step and the per-step tables it reads; the
runner picks one per engine (selection.select_backend) and the model's Attention calls it."""

from batchtop.gpu_kernels.attention.base import AttentionBackend
from batchtop.gpu_kernels.attention.prefill_plan import PrefillPlan, plan_prefill
from batchtop.gpu_kernels.attention.selection import BACKENDS, select_backend

__all__ = ["BACKENDS", "AttentionBackend", "PrefillPlan", "plan_prefill", "select_backend"]
