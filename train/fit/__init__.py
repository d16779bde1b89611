"""`beam-train fit`: training on beam_prep records.

Modules, each importing only those on the lines below it:

  loop           fit(config): setup, the step loop, evaluation, NoC, export
  record_checks  the records checked before training (readable, of one run)
  model_setup    the model a run trains: built, frozen, its optimizer, restored
  step_hooks     what runs around the step: stop requests, progress, profiler, scalars
  train_step     the step, traced once and finalized, over the strategy's replicas
  data           the input path (Decoder, Parser, InputReader, `dataset`)
  step_inputs    the model inputs the step makes itself (clicks, previous mask)
  augment        the step's on-the-fly augmentation
  devices        threads, GPU memory, precision, the distribution strategy

It reads the serving side's model input (`train.export.serving_inputs`), so
that training and serving build it one way.
"""
