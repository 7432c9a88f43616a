"""Where one logged step sits on the roofline: its own tokens priced by the engine's FLOP/byte model
(step_cost, the served model's dims from --model or the served model's directory), or, knowing only the
parameter count (--model-params), 2 FLOPs per weight per token over one read of the weights; over the
step's own elapsed time. Each decode row's context comes from the KV the step line reports in use
(usage x the pool's tokens, shared by the step's rows): measured, not guessed from request lengths."""

from __future__ import annotations

from dataclasses import dataclass

from batchtop.core_engine.attach.server_point import ModelEstimate
from batchtop.core_engine.attach.streams.iteration_log import LoggedStep
from batchtop.core_engine.model.cost import Chunk, element_size, step_cost
from batchtop.core_engine.perf.roofline_point import RooflinePoint, believable

SOURCE = "step log"


@dataclass(frozen=True, slots=True)
class StepPricer:
    estimate: ModelEstimate | None  # the model's dims
    params: float | None = None  # --model-params, where the dims are unknown
    dtype: str = "bfloat16"

    @property
    def known(self) -> bool:
        return self.estimate is not None or bool(self.params)

    def point(self, step: LoggedStep, pool_tokens: int | None) -> RooflinePoint | None:
        """None for a step with no time (SGLang's lines) or no tokens, or a model batchtop cannot price."""
        if not step.elapsed_s or step.elapsed_s <= 0 or step.tokens <= 0 or not self.known:
            return None
        if self.estimate is not None:
            flops, nbytes = self._dims_cost(step, pool_tokens)
        else:
            flops = 2.0 * self.params * step.tokens
            nbytes = self.params * element_size(self.dtype)
        if nbytes <= 0:
            return None
        point = RooflinePoint(flops / nbytes, flops / step.elapsed_s, SOURCE, decode=step.prefill_tokens == 0,
                              batch=step.rows)
        return point if believable(point) else None

    def _dims_cost(self, step: LoggedStep, pool_tokens: int | None) -> tuple[float, float]:
        held = (step.kv_usage or 0.0) * pool_tokens if pool_tokens else 0.0
        context = int(held / step.rows) if step.rows else 0
        chunks = [Chunk(context, 1)] * step.decode_rows
        if step.prefill_rows and step.prefill_tokens:
            each, extra = divmod(step.prefill_tokens, step.prefill_rows)
            chunks += [Chunk(0, each + (i < extra)) for i in range(step.prefill_rows) if each + (i < extra) > 0]
        cost = step_cost(self.estimate.model, self.estimate.dtype, chunks, step.rows)
        return cost.flops, cost.bytes
