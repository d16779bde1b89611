"""`beam-train evaluate`: NoC, the field's number of clicks.

Modules, each importing only those on the lines below it:

  command      beam-train evaluate: at source resolution or on the records
  simulate     a simulated annotator clicking a running server's page
  source_eval  NoC on the eval images at their own size, through the export
  noc          NoC on the eval records with the Keras model; the report
  clicker      the simulated user's clicks, the nearest-click baseline, IoU
  protocol     the protocol's numbers (RITM's evaluation), declared once

`clicker` and `protocol` are also what the served model and the page click
with (`train.export.servers`, `train.serve.page`).
"""
