"""The field's NoC protocol (RITM's evaluation), its numbers declared once:
the simulated user (`train.evaluate.clicker`), the evaluation (`train.evaluate.noc`,
`train.evaluate.source_eval`), the served mask (`train.export.servers`), the page and the
benchmarks read them here.

This module imports nothing.
"""

# A pixel is object where the model's probability exceeds this (the NoC
# protocol, the served mask and `beam-train evaluate --pred-thr`).
PRED_THR = 0.49
# Clicks per object at most (an object that never reaches a threshold counts
# this many), and the IoU thresholds of NoC@85 and NoC@90.
NOC_MAX_CLICKS = 20
NOC_IOU_THRESHOLDS = (0.85, 0.90)
