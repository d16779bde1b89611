"""`beam-train export` and `beam-train predict`: the serving graph and its files.

Modules, each importing only those on the lines below it:

  predict         beam-train predict: one image and its clicks, mask and overlay out
  portable_model  a TFLite or ONNX file called as the SavedModel is
  served          ServedModel: the one client of an exported SavedModel
  saved_model     the serving SavedModel: MODEL_DIR/export/<version>/, its checks
  portable        the click signatures as TFLite and ONNX files, checked against it
  servers         each task's serving tf.Module and its signatures
  serving_inputs  the model input from a request or from the records (twins)
  guided_filter   the served probabilities given the photograph's edges
  signatures      the signatures' names, inputs and outputs, declared once
"""
