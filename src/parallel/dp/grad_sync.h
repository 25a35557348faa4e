// What a training step asks of gradient synchronisation, whatever does it (data
// parallelism at any ZeRO stage, a store with expert groups): the pipeline executor and the
// training loop talk to it through this interface only, between the model's backward passes.
#pragma once

namespace meshtrain::parallel {

class GradSync {
 public:
  virtual ~GradSync() = default;
  // A step of `micro_batches` backward passes per unit begins: the gradients are zeroed.
  virtual void begin_step(int micro_batches) = 0;
  // After each backward pass (one micro-batch, or one pipeline chunk of one): the
  // reductions started so far may be waited for, bounding the buffers in flight.
  virtual void end_micro_batch() = 0;
  // After the step's last backward pass: every gradient reduced where the optimizer reads it.
  virtual void finish_reductions() = 0;
};

}  // namespace meshtrain::parallel
