"""`beam-train serve`: the exported model behind TensorFlow Serving's REST API
and a page where a person segments by clicking.

Modules, each importing only those on the lines below it:

  app          the Flask app, its routes and errors; start
  config       ServeConfig: the command's options (no web framework imported)
  page         the page's endpoints: images by id, masks as PNG, IoU, next click
  model        RestModel: one loaded export, its status, metadata, predict
  rest         TF Serving's JSON predict format <-> tensors
  json_arrays  JSON whose large integer arrays are parsed by numpy

static/ holds the page (plain HTML, JavaScript and CSS, no build step).
"""
